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
import time
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
JOB_ENDINGS = ("done", "held", "failed")  # how a clone job's run ends (voicehost.cloning.jobs)
FLUSH_OUTCOMES = ("stored", "failed")  # a usage flush (voicehost.tenancy.usage)
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
        self.start_time = Gauge(
            "voicehost_start_time_seconds",
            "When this process started (Unix time; a host's newest front end): a change is a "
            "restart (an engine core or front end that died ends its host, restarted by its "
            "supervisor).",
            registry=r,
            multiprocess_mode="max",
        )
        self.start_time.set(time.time())
        self.frontend_streams = Gauge(
            "voicehost_frontend_streams",
            "Streams in progress on each front end of the host (serve --frontends N).",
            ["frontend"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.lora_slots = Gauge(
            "voicehost_lora_slots",
            "The engine's LoRA slots (adapters one batch can hold: VOICEHOST_MAX_LORAS).",
            registry=r,
            multiprocess_mode="max",
        )
        self.lora_adapters_in_use = Gauge(
            "voicehost_lora_adapters_in_use",
            "Distinct LoRA adapters of the requests the engine holds (more than the slots: some "
            "wait for one): the host's, whichever of its front ends runs them (an adapter two "
            "front ends run counts once).",
            registry=r,
            multiprocess_mode="max",
        )
        self.decode_seconds_per_audio_second = Gauge(
            "voicehost_decode_seconds_per_audio_second",
            "Wall seconds the front end's audio decoder (SNAC) took per second of audio it gave, "
            "over the last 10 s (0 until it has decoded 2 s of audio in them): the host's slowest "
            "front end. Its streams stutter once this times their audio seconds per second "
            "passes 1; measured-capacity admission refuses a stream before then.",
            registry=r,
            multiprocess_mode="max",
        )
        self.clone_jobs_ended = Counter(
            "voicehost_clone_jobs_ended",
            "Clone job runs this process ended, by how: done, held (by the gate) or failed.",
            ["status"],
            registry=r,
        )
        for status in JOB_ENDINGS:
            self.clone_jobs_ended.labels(status)
        self.clone_jobs_taken_over = Counter(
            "voicehost_clone_jobs_taken_over",
            "Clone jobs this runner took over from a runner whose lease on them lapsed.",
            registry=r,
        )
        self.clone_jobs_runner_lost = Gauge(
            "voicehost_clone_jobs_runner_lost",
            "Clone jobs running under a lapsed lease that no runner has taken over yet (what "
            "GET /v1/jobs/{id} says runner_lost), as this runner last looked.",
            registry=r,
            multiprocess_mode="max",
        )
        self.audit_chain_breaks = Counter(
            "voicehost_audit_chain_breaks",
            "Audit appends that found the chain they continue broken (the log's last line not "
            "an event; a cluster's mirror that the stream's lines do not continue): the events "
            "wait in memory; `voicehost audit verify` says where it broke.",
            registry=r,
        )
        self.usage_flushes = Counter(
            "voicehost_usage_flushes",
            "Flushes of counted usage to the usage store, by outcome: stored, or failed (the "
            "usage is kept for the next one).",
            ["outcome"],
            registry=r,
        )
        for outcome in FLUSH_OUTCOMES:
            self.usage_flushes.labels(outcome)

    def watch_engine(self, unfinished: Callable[[], int]) -> None:
        self._watch(self.engine_requests, unfinished)

    def watch_registry(self, missing: Callable[[], int]) -> None:
        self._watch(self.registry_missing, missing)

    def watch_loras(self, max_loras: int, in_use: Callable[[], int]) -> None:
        self.lora_slots.set(max_loras)
        self._watch(self.lora_adapters_in_use, in_use)

    def watch_decode(self, per_audio_second: Callable[[], float]) -> None:
        self._watch(self.decode_seconds_per_audio_second, per_audio_second)

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


class RingMetrics:
    """What only a gateway knows, in its registry: the workers on its ring."""

    def __init__(self, registry: CollectorRegistry, workers: Callable[[], int]) -> None:
        self.workers = Gauge(
            "voicehost_ring_workers",
            "Workers on this gateway's ring (live: heartbeating, not drained).",
            registry=registry,
        )
        self.workers.set_function(workers)
        self.lost = Counter(
            "voicehost_ring_workers_lost",
            "Workers this gateway found gone from the ring without leaving it (their heartbeat "
            "expired: died or cut off, not drained).",
            registry=registry,
        )


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
