"""Benchmark a running voicehost server the way a streaming client experiences it.

For each concurrency level, ``c`` streams start at once (per round) against
``POST /v1/audio/speech`` (raw 24 kHz s16le PCM), all over one reused ``aiohttp`` session, and
every body chunk is timestamped as it arrives. Per stream: time to first byte, time to first
non-silent audio, real-time factor, underruns of a player that starts at the first byte; per
level: their percentiles and the audio tokens/s served. Reports the highest level at which at
least 99% of streams play without an underrun.

Prints a table and, as the last stdout line, one JSON object with the level summaries; writes
every stream's figures with ``--json`` and a chart with ``--plot``. Exits 1 if any stream failed.

    voicehost bench --url http://127.0.0.1:8080 --concurrency 1,4,16 --json bench.json
    voicehost bench --start-server --concurrency 1,2 --plot bench.png
    python scripts/bench.py ...   (the same command)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voicehost.orpheus import AUDIO_TOKENS_PER_SECOND, SAMPLE_RATE

if TYPE_CHECKING:  # imported where used, so that `voicehost --help` stays quick
    import aiohttp

SPEECH_PATH = "/v1/audio/speech"
VOICES_PATH = "/v1/audio/voices"
HEALTH_PATH = "/healthz"
BYTES_PER_SAMPLE = 2  # mono s16le
FULL_SCALE = 32768.0
SPEECH_WINDOW_S = 0.020
PERCENTILES = (50, 95, 99)
UNDERRUN_FREE_SHARE = 0.99  # the share of streams without an underrun that a level must reach
DESCRIPTION = (
    "Drive a server with concurrent streams over one HTTP session; report time to first byte and "
    "to first speech, underruns, real-time factor and tokens/s per concurrency level."
)
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the sun slowly sets."


# --- pure accounting -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Playback:
    """What a player fed by a stream went through."""

    underruns: int  # chunks that arrived after the audio before them had finished playing
    stall_s: float  # seconds the player waited, out of audio, over all underruns


def simulate_playback(
    chunks: Sequence[tuple[float, int]],
    sample_rate: int = SAMPLE_RATE,
    jitter_buffer_s: float = 0.0,
) -> Playback:
    """Play ``(arrival_time, samples)`` chunks in order and count the underruns.

    Playback starts ``jitter_buffer_s`` after the first chunk arrives; each chunk plays when the
    audio before it has finished. A chunk that arrives after the player ran out of audio
    (``arrival > start + audio before it + stall so far``) is an underrun: the player waits,
    and its clock restarts at that arrival. Chunks holding no whole sample are skipped (their
    bytes complete a sample of a later chunk).
    """
    underruns = 0
    stall = 0.0
    runs_dry_at: float | None = None  # when the audio queued so far has finished playing
    for arrival, samples in chunks:
        if samples <= 0:
            continue
        if runs_dry_at is None:
            runs_dry_at = arrival + jitter_buffer_s
        elif arrival > runs_dry_at:
            underruns += 1
            stall += arrival - runs_dry_at
            runs_dry_at = arrival
        runs_dry_at += samples / sample_rate
    return Playback(underruns, stall)


def first_speech_sample(
    samples: Any,
    sample_rate: int = SAMPLE_RATE,
    threshold_dbfs: float = -50.0,
    window_s: float = SPEECH_WINDOW_S,
) -> int | None:
    """The first sample at which the RMS of the ``window_s`` ending there exceeds the threshold.

    ``samples`` are int16 values (an array or sequence); dBFS is relative to 32768 (a full-scale
    square wave is 0 dBFS). The window is causal: it ends at the sample, so the audio that
    reveals speech has arrived by then. Returns None when no window is that loud.
    """
    import numpy as np

    x = np.asarray(samples, dtype=np.float64) / FULL_SCALE
    if x.size == 0:
        return None
    window = max(1, round(window_s * sample_rate))
    energy = np.cumsum(x * x)
    before = np.concatenate([np.zeros(window), energy[:-window]])[: energy.size]
    power_needed = window * 10 ** (threshold_dbfs / 10)
    loud = np.flatnonzero(energy - before > power_needed)
    return int(loud[0]) if loud.size else None


def samples_per_chunk(sizes: Sequence[int]) -> list[int]:
    """Whole samples each chunk completes, given the chunks' byte counts."""
    counts, received = [], 0
    for size in sizes:
        before = received // BYTES_PER_SAMPLE
        received += size
        counts.append(received // BYTES_PER_SAMPLE - before)
    return counts


def chunk_holding(counts: Sequence[int], sample: int) -> int:
    """The index of the chunk that holds ``sample``, given each chunk's sample count."""
    ends, total = [], 0
    for count in counts:
        total += count
        ends.append(total)
    return bisect.bisect_right(ends, sample)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), rounded; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (pos - low), 4)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """``{"p50": ..., "p95": ..., "p99": ...}``."""
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


# --- one stream ------------------------------------------------------------------------------


@dataclass(slots=True)
class Trace:
    """What one stream's client saw; times are ``time.perf_counter()`` readings."""

    sent_at: float
    on_wire_at: float | None = None  # the request's last byte was written to the socket
    arrivals: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    pcm: bytearray = field(default_factory=bytearray)
    status: int | None = None
    error: str | None = None
    answered_at: float | None = None  # when a refusal (503/429 with Retry-After) came


@dataclass(slots=True)
class StreamResult:
    """One stream's figures (milliseconds from sending the request, unless named otherwise)."""

    concurrency: int
    index: int
    voice: str
    seed: int | None
    status: int | None
    error: str | None
    refused_ms: float | None = None  # admission refused it (503/429 + Retry-After) this soon
    ttfb_ms: float | None = None
    wire_ttfb_ms: float | None = None  # from the request's last byte sent, not from the call
    first_speech_ms: float | None = None  # None: no 20 ms window above the threshold
    last_byte_ms: float | None = None
    audio_s: float = 0.0
    bytes: int = 0
    chunks: int = 0
    rtf: float | None = None  # (last byte - first byte) / audio seconds; < 1 keeps ahead
    rtf_total: float | None = None  # (last byte - request sent) / audio seconds
    underruns: int = 0
    stall_s: float = 0.0
    audio_tokens: float = 0.0
    chunk_arrivals_ms: list[float] = field(default_factory=list)
    chunk_samples: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def refused(self) -> bool:
        return self.refused_ms is not None


@dataclass(frozen=True, slots=True)
class Analysis:
    """How to read a trace."""

    sample_rate: int = SAMPLE_RATE
    jitter_buffer_s: float = 0.0
    speech_threshold_dbfs: float = -50.0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def analyse(
    trace: Trace, analysis: Analysis, concurrency: int, index: int, voice: str, seed: int | None
) -> StreamResult:
    """Turn a stream's trace into its figures."""
    import numpy as np

    result = StreamResult(concurrency, index, voice, seed, trace.status, trace.error)
    if trace.answered_at is not None:
        result.refused_ms = _ms(trace.answered_at - trace.sent_at)
    counts = samples_per_chunk(trace.sizes)
    total = sum(counts)
    result.bytes, result.chunks = len(trace.pcm), len(trace.arrivals)
    result.audio_s = round(total / analysis.sample_rate, 4)
    result.chunk_arrivals_ms = [_ms(t - trace.sent_at) for t in trace.arrivals]
    result.chunk_samples = counts
    if result.error is None and total == 0:
        result.error = "no audio received"
    if not trace.arrivals or total == 0:
        return result
    first, last = trace.arrivals[0], trace.arrivals[-1]
    result.ttfb_ms, result.last_byte_ms = _ms(first - trace.sent_at), _ms(last - trace.sent_at)
    if trace.on_wire_at is not None:
        result.wire_ttfb_ms = _ms(first - trace.on_wire_at)
    audio = np.frombuffer(bytes(trace.pcm[: total * BYTES_PER_SAMPLE]), dtype="<i2")
    speech = first_speech_sample(audio, analysis.sample_rate, analysis.speech_threshold_dbfs)
    if speech is not None:
        at = trace.arrivals[chunk_holding(counts, speech)]
        result.first_speech_ms = _ms(at - trace.sent_at)
    playback = simulate_playback(
        list(zip(trace.arrivals, counts, strict=True)),
        analysis.sample_rate,
        analysis.jitter_buffer_s,
    )
    result.underruns, result.stall_s = playback.underruns, round(playback.stall_s, 4)
    audio_s = total / analysis.sample_rate
    result.rtf = round((last - first) / audio_s, 4)
    result.rtf_total = round((last - trace.sent_at) / audio_s, 4)
    result.audio_tokens = round(audio_s * AUDIO_TOKENS_PER_SECOND, 2)
    return result


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


# --- levels ----------------------------------------------------------------------------------


@dataclass(slots=True)
class LevelSummary:
    """One concurrency level: percentiles over its successful streams, totals over all."""

    concurrency: int
    stream_count: int
    errors: int  # failed streams, not counting those refused by admission control
    refused: int  # answered 503/429 with Retry-After (the server was full, or a key's quota)
    refused_ms_max: float | None
    wall_s: float
    ttfb_ms: dict[str, float | None]
    first_speech_ms: dict[str, float | None]
    no_speech_streams: int  # successful streams with no window above the speech threshold
    rtf: dict[str, float | None]
    rtf_total: dict[str, float | None]
    underruns: int
    stall_s: float
    underrun_free_streams: int  # successful streams without an underrun
    underrun_free_share: float  # of the admitted streams (a failed one counts as not free)
    audio_s: float
    audio_tokens_per_s: float  # audio tokens of every stream / the level's wall time
    error_messages: list[str] = field(default_factory=list)
    # The server's own time from starting a stream to its first decoded PCM (its
    # voicehost_time_to_first_audio_seconds histogram over this level), and how much longer
    # the client waited for its first byte on average: parsing, routing, HTTP and the network;
    # "on the wire" counts from each request's last byte sent, leaving out the client's own
    # queue (a burst of requests leaves one client process one at a time).
    server_first_audio_ms_mean: float | None = None
    http_overhead_ms_mean: float | None = None
    http_overhead_on_wire_ms_mean: float | None = None


def summarize(concurrency: int, streams: Sequence[StreamResult], wall_s: float) -> LevelSummary:
    """A level's summary from its streams' figures."""
    ok = [s for s in streams if s.ok]
    refused = [s.refused_ms for s in streams if s.refused_ms is not None]
    audio_s = sum(s.audio_s for s in ok)
    free = sum(1 for s in ok if s.underruns == 0)

    def spread(name: str) -> dict[str, float | None]:
        return percentiles([v for s in ok if (v := getattr(s, name)) is not None])

    rtf = spread("rtf")
    rtf["max"] = max((s.rtf for s in ok if s.rtf is not None), default=None)
    return LevelSummary(
        concurrency=concurrency,
        stream_count=len(streams),
        errors=len(streams) - len(ok) - len(refused),
        refused=len(refused),
        refused_ms_max=max(refused, default=None),
        wall_s=round(wall_s, 3),
        ttfb_ms=spread("ttfb_ms"),
        first_speech_ms=spread("first_speech_ms"),
        no_speech_streams=sum(1 for s in ok if s.first_speech_ms is None),
        rtf=rtf,
        rtf_total=spread("rtf_total"),
        underruns=sum(s.underruns for s in ok),
        stall_s=round(sum(s.stall_s for s in ok), 3),
        underrun_free_streams=free,
        underrun_free_share=round(free / admitted, 4)
        if (admitted := len(streams) - len(refused))
        else 0.0,
        audio_s=round(audio_s, 3),
        audio_tokens_per_s=round(audio_s * AUDIO_TOKENS_PER_SECOND / wall_s, 2) if wall_s else 0.0,
        error_messages=[
            f"stream {s.index} ({s.voice}): {s.error}" for s in streams if s.error and not s.refused
        ],
    )


def max_concurrency_without_underrun(
    levels: Sequence[LevelSummary], share: float = UNDERRUN_FREE_SHARE
) -> int | None:
    """The highest level at which at least ``share`` of the streams had no underrun."""
    passing = [
        lv.concurrency for lv in levels if lv.stream_count and lv.underrun_free_share >= share
    ]
    return max(passing, default=None)


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
    if before and after and after[1] > before[1] and ttfbs:
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


FIRST_AUDIO_METRIC = "voicehost_time_to_first_audio_seconds"


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


# --- output ----------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(levels: Sequence[LevelSummary]) -> str:
    """A fixed-width table of the level summaries, with their streams' errors under them."""
    head = (
        f"{'conc':>5} {'n':>4} {'ttfb p50':>9} {'p95':>7} {'p99':>7} {'speech p50':>11} "
        f"{'p95':>7} {'p99':>7} {'rtf p50':>8} {'rtf max':>8} {'no underrun':>12} "
        f"{'stall s':>8} {'tok/s':>8} {'server ms':>9} {'http ms':>8} {'wire ms':>8} "
        f"{'errors':>6} {'refused':>7}"
    )
    lines = [head]
    for lv in levels:
        t, s = lv.ttfb_ms, lv.first_speech_ms
        lines.append(
            f"{lv.concurrency:>5} {lv.stream_count:>4} {_fmt(t['p50'], '.0f'):>9} "
            f"{_fmt(t['p95'], '.0f'):>7} {_fmt(t['p99'], '.0f'):>7} {_fmt(s['p50'], '.0f'):>11} "
            f"{_fmt(s['p95'], '.0f'):>7} {_fmt(s['p99'], '.0f'):>7} "
            f"{_fmt(lv.rtf['p50'], '.2f'):>8} {_fmt(lv.rtf['max'], '.2f'):>8} "
            f"{f'{lv.underrun_free_streams}/{lv.stream_count}':>12} {lv.stall_s:>8.2f} "
            f"{lv.audio_tokens_per_s:>8.1f} {_fmt(lv.server_first_audio_ms_mean, '.1f'):>9} "
            f"{_fmt(lv.http_overhead_ms_mean, '.1f'):>8} "
            f"{_fmt(lv.http_overhead_on_wire_ms_mean, '.1f'):>8} {lv.errors:>6} {lv.refused:>7}"
        )
        lines += [f"      error: {message}" for message in lv.error_messages[:5]]
    return "\n".join(lines)


def summary_report(plan: Plan, result: BenchResult) -> dict[str, Any]:
    """The run's settings and level summaries (the last stdout line)."""
    return {
        "url": result.url,
        "text": plan.text,
        "voices": result.voices,
        "rounds": plan.rounds,
        "jitter_buffer_ms": round(plan.analysis.jitter_buffer_s * 1000, 3),
        "speech_threshold_dbfs": plan.analysis.speech_threshold_dbfs,
        "audio_tokens_per_audio_second": round(AUDIO_TOKENS_PER_SECOND, 4),
        "max_concurrency_without_underrun": max_concurrency_without_underrun(result.levels),
        "warmup_errors": [f"{w.voice}: {w.error}" for w in result.warmup if w.error],
        "levels": [asdict(lv) for lv in result.levels],
    }


def full_report(plan: Plan, result: BenchResult) -> dict[str, Any]:
    """The summary report with every stream's figures under its level (for ``--json``)."""
    report = summary_report(plan, result)
    for level in report["levels"]:
        level["streams"] = [asdict(s) for s in result.streams[level["concurrency"]]]
    report["warmup"] = [asdict(w) for w in result.warmup]
    return report


def _series(levels: Sequence[LevelSummary], pick: Any) -> list[float]:
    return [math.nan if (v := pick(lv)) is None else v for lv in levels]


def write_plot(levels: Sequence[LevelSummary], path: Path, max_ok: int | None) -> None:
    """First byte / first speech percentiles, underrun share and tokens/s against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [lv.concurrency for lv in levels]
    fig, (latency, underrun, tokens) = plt.subplots(1, 3, figsize=(15, 4.5))
    for key, style in zip(("p50", "p95", "p99"), ("o-", "s--", "^:"), strict=True):
        latency.plot(x, _series(levels, lambda lv, k=key: lv.ttfb_ms[k]), style, color="C0")
        speech = _series(levels, lambda lv, k=key: lv.first_speech_ms[k])
        latency.plot(x, speech, style, color="C1", markerfacecolor="none", markersize=9)
    latency.plot([], [], "-", color="C0", label="first byte")
    latency.plot([], [], "-", color="C1", label="first speech")
    latency.set(title="latency (p50 o, p95 s, p99 ^)", xlabel="concurrent streams", ylabel="ms")
    latency.legend()
    share = [100 * (1 - lv.underrun_free_share) for lv in levels]
    underrun.plot(x, share, "o-", color="C3")
    underrun.axhline(100 * (1 - UNDERRUN_FREE_SHARE), color="grey", linestyle="--", label="1%")
    underrun.set(
        title=f"streams with an underrun (max ok: {max_ok})",
        xlabel="concurrent streams",
        ylabel="% of streams",
        ylim=(-2, 102),
    )
    underrun.legend(loc="center right")
    tokens.plot(x, [lv.audio_tokens_per_s for lv in levels], "o-", color="C2", label="served")
    tokens.plot(
        x, [c * AUDIO_TOKENS_PER_SECOND for c in x], "--", color="grey", label="real time x c"
    )
    tokens.set(title="audio tokens/s, all streams", xlabel="concurrent streams", ylabel="tokens/s")
    tokens.legend()
    for ax in (latency, underrun, tokens):
        if len(x) > 1 and max(x) >= 4 * min(x):
            ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(c) for c in x])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- a dev server ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(log: Path, **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``voicehost serve --dev`` on a free port in its own process group, with
    ``settings`` (``VOICEHOST_*`` variables) added to its environment."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        **settings,
    }
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


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Poll /readyz until 200; fail fast if the server exits or /healthz says start-up failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log in {log}")
        if http_status(f"{url}/readyz") == 200:
            return
        if http_status(url + HEALTH_PATH) == 503:
            raise RuntimeError(f"server start-up failed; log in {log}")
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout:.0f} s; log in {log}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the server's process group, SIGKILL after 20 s, then kill what is left of it."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)  # engine processes that outlived the server
    except ProcessLookupError:
        pass
    proc.wait()


# --- command line ----------------------------------------------------------------------------


def _levels(value: str) -> list[int]:
    try:
        levels = [int(c) for c in value.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"want a comma list of positive integers, not {value!r}")
    return levels


def _voices(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options (shared by ``voicehost bench`` and ``scripts/bench.py``)."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server to drive")
    parser.add_argument(
        "--concurrency", type=_levels, default=[1, 4, 16], help="comma list of levels (1,4,16)"
    )
    parser.add_argument(
        "--voices", type=_voices, help="comma list, used in turn (default: every listed voice)"
    )
    parser.add_argument("--text", default=DEFAULT_TEXT, help="what every stream says")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds per level, each of c streams started at once"
    )
    parser.add_argument("--seed", type=int, default=0, help="stream i of a level uses seed + i")
    parser.add_argument("--warmup", type=int, default=1, help="streams run first, not counted")
    parser.add_argument(
        "--jitter-buffer-ms",
        type=float,
        default=0.0,
        help="the modelled player starts this long after the first byte",
    )
    parser.add_argument(
        "--speech-threshold-dbfs",
        type=float,
        default=-50.0,
        help="first speech: the first 20 ms window whose RMS exceeds this",
    )
    parser.add_argument("--json", type=Path, help="write every stream's figures here")
    parser.add_argument("--plot", type=Path, help="write a PNG chart here")
    parser.add_argument(
        "--start-server", action="store_true", help="start a dev server (ignores --url)"
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds, with --start-server"
    )
    parser.add_argument("--read-timeout", type=float, default=600.0, help="seconds without a byte")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    add_arguments(parser)
    return parser


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(
        url=args.url.rstrip("/"),
        levels=args.concurrency,
        voices=args.voices or None,
        text=args.text,
        rounds=max(1, args.rounds),
        seed=args.seed,
        warmup=max(0, args.warmup),
        read_timeout_s=args.read_timeout,
        analysis=Analysis(
            jitter_buffer_s=args.jitter_buffer_ms / 1000,
            speech_threshold_dbfs=args.speech_threshold_dbfs,
        ),
    )


@contextmanager
def served(
    url: str | None, ready_timeout: float = 600
) -> Iterator[tuple[str, subprocess.Popen[bytes] | None]]:
    """``url`` as it is, or (``None``) a dev server started for the block and stopped after
    it: yields the URL and the server's process (``None`` when not started here)."""
    if url is not None:
        yield url, None
        return
    log = Path(tempfile.mkdtemp(prefix="voicehost-bench-")) / "server.log"
    progress(f"starting a dev server (log {log}) ...")
    proc, url = start_server(log)
    try:
        wait_ready(proc, url, log, ready_timeout)
        progress(f"server ready at {url}")
        yield url, proc
    finally:
        stop_server(proc)


def execute(plan: Plan, start: bool, ready_timeout: float) -> BenchResult:
    """Run the plan, against a dev server started for it when ``start``."""
    with served(None if start else plan.url, ready_timeout) as (url, _):
        return asyncio.run(bench(replace(plan, url=url)))


def run(args: argparse.Namespace) -> int:
    """Run the bench for parsed arguments; the exit status."""
    import aiohttp

    plan = plan_from(args)
    try:
        result = execute(plan, args.start_server, args.ready_timeout)
    except (RuntimeError, OSError, aiohttp.ClientError, ValueError) as exc:
        message = f"{type(exc).__name__}: {exc}"
        print(f"voicehost bench: {message}", file=sys.stderr)
        print(json.dumps({"error": message, "levels": []}))
        return 1
    print(format_table(result.levels))
    summary = summary_report(plan, result)
    if args.json:
        args.json.write_text(json.dumps(full_report(plan, result), indent=1) + "\n")
    if args.plot:
        write_plot(result.levels, args.plot, summary["max_concurrency_without_underrun"])
    print(json.dumps(summary))
    failed = any(lv.errors for lv in result.levels) or summary["warmup_errors"]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python scripts/bench.py [args]``: the exit status."""
    return run(build_parser().parse_args(argv))
