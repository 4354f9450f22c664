"""The long-lived parts of one serving process and their start-up order.

Start-up runs in the background so the HTTP server answers ``/healthz`` and ``/readyz`` (503)
while the dev model is built, SNAC and vLLM load, and one warm-up request runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError
from redis.exceptions import RedisError

from voicehost.audio.encoding import EncodingPool
from voicehost.audio.speaker import shared_embedder
from voicehost.cloning.intake import LocalIntake
from voicehost.cloning.jobs import CloneJobs, JobQueue, TrainingModel, Verdict, add_to
from voicehost.config import Settings
from voicehost.errors import ServiceError, validation_message
from voicehost.host.channel import Body, ChannelError
from voicehost.host.frontend import CORE_LOST_SIGNAL, DRAIN_TOPIC, FrontEnd
from voicehost.metrics import SpeechMetrics
from voicehost.model.codec import DecodeScheduler, SnacCodec
from voicehost.model.devmodel import DevModelPaths, ensure_dev_model
from voicehost.model.engine import SpeechEngine
from voicehost.model.served import (
    adapter_roots,
    adapter_rules,
    check_segments_fit,
    served_codec,
    served_languages,
    served_model,
)
from voicehost.speech.admission import Admission, WorkerLoad
from voicehost.speech.alignment import Aligner, EstimatedAligner, spoken_letters
from voicehost.speech.board import LocalBoard
from voicehost.speech.capacity import DecodeCost, RateMeter, Realtime
from voicehost.speech.forced_alignment import load_aligner
from voicehost.speech.synthesis import Synthesizer
from voicehost.tenancy.audit import AuditTrail, FileAuditTrail
from voicehost.tenancy.lexicons import FolderLexicons, LexiconLimits, LexiconStore
from voicehost.tenancy.usage import FileUsageStore, UsageLedger, UsageStore
from voicehost.voices.folders import FolderVoiceDirectory
from voicehost.voices.validation import MANIFEST, AdapterRules, read_json_object
from voicehost.voices.voice import VoiceDirectory, VoiceExists

if TYPE_CHECKING:
    from voicehost.tenancy.keys import Principal

log = logging.getLogger(__name__)

# What a dev server lets a test change while it runs (``PATCH /internal/dev/settings``), so that
# a test needs no server of its own for them: each is read per request (sampling, the text
# stage, prefetch), per clone (the speech an upload needs, the epochs its job is given, its
# evaluation and the gate's verdict), or its admission is rebuilt when it changes.
RUNTIME_DEV_SETTINGS = frozenset(
    {
        "temperature",
        "top_p",
        "repetition_penalty",
        "realtime_tokens_per_second",
        "realtime_margin",
        "segment_prefetch",
        "segment_max_chars",
        "min_speech_seconds",
        "clone_epochs",
        "eval_sentences",
        "eval_baselines",
        "eval_report_only",
    }
)


class ClusterLink(Protocol):
    """What a cluster worker adds to a serving process (``voicehost.cluster.worker.WorkerCluster``):
    voices and jobs shared through the cluster, and a place on its ring."""

    worker_id: str

    def voice_directory(
        self, builtin: Mapping[str, str] | Iterable[str], rules: AdapterRules
    ) -> VoiceDirectory: ...

    def job_queue(self) -> JobQueue: ...

    def audit_trail(self) -> AuditTrail:
        """The cluster's one audit chain (Redis, mirrored to the shared store)."""
        ...

    def usage_store(self) -> UsageStore:
        """Where this worker's counted usage is summed for the whole cluster."""
        ...

    def lexicon_store(self) -> LexiconStore:
        """The tenants' lexicons, as every process of the cluster reads them."""
        ...

    def join(self, load: Callable[[], WorkerLoad], ring: bool) -> Coroutine[Any, Any, None]:
        """Keep this process on the ring, reporting ``load``, until cancelled. ``ring`` false:
        a host's other front end, serving under front end 0's place (its key leases and
        audit events kept, no place of its own)."""
        ...

    async def leave(self) -> None:
        """Leave the ring (drain): gateways send nothing new."""
        ...

    def key_stream(self, key_id: str, limit: int) -> AbstractAsyncContextManager[None]:
        """One of ``key_id``'s at most ``limit`` streams in the whole cluster, held for the
        ``async with`` block; ``Refused`` (429) beyond it."""
        ...

    async def close(self) -> None: ...


class InvalidDevSettings(ServiceError, ValueError):
    """A run-time settings change a dev server refuses (nothing is changed)."""

    code = "invalid_request"


class NotReady(ServiceError, RuntimeError):
    """The engine is still starting, failed to start or died, or the process is draining:
    another process may answer (``Retry-After: 1``)."""

    code = "not_ready"


def is_missing_folder(model: str) -> bool:
    """Whether ``model`` names a folder (absolute, relative to here or home, not a hub id)
    that does not exist."""
    return model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists()


class ServingProcess:
    """Engine, codec, voice directory, clone jobs and metrics of one process.

    Alone (``voicehost serve``) voices are the local adapter folders and jobs queue in the jobs
    folder; as a cluster worker they come from Redis and the shared store. ``frontend``: this
    process is one of several front ends of one engine core (``voicehost.host``), speaking to
    the others over the host's ``channel``; the first of them runs the host's clone jobs.
    """

    def __init__(
        self,
        settings: Settings,
        cluster: ClusterLink | None = None,
        frontend: FrontEnd | None = None,
    ) -> None:
        check_segments_fit(settings)
        self.settings = settings
        self.cluster = cluster
        self.frontend = frontend
        self.core_client = frontend.client if frontend is not None else None
        self.channel = frontend.channel() if frontend is not None else None  # opened by ``open``
        if self.channel is not None:
            self.channel.on(DRAIN_TOPIC, self._drained_by_host)
        self.metrics = SpeechMetrics()
        self.voices: VoiceDirectory
        queue: JobQueue | None = None
        self.audit: AuditTrail
        usage: UsageStore
        rules = adapter_rules(settings)  # the dev model's shape: once it is built, at load
        self.languages = served_languages(settings)
        if cluster is None:
            self.audit = FileAuditTrail(settings.audit_file())
            usage = FileUsageStore(settings.usage_file())
            self.folder_voices: FolderVoiceDirectory | None = FolderVoiceDirectory(
                adapter_roots(settings), self.languages.voices, rules
            )
            self.voices = self.folder_voices
            jobs_dir, runner = settings.jobs_dir, "local"
            self.lexicons: LexiconStore = FolderLexicons(
                settings.lexicons_dir, LexiconLimits.from_settings(settings)
            )
        else:
            self.folder_voices = None
            self.voices = cluster.voice_directory(self.languages.voices, rules)
            jobs_dir, runner = settings.shared_dir / "jobs", cluster.worker_id
            queue = cluster.job_queue()
            self.audit, usage = cluster.audit_trail(), cluster.usage_store()
            self.lexicons = cluster.lexicon_store()
        self.audit.breaks = self.metrics.audit_chain_breaks
        self.usage = UsageLedger(usage, self.metrics, settings.usage_flush_seconds)
        self.engine: SpeechEngine | None = None
        self.codec: SnacCodec | None = None
        self.scheduler: DecodeScheduler | None = None
        self.synthesizer: Synthesizer | None = None
        # word timing: the built-in estimate, until start-up loads VOICEHOST_ALIGNER_MODEL's
        self.aligner: Aligner = EstimatedAligner(spoken_letters)
        self.encoding_pool = EncodingPool(settings.encode_threads, settings.encode_process_count())
        self.metrics.watch_registry(self.voices.missing)
        self.jobs = CloneJobs(
            jobs_dir,
            add_to(self.voices),
            queue,
            runner,
            self.evaluate_clone,
            audit=self.audit,
            lease_seconds=settings.job_lease_seconds,
            model=TrainingModel(
                settings.served_base_name(), served_model(settings), served_codec(settings)
            ),
            metrics=self.metrics,
        )
        self.intake = LocalIntake(settings, self.jobs, self.metrics)  # an upload's checks
        self._started = asyncio.Event()  # start-up has ended, ready or failed
        # the host's streams: this process's, or every front end's of the engine core
        capacity = settings.stream_capacity()
        board = frontend.board(capacity) if frontend is not None else LocalBoard()
        self.meter = RateMeter(board=board)  # the engine's tokens/s per request, by batch size
        self.decode_cost = DecodeCost()  # what this process's audio decoding takes
        self.metrics.watch_decode(lambda: self.decode_cost.per_audio_second() or 0.0)
        realtime = Realtime.from_settings(self.meter, settings, self.decode_cost)
        self.admission = Admission(capacity, settings.key_max_streams, realtime, board=board)
        self.draining = False
        self.startup_error: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._engine_start: asyncio.Future[SpeechEngine] | None = None

    @property
    def failure(self) -> str | None:
        """Why this process cannot serve at all (start-up failed, or the engine died)."""
        if self.startup_error:
            return self.startup_error
        if self.engine is not None and not self.engine.healthy:
            return "the engine has died; the process must be restarted"
        return None

    def require_synthesizer(self) -> Synthesizer:
        if self.failure:
            raise NotReady(self.failure)
        if self.draining:
            raise NotReady("draining: this process takes no new streams")
        if self.synthesizer is None:
            raise NotReady("the engine is warming up")
        return self.synthesizer

    async def evaluate_clone(self, voice_id: str, folder: Path) -> Verdict:
        """Measure a freshly trained voice in ``folder`` through this process's engine against
        the clips its training held out, and write the verdict into its ``voice.json``
        (``voicehost.cloning.candidate``); the clone job calls this before it registers the voice.
        Waits for the engine if it is still warming up; ``NotReady`` if it cannot serve."""
        from lora_training.export import read_references
        from voicehost.cloning.candidate import EVAL_SENTENCES, evaluate_candidate, record_verdict

        await self._started.wait()
        references = await asyncio.to_thread(read_references, folder)
        embedder = await asyncio.to_thread(shared_embedder, self.settings.speaker_embedder)
        s = self.settings
        report = await evaluate_candidate(
            self,
            folder,
            references,
            embedder,
            s,
            voice_id=voice_id,
            baselines=s.eval_baselines,
            sentences=EVAL_SENTENCES[: s.eval_sentences],
            samples_dir=folder / "samples",
        )
        status, reasons = await asyncio.to_thread(record_verdict, folder, report, s)
        manifest = await asyncio.to_thread(read_json_object, folder / MANIFEST)
        return Verdict(status, reasons, manifest["eval"])

    def change_dev_settings(self, changes: Mapping[str, object]) -> dict[str, object]:
        """Apply ``changes`` (names of ``RUNTIME_DEV_SETTINGS``) to a dev server's settings now:
        every runtime setting's value after. ``InvalidDevSettings`` off ``--dev``, for another
        name, or for a value its field refuses (nothing is changed then)."""
        if not self.settings.dev:
            raise InvalidDevSettings("settings change at run time only on a dev server (--dev)")
        if unknown := sorted(set(changes) - RUNTIME_DEV_SETTINGS):
            allowed = ", ".join(sorted(RUNTIME_DEV_SETTINGS))
            message = f"not a runtime setting: {', '.join(unknown)} (only {allowed})"
            raise InvalidDevSettings(message)
        s = self.settings
        try:
            checked = type(s).model_validate({**s.model_dump(), **changes})
            check_segments_fit(checked)
        except ValidationError as exc:
            raise InvalidDevSettings(validation_message(exc)) from exc
        except ValueError as exc:
            raise InvalidDevSettings(str(exc)) from exc
        for name in changes:
            setattr(s, name, getattr(checked, name))
        self.admission.realtime = Realtime.from_settings(self.meter, s, self.decode_cost)
        log.info("dev settings changed at run time: %s", dict(changes))
        return {name: getattr(s, name) for name in sorted(RUNTIME_DEV_SETTINGS)}

    @property
    def active_streams(self) -> int:
        return self.synthesizer.active if self.synthesizer else 0

    def load(self) -> WorkerLoad:
        """What a cluster worker reports with each heartbeat."""
        loaded = self.voices.loaded()
        capacity = self.settings.stream_capacity()
        streams = self.admission.streams()  # the host's
        return WorkerLoad(streams, loaded, capacity, self.admission.headroom())

    async def drain(self) -> None:
        """Stop taking new streams and leave the ring; streams in flight finish. A front end
        drains its whole host (the host's place on the ring is front end 0's): it tells the
        others over the host's channel, once they have drained, and leaves the host's drain
        flag for any not listening yet."""
        await self._drain_here()
        if self.frontend is None or self.channel is None:
            return
        self.frontend.drain_host()
        for frontend, answer in (await self.channel.ask_others(DRAIN_TOPIC, {})).items():
            if isinstance(answer, ChannelError):  # gone (the host is stopping) or silent
                log.info("front end %d not told of the drain: %s", frontend, answer)

    async def _drain_here(self) -> None:
        self.draining = True
        if self.frontend is not None:
            self.frontend.mark(False)
        if self.cluster is not None:
            await self.cluster.leave()

    async def _drained_by_host(self, body: Body) -> Body:
        """Another front end of the host was drained: this one drains too."""
        if not self.draining:
            log.info("another front end of this host was drained: draining")
        await self._drain_here()
        return {}

    @asynccontextmanager
    async def admit(self, principal: Principal | None) -> AsyncIterator[None]:
        """``principal``'s request admitted as one stream for the ``async with`` block, and
        counted against its key's quota too (for the whole cluster on a worker); ``Refused`` (503
        or 429) when it does not fit."""
        key = principal.key_id if principal else None
        own = principal.max_streams if principal else None  # the key's own quota, if it has one
        token = principal.token_streams if principal else None  # a token's own stream count
        limit = own or self.settings.key_max_streams
        with self.admission.admit(key, own, token):
            async with AsyncExitStack() as held:
                if self.cluster is not None and key is not None and limit:
                    await held.enter_async_context(self.cluster.key_stream(key, limit))
                if self.cluster is not None and token is not None:
                    lease = self.cluster.key_stream(token.admission_key, token.limit)
                    await held.enter_async_context(lease)
                yield

    async def drain_and_wait(self) -> None:
        """``drain``, then return once the last admitted stream has ended (SIGTERM)."""
        await self.drain()
        await self.admission.idle()

    async def open(self) -> None:
        """Open this front end's end of the host's channel (before it serves a request), then
        ``start``."""
        if self.channel is not None and self.frontend is not None:
            await self.channel.open()
            if self.frontend.host_draining():  # drained before this end listened
                await self._drain_here()
        self.start()

    def start(self) -> None:
        """Begin start-up in the background (call from the event loop)."""
        self._tasks.append(asyncio.create_task(self._start(), name="voicehost-startup"))
        if self.frontend is not None:  # the host says when the engine core it started died
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(CORE_LOST_SIGNAL, self._core_lost)
        if self.core_client is None or self.core_client.index == 0:  # one runner per host
            self._tasks.append(
                asyncio.create_task(self.jobs.run_forever(), name="voicehost-clone-jobs")
            )
            self._tasks.append(asyncio.create_task(self._watch_jobs(), name="voicehost-jobs-lost"))
        self._tasks.append(asyncio.create_task(self.usage.run_forever(), name="voicehost-usage"))
        self._tasks.append(asyncio.create_task(self._measure(), name="voicehost-rate-meter"))

    def _core_lost(self) -> None:
        log.error("the host's engine core has died: ending every stream")
        if self.engine is not None:
            self.engine.core_lost()

    async def _watch_jobs(self) -> None:
        """Show the jobs stuck under a lapsed lease on the metrics, every third of the lease
        (as often as an idle runner looks for them; a busy one does not look)."""
        while True:
            try:
                lost = await asyncio.to_thread(self.jobs.runners_lost)
                self.metrics.clone_jobs_runner_lost.set(lost)
            except OSError as exc:  # the store's hiccup: the next look
                log.warning("clone jobs not counted (%s)", exc)
            await asyncio.sleep(self.jobs.lease_seconds / 3)

    async def _measure(self) -> None:
        """Sample the engine's rate every interval, and show it (and the headroom it leaves) on
        the metrics."""
        gauge = self.metrics.request_tokens_per_second
        frontend = str(self.core_client.index if self.core_client is not None else 0)
        while True:
            await asyncio.sleep(self.meter.interval)
            self.meter.sample()
            gauge.clear()
            for batch, rate in self.meter.measured().items():
                gauge.labels(str(batch)).set(rate)
            self.metrics.realtime_headroom.set(self.admission.headroom())
            self.metrics.frontend_streams.labels(frontend).set(self.active_streams)
            self.metrics.refresh()

    async def _start(self) -> None:
        try:
            await self._load()
        except Exception as exc:  # the process stays up to report it on /readyz and /healthz
            self.startup_error = f"start-up failed: {type(exc).__name__}: {exc}"
            log.exception("start-up failed")
            return
        finally:
            self._started.set()
        if self.folder_voices is not None:
            interval = self.settings.adapter_scan_seconds
            self._tasks.append(asyncio.create_task(self.folder_voices.watch(interval)))
        if self.cluster is not None:  # join the ring once the engine is warm
            if self.settings.dev:
                await self._publish_dev_voices()
            if self.draining:  # drained while warming up: never join
                return
            ring = (
                self.core_client is None or self.core_client.index == 0
            )  # one ring member per host
            self._tasks.append(asyncio.create_task(self.cluster.join(self.load, ring)))

    async def _publish_dev_voices(self) -> None:
        """A dev worker registers the dev voices in the cluster, once."""
        for folder in sorted(DevModelPaths(self.settings.dev_dir).adapters.iterdir()):
            try:
                if not await self.voices.exists(folder.name):
                    await self.voices.add(folder.name, folder)
            except (VoiceExists, RedisError) as exc:
                log.info("dev voice %s not published: %s", folder.name, exc)
            except Exception:  # the worker serves on without it
                log.exception("dev voice %s not published", folder.name)

    async def _load(self) -> None:
        s = self.settings
        if s.dev:
            await asyncio.to_thread(ensure_dev_model, s.dev_dir)
        model = served_model(s)
        if await asyncio.to_thread(is_missing_folder, model):
            # said at once, not after vLLM's import and its search of a hub it cannot reach
            raise FileNotFoundError(f"the model folder {model} does not exist")
        self.voices.models.own = await asyncio.to_thread(adapter_rules, s, model)
        log.info("the model speaks %s (%s)", self.languages.describe(), self.languages.source)
        if self.folder_voices is not None:
            await asyncio.to_thread(self.folder_voices.scan)
        # The engine first, so that vLLM's workers start before this process touches CUDA.
        self._engine_start = asyncio.get_running_loop().run_in_executor(
            None, SpeechEngine.start, s, self.core_client
        )
        self.engine = await asyncio.shield(self._engine_start)
        self.metrics.watch_engine(self.engine.unfinished_requests)
        engine, board = self.engine, self.admission.board
        self.metrics.watch_loras(engine.max_loras, lambda: board.loras_in_use(engine.held_loras()))
        self.codec = await asyncio.to_thread(
            SnacCodec.load,
            served_codec(s),
            device=s.codec_device,
            noise=s.codec_noise,
            threads=s.codec_threads,
            cuda_graphs=s.codec_cuda_graphs,
        )
        if s.aligner_model is not None:
            self.aligner = await asyncio.to_thread(load_aligner, s.aligner_model)
        if graphs := await asyncio.to_thread(self.codec.capture_graphs):
            log.info("captured CUDA graphs of SNAC for %d call shapes", graphs)
        self.scheduler = DecodeScheduler(
            self.codec, s.codec_batch_window_ms, s.codec_max_batch, self.decode_cost.record
        )
        synthesizer = Synthesizer(
            self.engine,
            self.scheduler,
            self.metrics,
            s.lookahead_frames,
            s.codec_max_chunk_frames,
            self.meter,
        )
        warm_voice = next(iter(self.voices.builtin.values()), None)
        if warm_voice is None:
            warm_voice = (await self.voices.list_voices())[0][0]
        await synthesizer.warm_up(warm_voice)
        self.meter.forget()
        self.synthesizer = synthesizer
        if self.frontend is not None and not self.draining:
            self.frontend.mark(True)
        log.info("ready")

    async def close(self) -> None:
        if self.frontend is not None:
            self.frontend.mark(False)
        if self.channel is not None:
            await self.channel.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._engine_start is not None and self.engine is None:
            # Closed while vLLM was still starting: wait for it, so its processes are shut down.
            engine = await asyncio.gather(self._engine_start, return_exceptions=True)
            if isinstance(engine[0], SpeechEngine):
                self.engine = engine[0]
        if self.engine is not None:
            self.engine.shutdown()
        if self.scheduler is not None:
            await self.scheduler.close()
        if self.codec is not None:
            self.codec.close()
        self.encoding_pool.close()
        self.intake.close()
        if self.cluster is not None:
            await self.cluster.close()
