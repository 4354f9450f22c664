"""Realtime input streaming: when does speech start, and what does continuity cost?

Against a running server (``--url``) or its own ``voicehost serve --dev`` (``--start-server``),
in one run, rounds interleaved so the machine's noise hits every variant alike:

1. **WebSocket, text as an LLM streams it**: the words of a paragraph sent one by one at
   ``--words-per-second``; time from the first piece sent to the first audio byte.
2. **HTTP, the same text whole**: time to the first byte of ``POST /v1/audio/speech``. An agent
   that waits for the whole text before calling it also waits for the LLM to finish: that sum is
   reported too.
3. **Continuity**: the same multi-sentence text over the WebSocket (all sent at once), with
   ``continuity`` on and off: time from each later segment's ``segment.started`` to its first
   audio (prefill of the longer prompt), and the prompt tokens the context adds (estimated from
   the previous segment's frames: 7 per frame carried, plus its words and 9 special tokens).

With ``--transports``, instead: **the socket against WebRTC**, side by side, at 1 and
``--sessions`` sessions at once (rounds interleaved): per session, time from the text sent to the
first audio the client has (the socket's first binary message; WebRTC's first frame decoded from
the track, through this process's aiortc), and the serving process's CPU per second of audio
delivered (its own CPU time, user and system, over the round; Opus packetising, SRTP and the data
channel included; the engine core's, a child process, not), with the machine's load average.

The last line of output is one JSON object with every figure.

    python scripts/bench_realtime.py --start-server [--rounds 5] [--words-per-second 15]
    python scripts/bench_realtime.py --start-server --transports [--rounds 3] [--sessions 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from typing import Any

import aiohttp
import psutil

from voicehost.client import AsyncClient
from voicehost.model import orpheus
from voicehost.tools.bench.levels import percentile
from voicehost.tools.devserver import served

WORDS = (
    "we walked along the river and talked about the weather while the evening light "
    "turned the water gold and a few boats drifted slowly past the old stone bridge"
).split()


def paragraph(sentences: int, seed: int) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        words[rng.randint(3, len(words) - 3)] += ","
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


async def ws_first_audio(
    session: aiohttp.ClientSession, url: str, text: str, words_per_second: float, voice: str
) -> float:
    """Seconds from the first word sent to the first audio byte, words sent at the given rate."""
    async with session.ws_connect(url.replace("http", "ws", 1) + "/v1/audio/speech/ws") as ws:
        await ws.send_json({"type": "config", "voice": voice, "response_format": "pcm"})
        assert json.loads((await ws.receive()).data)["type"] == "ready"
        first: list[float] = []

        async def send() -> None:
            for i, word in enumerate(text.split(" ")):
                if not first:
                    await ws.send_json({"type": "text", "text": word if i == 0 else " " + word})
                await asyncio.sleep(1 / words_per_second)
            await ws.send_json({"type": "end"})

        started = time.monotonic()
        sender = asyncio.create_task(send())
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY and not first:
                first.append(time.monotonic() - started)
                sender.cancel()
                break
        await asyncio.gather(sender, return_exceptions=True)
        return first[0]


async def http_first_byte(session: aiohttp.ClientSession, url: str, text: str, voice: str) -> float:
    started = time.monotonic()
    body = {"input": text, "voice": voice, "response_format": "pcm"}
    async with session.post(url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        await response.content.readany()
        return time.monotonic() - started


async def segment_first_audio(
    session: aiohttp.ClientSession, url: str, text: str, voice: str, continuity: bool, seed: int
) -> tuple[list[float], list[int]]:
    """Per later segment: seconds from ``segment.started`` to its first audio, and the prompt
    tokens its context adds (estimated)."""
    async with session.ws_connect(url.replace("http", "ws", 1) + "/v1/audio/speech/ws") as ws:
        config = {"type": "config", "voice": voice, "response_format": "pcm"}
        await ws.send_json({**config, "continuity": continuity, "seed": seed})
        await ws.send_json({"type": "text", "text": text})
        await ws.send_json({"type": "end"})
        waits: list[float] = []
        added: list[int] = []
        segment_started: float | None = None
        previous: dict[str, Any] | None = None
        index = -1
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                if segment_started is not None and index > 0:
                    waits.append(time.monotonic() - segment_started)
                segment_started = None
                continue
            event = json.loads(message.data)
            if event["type"] == "segment.started":
                segment_started, index = time.monotonic(), event["segment"]
                if index > 0 and continuity and previous is not None:
                    frames = round(previous["audio_seconds"] / orpheus.FRAME_SECONDS)
                    carried = min(frames, 48)
                    words = len(previous["text"].split()) * carried // max(frames, 1)
                    added.append(7 * carried + round(1.3 * words) + 9)
                previous = {"text": event["text"]}
            elif event["type"] == "segment.done" and previous is not None:
                previous["audio_seconds"] = event["audio_seconds"]
            elif event["type"] in ("done", "error"):
                break
        return waits, added


def ms(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": None if not values else round(1e3 * statistics.median(values), 1),
        "p95": None if not values else round(1e3 * (percentile(values, 95) or 0), 1),
        "mean": None if not values else round(1e3 * statistics.fmean(values), 1),
        "n": len(values),
    }


async def bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=600)
    ws_s: list[float] = []
    http_s: list[float] = []
    waits = {True: [], False: []}
    added: list[int] = []
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for round_ in range(args.rounds):
            text = paragraph(3, seed=round_)
            ws_s.append(await ws_first_audio(session, url, text, args.words_per_second, args.voice))
            http_s.append(await http_first_byte(session, url, text, args.voice))
            long_text = paragraph(args.segments, seed=100 + round_)
            for continuity in (True, False):
                w, a = await segment_first_audio(
                    session, url, long_text, args.voice, continuity, seed=round_
                )
                waits[continuity] += w
                added += a
            print(
                f"round {round_ + 1}/{args.rounds}: ws {1e3 * ws_s[-1]:.0f} ms, "
                f"http {1e3 * http_s[-1]:.0f} ms",
                file=sys.stderr,
            )
    words = len(paragraph(3, seed=0).split())
    llm_s = words / args.words_per_second
    return {
        "words_per_second": args.words_per_second,
        "ws_first_audio_ms": ms(ws_s),
        "http_whole_text_first_byte_ms": ms(http_s),
        "http_after_llm_finishes_ms": ms([s + llm_s for s in http_s]),
        "segment_first_audio_ms": {
            "continuity": ms(waits[True]),
            "no_continuity": ms(waits[False]),
        },
        "context_tokens_added_mean": round(statistics.fmean(added), 1) if added else None,
    }


TRANSPORTS = ("websocket", "webrtc")


async def transport_session(
    client: AsyncClient, transport: str, voice: str, text: str
) -> tuple[float, float]:
    """One session: seconds from its text sent to its first audio at the client, and the
    seconds of audio it delivered."""
    if transport == "websocket":
        session = client.realtime(voice, response_format="pcm")
    else:
        session = client.webrtc(voice)
    async with session:
        rate = session.ready["sample_rate"]
        sent = time.monotonic()
        await session.send_text(text)
        await session.end()
        first: float | None = None
        samples = 0
        async for item in session:
            if isinstance(item, bytes):
                first = first if first is not None else time.monotonic() - sent
            elif item["type"] == "segment.done":
                samples += item["samples"]
            elif item["type"] == "error":
                raise RuntimeError(f"{transport}: {item}")
    assert first is not None, f"{transport}: no audio"
    return first, samples / rate


async def transport_round(
    url: str, server: psutil.Process | None, transport: str, sessions: int, voice: str, seed: int
) -> dict[str, Any]:
    """``sessions`` sessions at once over ``transport``: their first audio, and the serving
    process's CPU seconds per audio second delivered."""
    async with AsyncClient(url) as client:
        before = server.cpu_times() if server is not None else None
        results = await asyncio.gather(
            *(
                transport_session(client, transport, voice, paragraph(1, seed + n))
                for n in range(sessions)
            )
        )
        after = server.cpu_times() if server is not None else None
    audio = sum(seconds for _, seconds in results)
    cpu = None
    if before is not None and after is not None:
        cpu = (after.user - before.user) + (after.system - before.system)
    return {
        "first_audio_s": [first for first, _ in results],
        "audio_s": audio,
        "cpu_s": cpu,
    }


async def bench_transports(
    args: argparse.Namespace, url: str, server: psutil.Process | None
) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {}
    for round_ in range(args.rounds):
        for sessions in (1, args.sessions):
            for transport in TRANSPORTS if round_ % 2 == 0 else TRANSPORTS[::-1]:
                key = f"{transport} x{sessions}"
                one = await transport_round(url, server, transport, sessions, args.voice, round_)
                entry = figures.setdefault(key, {"first": [], "audio_s": 0.0, "cpu_s": 0.0})
                entry["first"] += one["first_audio_s"]
                entry["audio_s"] += one["audio_s"]
                entry["cpu_s"] = None if one["cpu_s"] is None else entry["cpu_s"] + one["cpu_s"]
                print(
                    f"round {round_ + 1}/{args.rounds} {key}: first audio "
                    f"{1e3 * statistics.median(one['first_audio_s']):.0f} ms (median), "
                    f"{one['audio_s']:.1f} s of audio, load {psutil.getloadavg()[0]:.2f}",
                    file=sys.stderr,
                )
    return {
        key: {
            "first_audio_ms": ms(entry["first"]),
            "audio_s": round(entry["audio_s"], 1),
            "serving_cpu_ms_per_audio_s": None
            if entry["cpu_s"] is None
            else round(1e3 * entry["cpu_s"] / entry["audio_s"], 1),
        }
        for key, entry in figures.items()
    } | {"load_average_1m": round(psutil.getloadavg()[0], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one with --start-server)")
    parser.add_argument("--start-server", action="store_true")
    parser.add_argument("--voice", default="dev-a")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--segments", type=int, default=4, help="sentences of the long text")
    parser.add_argument("--words-per-second", type=float, default=15.0)
    parser.add_argument(
        "--transports", action="store_true", help="the socket against WebRTC (see above)"
    )
    parser.add_argument("--sessions", type=int, default=16, help="with --transports: at once")
    parser.add_argument("--server-pid", type=int, help="with --url: the serving process, for CPU")
    args = parser.parse_args()
    if not args.url and not args.start_server:
        parser.error("give --url or --start-server")
    with served(None if args.start_server else args.url) as (url, process):
        if args.transports:
            pid = process.pid if process is not None else args.server_pid
            server = psutil.Process(pid) if pid is not None else None
            result = asyncio.run(bench_transports(args, url, server))
        else:
            result = asyncio.run(bench(args, url))
    for key, value in result.items():
        print(f"{key}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
