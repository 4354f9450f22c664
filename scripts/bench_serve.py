"""Benchmark a running voicehost server: time to first audio byte and real-time factor.

Per concurrency level, starts streams at once against ``POST /v1/audio/speech`` (raw PCM),
prints a table and, as the last line, one JSON object with every result. Exits 1 if any
stream failed.

    python scripts/bench_serve.py --url http://127.0.0.1:8080 --concurrency 1,4,16
    python scripts/bench_serve.py --start-server --concurrency 1,2 --json /tmp/bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from voicehost.orpheus import AUDIO_TOKENS_PER_SECOND, SAMPLE_RATE

BYTES_PER_SECOND = SAMPLE_RATE * 2  # mono s16le
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the sun slowly sets."


@dataclass
class Stream:
    voice: str
    ttfb_ms: float | None = None
    total_s: float = 0.0
    audio_s: float = 0.0
    rtf: float | None = None  # total seconds / audio seconds; < 1 is faster than real time
    underruns: int = 0  # chunks that arrived after the audio before them had finished playing
    error: str | None = None
    chunks: int = 0


@dataclass
class Level:
    concurrency: int
    n: int
    wall_s: float
    ttfb_p50_ms: float | None
    ttfb_p95_ms: float | None
    rtf_p50: float | None
    rtf_max: float | None
    no_underrun_streams: int
    audio_tokens_per_s: float
    errors: int
    error_messages: list[str] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (like numpy's default), rounded; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (pos - low), 4)


async def run_stream(
    session: aiohttp.ClientSession, url: str, text: str, voice: str, seed: int
) -> Stream:
    result = Stream(voice)
    body = {"input": text, "voice": voice, "response_format": "pcm", "seed": seed}
    started = time.monotonic()
    playing_until: float | None = None  # when a player started at the first byte runs dry
    received = 0
    try:
        async with session.post(f"{url}/v1/audio/speech", json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:300]}"
            else:
                async for chunk in response.content.iter_any():
                    now = time.monotonic()
                    if playing_until is None:
                        result.ttfb_ms = round((now - started) * 1000, 1)
                    elif now > playing_until:  # the player ran dry; it resumes with this chunk
                        result.underruns += 1
                    start = now if playing_until is None else max(now, playing_until)
                    playing_until = start + len(chunk) / BYTES_PER_SECOND
                    received += len(chunk)
                    result.chunks += 1
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    total = time.monotonic() - started
    result.total_s, result.audio_s = round(total, 3), round(received / BYTES_PER_SECOND, 3)
    if result.error is None and received == 0:
        result.error = "no audio received"
    if result.error is None:
        result.rtf = round(total / (received / BYTES_PER_SECOND), 4)
    return result


async def run_level(
    session: aiohttp.ClientSession, args: argparse.Namespace, concurrency: int, voices: list[str]
) -> Level:
    n = max(concurrency, args.rounds)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Stream:
        async with gate:
            return await run_stream(session, args.url, args.text, voices[i % len(voices)], i)

    started = time.monotonic()
    streams = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - started
    ok = [s for s in streams if s.error is None]
    ttfbs = [s.ttfb_ms for s in ok if s.ttfb_ms is not None]
    rtfs = [s.rtf for s in ok if s.rtf is not None]
    return Level(
        concurrency=concurrency,
        n=n,
        wall_s=round(wall, 3),
        ttfb_p50_ms=percentile(ttfbs, 50),
        ttfb_p95_ms=percentile(ttfbs, 95),
        rtf_p50=percentile(rtfs, 50),
        rtf_max=percentile(rtfs, 100),
        no_underrun_streams=sum(1 for s in ok if s.underruns == 0),
        audio_tokens_per_s=round(sum(s.audio_s for s in ok) * AUDIO_TOKENS_PER_SECOND / wall, 2),
        errors=len(streams) - len(ok),
        error_messages=[f"{s.voice}: {s.error}" for s in streams if s.error],
        streams=list(streams),
    )


async def bench(args: argparse.Namespace, levels: list[int], voices: list[str]) -> list[Level]:
    connector = aiohttp.TCPConnector(limit=max(levels) + 4)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(f"{args.url}/v1/audio/voices") as response:
            listed = {v["id"] for v in (await response.json())["voices"] if "error" not in v}
        missing = [v for v in voices if v not in listed]
        if missing:
            print(f"warning: voices not served: {missing} (served: {sorted(listed)})")
        warm = await run_stream(session, args.url, args.text, voices[0], 0)
        print(
            f"warm-up: ttfb {warm.ttfb_ms or 0:.0f} ms, {warm.audio_s:.2f} s audio in "
            f"{warm.total_s:.2f} s" + (f", error {warm.error}" if warm.error else "")
        )
        return [await run_level(session, args, c, voices) for c in levels]


def print_table(levels: list[Level]) -> None:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(
        f"{'conc':>5} {'n':>4} {'ttfb p50':>9} {'ttfb p95':>9} {'rtf p50':>8} {'rtf max':>8} "
        f"{'no-underrun':>12} {'tok/s':>8} {'errors':>6}"
    )
    for lv in levels:
        print(
            f"{lv.concurrency:>5} {lv.n:>4} {fmt(lv.ttfb_p50_ms, '.0f'):>9} "
            f"{fmt(lv.ttfb_p95_ms, '.0f'):>9} {fmt(lv.rtf_p50, '.2f'):>8} "
            f"{fmt(lv.rtf_max, '.2f'):>8} {f'{lv.no_underrun_streams}/{lv.n}':>12} "
            f"{lv.audio_tokens_per_s:>8.1f} {lv.errors:>6}"
        )
        for message in lv.error_messages[:5]:
            print(f"      error: {message}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``voicehost serve --dev`` on a free port; returns the process and its URL."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    command = [sys.executable, "-m", "voicehost", "serve", "--dev", "--port", str(port)]
    with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, f"http://127.0.0.1:{port}"


def http_status(url: str) -> int | None:
    """The status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 300) -> None:
    """Poll /readyz until 200; fail fast if the server exits or /healthz says start-up failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log in {log}")
        if http_status(f"{url}/readyz") == 200:
            return
        if http_status(f"{url}/healthz") == 503:
            raise RuntimeError(f"server start-up failed; log in {log}")
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout:.0f} s; log in {log}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the server's process group, then SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--concurrency", default="1,4,16", help="comma list of stream counts")
    parser.add_argument("--voices", default="dev-a,dev-b,dev-c,tara", help="comma list")
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument(
        "--rounds", type=int, default=1, help="streams per level: max(c, rounds), c at a time"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--start-server", action="store_true", help="start a dev server")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    voices = [v.strip() for v in args.voices.split(",") if v.strip()]
    proc = None
    try:
        if args.start_server:
            log = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "server.log"
            print(f"starting a dev server (log {log}) ...", flush=True)
            proc, args.url = start_server(log)
            wait_ready(proc, args.url, log)
            print(f"server ready at {args.url}", flush=True)
        args.url = args.url.rstrip("/")
        results = asyncio.run(bench(args, levels, voices))
    finally:
        if proc is not None:
            stop_server(proc)
    print_table(results)
    report = {"levels": [asdict(lv) for lv in results], "url": args.url, "text": args.text}
    line = json.dumps(report)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 1 if any(lv.errors for lv in results) else 0


if __name__ == "__main__":
    sys.exit(main())
