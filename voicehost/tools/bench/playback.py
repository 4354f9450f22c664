"""One stream as its listener hears it: a player fed by the chunks as they arrive (underruns),
where speech starts, and a client's trace of a stream turned into its figures."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from voicehost.model.orpheus import AUDIO_TOKENS_PER_SECOND, SAMPLE_RATE

BYTES_PER_SAMPLE = 2  # mono s16le
FULL_SCALE = 32768.0


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
    samples: Any, sample_rate: int = SAMPLE_RATE, threshold_dbfs: float = -50.0
) -> int | None:
    """The first sample of the first 10 ms window louder than ``threshold_dbfs``
    (``voicehost.audio.speech_start``, the runtime trim's detector); None when none is that loud.

    ``samples`` are int16 values (an array or sequence); dBFS is relative to 32768 (a full-scale
    square wave is 0 dBFS).
    """
    import numpy as np

    from voicehost.audio.speech_start import speech_start

    audio = np.asarray(samples, dtype=np.float64) / FULL_SCALE
    return speech_start(audio, threshold_dbfs, sample_rate)


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
