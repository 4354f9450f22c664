"""How long a WebRTC session takes to connect: direct (host candidates) and through a TURN relay.

What ``VOICEHOST_WEBRTC_CONNECT_TIMEOUT_SECONDS`` has to allow for: from the offer's POST to the
data channel's open (ICE, DTLS, SCTP), and on to the server's ``ready`` event. A client built on
aiortc (as a browser does it: one offer, its candidates gathered first) connects ``--sessions``
times directly to a dev server, then as many times with ``iceTransportPolicy: relay`` through a
local coturn (``turnserver``: ``apt-get install coturn``), so that every packet goes through the
relay. The relay here is on this machine: a real one adds its network's round trips (a few per
connect: ICE's checks, DTLS's two flights, SCTP's handshake). Prints p50/p90/max per path and
one JSON object as the last line.

    python scripts/bench_webrtc_connect.py [--sessions 20] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCSessionDescription,
)

from voicehost.tools.bench.levels import percentile
from voicehost.tools.devserver import free_port, served

TURN_USER, TURN_PASSWORD = "bench", "bench-secret"


def local_address() -> str:
    """This machine's address that is not loopback (the relay's, and what it relays to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.254", 9))  # no packet is sent: the route picks the address
        return probe.getsockname()[0]


def start_turn(address: str, folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [
        "turnserver",
        "-n",  # no configuration file
        f"--listening-ip={address}",
        f"--listening-port={port}",
        f"--relay-ip={address}",
        "--min-port=49160",
        "--max-port=49260",
        "--lt-cred-mech",
        f"--user={TURN_USER}:{TURN_PASSWORD}",
        "--realm=voicehost.bench",
        "--no-tls",
        "--no-dtls",
        "--no-cli",
        "--allow-loopback-peers",
        f"--log-file={folder / 'turn.log'}",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    if process.poll() is not None:
        raise RuntimeError(f"turnserver exited: {(folder / 'turn.log').read_text()[-2000:]}")
    return process, port


async def connect_once(
    session: aiohttp.ClientSession, url: str, configuration: RTCConfiguration | None
) -> dict[str, float]:
    pc = RTCPeerConnection(configuration)
    channel = pc.createDataChannel("voicehost")
    pc.addTransceiver("audio", direction="recvonly")
    opened, ready = asyncio.Event(), asyncio.Event()
    channel.on("open", opened.set)

    @channel.on("message")
    def on_message(message: object) -> None:
        if isinstance(message, str) and json.loads(message).get("type") == "ready":
            ready.set()

    location = None
    try:
        await pc.setLocalDescription(await pc.createOffer())  # gathers its candidates
        started = time.monotonic()
        headers = {"Content-Type": "application/sdp"}
        async with session.post(
            url + "/v1/audio/speech/webrtc", data=pc.localDescription.sdp, headers=headers
        ) as response:
            if response.status != 201:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            answer = await response.text()
            location = response.headers["Location"]
        answered = time.monotonic()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        async with asyncio.timeout(30):
            await opened.wait()
        open_at = time.monotonic()
        channel.send(json.dumps({"type": "config", "voice": "tara"}))
        async with asyncio.timeout(30):
            await ready.wait()
        done = time.monotonic()
        return {
            "answer_ms": (answered - started) * 1000,
            "open_ms": (open_at - started) * 1000,
            "ready_ms": (done - started) * 1000,
        }
    finally:
        if location is not None:
            async with session.delete(url + location):
                pass
        await pc.close()


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    result: dict[str, float] = {"sessions": len(rows)}
    for key in ("answer_ms", "open_ms", "ready_ms"):
        values = [r[key] for r in rows]
        result[f"{key}_p50"] = round(statistics.median(values), 1)
        result[f"{key}_p90"] = round(percentile(values, 90), 1)
        result[f"{key}_max"] = round(max(values), 1)
    return result


async def run(url: str, sessions: int, turn: str | None) -> dict[str, object]:
    paths: dict[str, RTCConfiguration | None] = {"direct": None}
    if turn is not None:
        server = RTCIceServer(urls=turn, username=TURN_USER, credential=TURN_PASSWORD)
        paths["relay"] = RTCConfiguration(
            iceServers=[server], iceTransportPolicy=RTCIceTransportPolicy.RELAY
        )
    results: dict[str, object] = {}
    async with aiohttp.ClientSession() as session:
        await connect_once(session, url, None)  # warm: the first session loads the codecs
        for name, configuration in paths.items():
            rows = [await connect_once(session, url, configuration) for _ in range(sessions)]
            results[name] = summary(rows)
            print(json.dumps({name: results[name]}), flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--url", help="a running server (else a dev server of its own)")
    args = parser.parse_args()
    address = local_address()
    # the relay's candidates are at this machine's own (private) address: allowed here
    os.environ.setdefault("VOICEHOST_WEBRTC_PRIVATE_CANDIDATES", "true")
    with tempfile.TemporaryDirectory() as tmp:
        turn_process = None
        turn = None
        if shutil.which("turnserver"):
            turn_process, port = start_turn(address, Path(tmp))
            turn = f"turn:{address}:{port}?transport=udp"
        else:
            print("no turnserver (apt-get install coturn): direct only", file=sys.stderr)
        try:
            with served(args.url) as (url, _):
                results = asyncio.run(run(url, args.sessions, turn))
        finally:
            if turn_process is not None:
                turn_process.terminate()
                turn_process.wait(10)
    print(json.dumps({"address": address, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
