"""The load driver: for each concurrency level, ``c`` streams start at once (per round) over one
reused ``aiohttp`` session, and every body chunk is timestamped as it arrives."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voicehost.tools.bench.levels import LevelSummary, summarize
from voicehost.tools.bench.playback import Analysis, StreamResult, Trace, analyse

if TYPE_CHECKING:  # imported where used, so that `voicehost --help` stays quick
    import aiohttp

SPEECH_PATH = "/v1/audio/speech"
VOICES_PATH = "/v1/audio/voices"
HEALTH_PATH = "/healthz"
FIRST_AUDIO_METRIC = "voicehost_time_to_first_audio_seconds"


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run."""

    url: str
    levels: list[int]
    voices: list[str] | None  # None: every usable voice the server lists
    text: str
    rounds: int = 1
    seed: int | None = 0  # stream i of a level asks for seed + i
    warmup: int = 1
    read_timeout_s: float = 600.0
    analysis: Analysis = field(default_factory=Analysis)


@dataclass(slots=True)
class BenchResult:
    """Everything a run measured."""

    url: str
    voices: list[str]
    warmup: list[StreamResult]
    levels: list[LevelSummary]
    streams: dict[int, list[StreamResult]]


def request_body(plan: Plan, voice: str, index: int) -> dict[str, Any]:
    """The JSON body of stream ``index``."""
    body: dict[str, Any] = {"input": plan.text, "voice": voice, "response_format": "pcm"}
    if plan.seed is not None:
        body["seed"] = plan.seed + index
    return body


def wire_tracing() -> aiohttp.TraceConfig:
    """Marks each request's ``Trace`` when its last byte has been written: a burst of requests
    leaves this one client process one at a time, and the time a request waits for its turn
    there is the client's, not the server's."""
    import aiohttp

    async def sent(_: object, context: Any, __: object) -> None:
        if isinstance(trace := context.trace_request_ctx, Trace):
            trace.on_wire_at = time.perf_counter()

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(sent)
    config.on_request_chunk_sent.append(sent)
    return config


async def run_stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Trace:
    """POST one speech request and timestamp every body chunk as it arrives."""
    import aiohttp

    trace = Trace(sent_at=time.perf_counter())
    try:
        async with session.post(url + SPEECH_PATH, json=body, trace_request_ctx=trace) as response:
            trace.status = response.status
            if response.status != 200:
                if response.status in (429, 503) and "Retry-After" in response.headers:
                    trace.answered_at = time.perf_counter()
                trace.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return trace
            async for chunk in response.content.iter_any():
                trace.arrivals.append(time.perf_counter())
                trace.sizes.append(len(chunk))
                trace.pcm += chunk
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


async def run_streams(
    session: aiohttp.ClientSession, plan: Plan, voices: list[str], concurrency: int, first: int
) -> list[StreamResult]:
    """Start ``concurrency`` streams at once and wait for them all."""
    indices = range(first, first + concurrency)
    chosen = [voices[i % len(voices)] for i in indices]
    bodies = [request_body(plan, v, i) for i, v in zip(indices, chosen, strict=True)]
    traces = await asyncio.gather(*(run_stream(session, plan.url, b) for b in bodies))
    return [
        analyse(t, plan.analysis, concurrency, i, v, b.get("seed"))
        for t, i, v, b in zip(traces, indices, chosen, bodies, strict=True)
    ]


async def run_level(
    session: aiohttp.ClientSession, plan: Plan, voices: list[str], concurrency: int
) -> tuple[LevelSummary, list[StreamResult]]:
    """``plan.rounds`` rounds of ``concurrency`` streams started at once, over connections
    opened before the level (a client keeps its pool warm: a TCP handshake per stream is no
    part of the server's time to first byte)."""
    streams: list[StreamResult] = []
    wall = 0.0
    await open_connections(session, plan.url, concurrency)
    before = await first_audio_histogram(session, plan.url)
    for round_ in range(plan.rounds):
        started = time.perf_counter()
        streams += await run_streams(session, plan, voices, concurrency, round_ * concurrency)
        wall += time.perf_counter() - started
    after = await first_audio_histogram(session, plan.url)
    summary = summarize(concurrency, streams, wall)
    ttfbs = [s.ttfb_ms for s in streams if s.ok and s.ttfb_ms is not None]
    wired = [s.wire_ttfb_ms for s in streams if s.ok and s.wire_ttfb_ms is not None]
    if before and after:
        summary.server_streams_counted = round(after[1] - before[1])
    if before and after and summary.server_streams_counted == len(ttfbs) and ttfbs:
        server_ms = 1000 * (after[0] - before[0]) / (after[1] - before[1])
        summary.server_first_audio_ms_mean = round(server_ms, 2)
        summary.http_overhead_ms_mean = round(statistics.fmean(ttfbs) - server_ms, 2)
        if wired:
            summary.http_overhead_on_wire_ms_mean = round(statistics.fmean(wired) - server_ms, 2)
    return summary, streams


async def open_connections(session: aiohttp.ClientSession, url: str, count: int) -> None:
    """Leave ``count`` kept-alive connections in ``session``'s pool (concurrent health checks)."""

    async def check() -> None:
        async with session.get(url + HEALTH_PATH) as response:
            await response.read()

    await asyncio.gather(*(check() for _ in range(count)))


async def first_audio_histogram(
    session: aiohttp.ClientSession, url: str
) -> tuple[float, float] | None:
    """(sum, count) of the server's time-to-first-audio histogram; ``None`` where it has none
    (a gateway, or metrics unreachable)."""
    import aiohttp

    try:
        async with session.get(url + "/metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except aiohttp.ClientError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (f"{FIRST_AUDIO_METRIC}_sum", f"{FIRST_AUDIO_METRIC}_count"):
            values[name.rsplit("_", 1)[1]] = float(value)
    return (values["sum"], values["count"]) if len(values) == 2 else None


async def served_voices(session: aiohttp.ClientSession, url: str) -> list[str]:
    """The usable voices the server lists."""
    async with session.get(url + VOICES_PATH) as response:
        if response.status != 200:
            raise RuntimeError(f"GET {VOICES_PATH}: HTTP {response.status}")
        listed = (await response.json())["voices"]
    return [v["id"] for v in listed if v.get("status") != "error" and "error" not in v]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def bench(plan: Plan) -> BenchResult:
    """Run the plan over one session whose pool holds a connection per concurrent stream."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max(plan.levels), limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=plan.read_timeout_s)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[wire_tracing()]
    ) as session:
        listed = await served_voices(session, plan.url)
        voices = plan.voices or listed
        if not voices:
            raise RuntimeError("the server lists no usable voice; pass --voices")
        missing = [v for v in voices if v not in listed]
        if missing:
            progress(f"warning: voices not listed by the server: {missing} (listed: {listed})")
        warmup = []
        for i in range(plan.warmup):
            warmup += await run_streams(session, plan, voices, 1, i)
            w = warmup[-1]
            progress(
                f"warm-up: ttfb {w.ttfb_ms or 0:.0f} ms, {w.audio_s:.2f} s audio"
                + (f", error {w.error}" if w.error else "")
            )
        levels, streams = [], {}
        for concurrency in plan.levels:
            summary, streams[concurrency] = await run_level(session, plan, voices, concurrency)
            levels.append(summary)
            progress(
                f"{concurrency} streams: ttfb p50 {summary.ttfb_ms['p50']} ms, "
                f"{summary.underrun_free_streams}/{summary.stream_count} without underrun"
            )
    return BenchResult(plan.url, voices, warmup, levels, streams)
