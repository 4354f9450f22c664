"""The streaming pipeline: text -> prompt tokens -> engine -> audio tokens -> frames -> PCM."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import numpy as np

from voicehost import orpheus
from voicehost.codec import DecodeScheduler, FrameDecoder
from voicehost.engine import SpeechEngine
from voicehost.metrics import SpeechMetrics
from voicehost.voices import Voice

log = logging.getLogger(__name__)


class Synthesizer:
    """Turns (text, voice) into a stream of 24 kHz float PCM chunks, as the engine generates."""

    def __init__(
        self,
        engine: SpeechEngine,
        scheduler: DecodeScheduler,
        metrics: SpeechMetrics,
        lookahead: int,
        max_chunk: int,
    ) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.metrics = metrics
        self.lookahead = lookahead
        self.max_chunk = max_chunk
        self.active = 0  # streams in progress, reported to the cluster as this worker's load

    async def stream(
        self, text: str, voice: Voice, seed: int | None = None
    ) -> AsyncIterator[np.ndarray]:
        """Yield PCM chunks in order; closing the iterator aborts the engine request."""
        started = time.monotonic()
        prompt = self.engine.prompt(text, voice)
        options = self.engine.sampling(text, seed, len(prompt))
        assembler = orpheus.FrameAssembler()
        decoder = FrameDecoder(self.scheduler, self.lookahead, self.max_chunk)
        first_audio: float | None = None
        tokens = 0
        self.metrics.active_streams.inc()
        self.active += 1
        try:
            async with aclosing(self.engine.audio_tokens(prompt, voice, options)) as deltas:
                async for delta in deltas:
                    tokens += len(delta)
                    self.metrics.audio_tokens.inc(len(delta))
                    frames = assembler.push(delta)
                    if not frames:
                        continue
                    pcm = await decoder.push(frames)
                    if pcm.size:
                        first_audio = first_audio or self._first_audio(started)
                        yield pcm
            pcm = await decoder.finish()
            if pcm.size:
                first_audio = first_audio or self._first_audio(started)
                yield pcm
            self._record(started, tokens, assembler)
        finally:
            decoder.close()
            self.metrics.active_streams.dec()
            self.active -= 1

    def _first_audio(self, started: float) -> float:
        """Record the time to the first audio (a stream shorter than the lookahead has its
        first audio at the end)."""
        seconds = time.monotonic() - started
        self.metrics.time_to_first_audio.observe(seconds)
        return seconds

    def _record(self, started: float, tokens: int, assembler: orpheus.FrameAssembler) -> None:
        elapsed = time.monotonic() - started
        audio_seconds = assembler.frames * orpheus.FRAME_SECONDS
        if audio_seconds:
            self.metrics.real_time_factor.observe(elapsed / audio_seconds)
            self.metrics.audio_seconds.inc(audio_seconds)
        if elapsed:
            self.metrics.tokens_per_second.set(tokens / elapsed)
        if assembler.malformed_frames or assembler.stray_tokens:
            self.metrics.errors.labels("malformed_frame").inc(assembler.malformed_frames)
            self.metrics.errors.labels("stray_token").inc(assembler.stray_tokens)
            log.warning(
                "dropped %d malformed frames and %d stray tokens",
                assembler.malformed_frames,
                assembler.stray_tokens,
            )

    async def warm_up(self, voice: Voice) -> int:
        """Synthesize one short sentence to completion; returns the samples produced."""
        samples = 0
        async for pcm in self.stream("Warming up.", voice, seed=0):
            samples += pcm.size
        return samples
