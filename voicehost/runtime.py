"""The long-lived parts of one serving process and their start-up order.

Start-up runs in the background so the HTTP server answers ``/healthz`` and ``/readyz`` (503)
while the dev model is built, SNAC and vLLM load, and one warm-up request runs.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from voicehost.cloning import CloneJobs
from voicehost.codec import SnacCodec
from voicehost.config import Settings
from voicehost.devmodel import ensure_dev_model
from voicehost.engine import SpeechEngine
from voicehost.metrics import SpeechMetrics
from voicehost.synthesis import Synthesizer
from voicehost.voices import AdapterRules, ModelShape, VoiceRegistry

log = logging.getLogger(__name__)


class NotReady(RuntimeError):
    """The engine is still starting (or failed to start)."""


class Runtime:
    """Engine, codec, voice registry and metrics of one process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = SpeechMetrics()
        self.registry = VoiceRegistry(
            settings.adapter_roots(), settings.builtin_voices, self._rules()
        )
        self.engine: SpeechEngine | None = None
        self.codec: SnacCodec | None = None
        self.synthesizer: Synthesizer | None = None
        self.jobs = CloneJobs(settings.jobs_dir, on_voice_ready=self.registry.discover)
        self.startup_error: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._engine_start: asyncio.Future[SpeechEngine] | None = None

    def _rules(self, shape: ModelShape | None = None) -> AdapterRules:
        return AdapterRules(self.settings.served_base_name(), self.settings.max_lora_rank, shape)

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
        if self.synthesizer is None:
            raise NotReady("the engine is warming up")
        return self.synthesizer

    def start(self) -> None:
        """Begin start-up in the background (call from the event loop)."""
        self._tasks.append(asyncio.create_task(self._start(), name="voicehost-startup"))
        self._tasks.append(
            asyncio.create_task(self.jobs.run_forever(), name="voicehost-clone-jobs")
        )

    async def _start(self) -> None:
        try:
            await self._load()
        except Exception as exc:  # the process stays up to report it on /readyz and /healthz
            self.startup_error = f"start-up failed: {type(exc).__name__}: {exc}"
            log.exception("start-up failed")
            return
        self._tasks.append(
            asyncio.create_task(self.registry.watch(self.settings.adapter_scan_seconds))
        )

    async def _load(self) -> None:
        s = self.settings
        if s.dev:
            await asyncio.to_thread(ensure_dev_model, s.dev_dir)
        config = Path(s.served_model()) / "config.json"
        if config.is_file():
            self.registry.rules = self._rules(ModelShape.from_config(config))
        await asyncio.to_thread(self.registry.scan)
        # The engine first, so that vLLM's workers start before this process touches CUDA.
        self._engine_start = asyncio.get_running_loop().run_in_executor(None, SpeechEngine.start, s)
        self.engine = await asyncio.shield(self._engine_start)
        self.metrics.watch_engine(self.engine.unfinished_requests)
        self.codec = await asyncio.to_thread(
            SnacCodec.load, s.served_codec(), device=s.codec_device, noise=s.codec_noise
        )
        synthesizer = Synthesizer(self.engine, self.codec, self.metrics, s.lookahead_frames)
        warm_voice = next(iter(self.registry.builtin.values()), None) or self.registry.voices()[0]
        await synthesizer.warm_up(warm_voice)
        self.synthesizer = synthesizer
        log.info("ready: %d voices", len(self.registry.voices()))

    async def close(self) -> None:
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
        if self.codec is not None:
            self.codec.close()
