"""Prometheus metrics of the synthesis pipeline, in one registry per process.

The front ends of one host (``voicehost serve --frontends N``) answer ``/metrics`` for the host:
the host sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts them (``MULTIPROCESS``), so every
value is kept in a file of that folder per process, and ``render`` sums them (Prometheus'
multiprocess mode): counters and histograms add up, a gauge says how its processes combine.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"  # set: this process is one front end of several

# why a remote ICE candidate gets no check (voicehost.webrtc.ice.CandidateScreen)
CANDIDATE_REFUSALS = (
    "link_local",
    "loopback",
    "private",
    "multicast",
    "broadcast",
    "unspecified",
    "not_an_address",
)
LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
RTF_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


class SpeechMetrics:
    """What operators watch: latency to first audio, real-time factor, load, throughput, errors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.multiprocess = MULTIPROCESS in os.environ
        self._rendered = r
        if self.multiprocess:  # what every front end's files hold
            self._rendered = CollectorRegistry()
            MultiProcessCollector(self._rendered)
        # gauges read from a function when rendered; in multiprocess mode set by ``refresh``
        self._watched: list[tuple[Gauge, Callable[[], float]]] = []
        self.time_to_first_audio = Histogram(
            "voicehost_time_to_first_audio_seconds",
            "Per stream, from its text accepted to the first audio samples sent (once per stream, "
            "not per segment).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.real_time_factor = Histogram(
            "voicehost_real_time_factor",
            "Generation time / audio duration per finished stream (< 1 is faster than real time).",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.active_streams = Gauge(
            "voicehost_active_streams",
            "Streams in progress.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.webrtc_sessions = Gauge(
            "voicehost_webrtc_sessions",
            "WebRTC sessions open (answered, until they end).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.webrtc_candidates_refused = Counter(
            "voicehost_webrtc_candidates_refused",
            "Remote ICE candidates no check was sent to, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in CANDIDATE_REFUSALS:  # each series there from the start, at 0
            self.webrtc_candidates_refused.labels(reason)
        self.malformed_requests = Counter(
            "voicehost_malformed_requests",
            "HTTP requests refused before routing as malformed (bad request line or headers).",
            registry=r,
        )
        self.audio_tokens = Counter(
            "voicehost_audio_tokens", "Audio tokens generated (rate() gives tokens/s).", registry=r
        )
        self.engine_outputs = Counter(
            "voicehost_engine_outputs",
            "Outputs the engine handed this process (audio tokens / this: tokens per wake-up, "
            "VOICEHOST_STREAM_INTERVAL's effect).",
            registry=r,
        )
        self.tokens_per_second = Gauge(
            "voicehost_stream_tokens_per_second",
            "Tokens/s of the last finished stream.",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.underruns = Counter(
            "voicehost_stream_underruns",
            "Audio sent later than its stream's playback clock (the listener's buffer ran dry: "
            "a stutter), counted once per stall.",
            registry=r,
        )
        self.request_tokens_per_second = Gauge(
            "voicehost_request_tokens_per_second",
            "Audio tokens/s per engine request, as measured by admission, by batch size.",
            ["batch"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.realtime_headroom = Gauge(
            "voicehost_realtime_headroom_streams",
            "Streams more the host predicts it keeps real time (what it tells gateways).",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.audio_seconds = Counter("voicehost_audio_seconds", "Audio produced.", registry=r)
        self.stall_flushes = Counter(
            "voicehost_stall_flushes",
            "Held frames decoded early: the engine went quiet as the listener's lead ran out.",
            registry=r,
        )
        self.segments = Counter(
            "voicehost_segments", "Text segments spoken (long inputs are split).", registry=r
        )
        self.trimmed_seconds = Counter(
            "voicehost_trimmed_leading_seconds",
            "Near-silent audio dropped from the start of streams that asked for it.",
            registry=r,
        )
        self.errors = Counter("voicehost_errors", "Errors by kind.", ["kind"], registry=r)
        self.undocumented_errors = Counter(
            "voicehost_undocumented_errors",
            "Error answers their operation's OpenAPI text does not list (a bug: the error table, "
            "voicehost.api.errors, is missing a row or an operation).",
            ["operation", "code"],
            registry=r,
        )
        self.stream_errors = Counter(
            "voicehost_stream_errors",
            "Streams that failed after their first byte (cut, or ended with an error event), "
            "by stage: synthesis or encoding on a worker, upstream on a gateway.",
            ["stage"],
            registry=r,
        )
        self.intake_checks = Counter(
            "voicehost_intake_checks",
            "Uploads this process checked before queueing their clone job (the consent "
            "recording heard, the files probed; voicehost.cloning.intake), by outcome: passed, "
            "or the code it was refused with. A gateway checks none: it asks a worker.",
            ["outcome"],
            registry=r,
        )
        self.engine_requests = Gauge(
            "voicehost_engine_unfinished_requests",
            "Requests held by the vLLM engine.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.asyncio_tasks = Gauge(
            "voicehost_asyncio_tasks",
            "Asyncio tasks alive in the serving processes (flat under steady load; growth is a "
            "leak).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self._watch(self.asyncio_tasks, open_tasks)
        self.usage_characters = Counter(
            "voicehost_usage_characters",
            "Characters of input spoken (counted with the first audio of their segment sent).",
            ["key", "tenant", "voice"],
            registry=r,
        )
        self.usage_audio_seconds = Counter(
            "voicehost_usage_audio_seconds",
            "Seconds of audio sent to clients.",
            ["key", "tenant", "voice"],
            registry=r,
        )
        self.registry_missing = Gauge(
            "voicehost_registry_missing_voices",
            "Voices in the cluster's shared store whose Redis record is missing (0: whole).",
            registry=r,
            multiprocess_mode="max",
        )

    def watch_engine(self, unfinished: Callable[[], int]) -> None:
        self._watch(self.engine_requests, unfinished)

    def watch_registry(self, missing: Callable[[], int]) -> None:
        self._watch(self.registry_missing, missing)

    def _watch(self, gauge: Gauge, read: Callable[[], float]) -> None:
        if self.multiprocess:  # a function is not shared through the files: ``refresh`` it
            self._watched.append((gauge, read))
        else:
            gauge.set_function(read)

    def refresh(self) -> None:
        """Bring the gauges read from functions up to date in this process's file (multiprocess
        mode; the serving process calls it every half second and each render does)."""
        for gauge, read in self._watched:
            gauge.set(read())

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self._rendered)


def series(text: str, name: str, label: str) -> dict[str, float]:
    """The series of metric ``name`` in a ``/metrics`` text, by the value of ``label`` (the
    one label they carry), as clients read back what ``render`` wrote."""
    prefix = f'{name}{{{label}="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def open_tasks() -> float:
    """Tasks not yet done on this thread's running event loop (NaN outside one)."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # no running loop in this thread
        return math.nan
