"""Admission from measured capacity against the static capacity alone, at twice the load the
engine sustains: does every admitted stream keep real time?

The dev engine on CPU is far from Orpheus' 82 tokens/s per stream at any useful batch, so this
benchmark declares a slower rate real time (``--rate``, 45 tokens/s by default: the rate the
dev streams keep about three at once here) and plays every stream at it: a listener's clock
starts at a stream's first chunk and runs at ``rate / 82.03`` x the audio's own pace; a chunk
that arrives after all before it has played is an underrun.

First it measures how many streams the engine sustains at ``rate`` (the largest batch whose
measured per-request rate stays at least ``rate``), then offers twice as many: that many clients,
each asking for one stream after another (a refused one waits its ``Retry-After`` and asks
again), for ``--seconds``, once against a server that admits by measured capacity (``rate``,
margin 1.2) and once against one that admits up to its static capacity (64).

    python scripts/bench_measured_admission.py [--rate 45] [--seconds 60]

The last line of output is one JSON object: per mode, the streams admitted and refused, the share
of admitted streams with no underrun, underruns per admitted stream, and tokens/s per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from voicehost.metrics import series
from voicehost.model import orpheus
from voicehost.tools.bench.levels import percentile
from voicehost.tools.devserver import dev_server

SPEECH = "/v1/audio/speech"
# Segments of one sentence each, spoken one at a time: a stream is one engine request at a time.
TEXT = " ".join(f"Sentence number {n} of this stream says a few words more." for n in range(4))
ENV = {
    "VOICEHOST_SEGMENT_PREFETCH": "1",
    "VOICEHOST_SEGMENT_MAX_CHARS": "120",
    "VOICEHOST_TOP_P": "1.0",
    "VOICEHOST_CODEC_NOISE": "false",
}
BYTES_PER_SAMPLE = 2  # pcm: 16-bit


async def rates(http: aiohttp.ClientSession, url: str) -> dict[int, float]:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    measured = series(text, "voicehost_request_tokens_per_second", "batch")
    return {int(batch): rate for batch, rate in measured.items()}


async def stream(http: aiohttp.ClientSession, url: str, rate: float, seed: int) -> dict | None:
    """One stream, played at ``rate`` tokens/s; ``None`` when refused (after its Retry-After)."""
    body = {"input": TEXT, "voice": "dev-a", "response_format": "pcm", "seed": seed}
    speed = rate / orpheus.AUDIO_TOKENS_PER_SECOND  # wall seconds of playback per audio second
    started = time.monotonic()
    async with http.post(url + SPEECH, json=body) as response:
        if response.status == 503:
            await response.read()
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            return None
        assert response.status == 200, await response.text()
        clock: float | None = None
        played = 0.0  # seconds of playback since ``clock``
        underruns = samples = 0
        async for chunk in response.content.iter_any():
            now = time.monotonic()
            if clock is not None and now > clock + played:
                underruns += 1
                clock = None
            if clock is None:
                clock, played = now, 0.0
            played += len(chunk) / BYTES_PER_SAMPLE / orpheus.SAMPLE_RATE / speed
            samples += len(chunk) // BYTES_PER_SAMPLE
    elapsed = time.monotonic() - started
    tokens = samples / orpheus.SAMPLES_PER_FRAME * orpheus.TOKENS_PER_FRAME
    return {"underruns": underruns, "tokens_per_second": tokens / elapsed}


async def offered(url: str, clients: int, rate: float, seconds: float) -> dict[str, object]:
    admitted: list[dict] = []
    refused = 0
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        nonlocal refused
        seed = index * 1000
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            while time.monotonic() < deadline:
                seed += 1
                result = await stream(http, url, rate, seed)
                if result is None:
                    refused += 1
                else:
                    admitted.append(result)

    await asyncio.gather(*(client(i) for i in range(clients)))
    clean = [s for s in admitted if not s["underruns"]]
    speeds = [s["tokens_per_second"] for s in admitted]
    return {
        "admitted": len(admitted),
        "refused": refused,
        "share_without_underrun": round(len(clean) / len(admitted), 3) if admitted else None,
        "underruns_per_stream": round(sum(s["underruns"] for s in admitted) / len(admitted), 2)
        if admitted
        else None,
        "tokens_per_second_p50": round(percentile(speeds, 50), 1) if speeds else None,
        "tokens_per_second_p10": round(percentile(speeds, 10), 1) if speeds else None,
    }


async def sustained(url: str, rate: float, most: int = 12) -> int:
    """The largest batch whose measured per-request rate stays at least ``rate``."""
    async with aiohttp.ClientSession() as http:
        for batch in range(1, most + 1):
            results = await asyncio.gather(
                *(stream(http, url, rate, seed) for seed in range(batch))
            )
            assert all(results), "refused while measuring"
            measured = await rates(http, url)
            print(f"batch {batch}: {measured.get(batch, 0):.1f} tokens/s per request", flush=True)
            if measured.get(batch, 0) < rate:
                return max(1, batch - 1)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=45.0, help="tokens/s taken as real time")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--margin", type=float, default=1.2)
    args = parser.parse_args()
    report: dict[str, object] = {"rate": args.rate, "margin": args.margin}
    with tempfile.TemporaryDirectory() as tmp:
        static = {**ENV, "VOICEHOST_REALTIME_TOKENS_PER_SECOND": "0"}
        with dev_server(Path(tmp) / "static", **static) as server:
            sustain = asyncio.run(sustained(server.url, args.rate))
            report["sustained_streams"] = sustain
            report["clients"] = clients = 2 * sustain
            print(f"sustains {sustain} streams; offering {clients}", flush=True)
            report["static_capacity_only"] = asyncio.run(
                offered(server.url, clients, args.rate, args.seconds)
            )
            print(json.dumps(report["static_capacity_only"]), flush=True)
        measured_env = {
            **ENV,
            "VOICEHOST_REALTIME_TOKENS_PER_SECOND": str(args.rate),
            "VOICEHOST_REALTIME_MARGIN": str(args.margin),
        }
        with dev_server(Path(tmp) / "measured", **measured_env) as server:
            report["measured_capacity"] = asyncio.run(
                offered(server.url, clients, args.rate, args.seconds)
            )
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    sys.exit(main())
