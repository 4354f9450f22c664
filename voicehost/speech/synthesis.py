"""The streaming pipeline: text -> prompt tokens -> engine -> audio tokens -> frames -> PCM."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from prometheus_client import Counter

from voicehost.audio.speech_start import speech_start, window_samples
from voicehost.metrics import SpeechMetrics
from voicehost.model import orpheus
from voicehost.model.codec import DecodeScheduler, FrameDecoder
from voicehost.model.engine import SpeechEngine
from voicehost.speech.alignment import Aligner, WordTiming
from voicehost.speech.capacity import RateMeter
from voicehost.text.segment import Segment
from voicehost.text.stage import SaidWords
from voicehost.voices.voice import Voice

log = logging.getLogger(__name__)


class FrameFeed:
    """The engine's token deltas as frames, read by a task of its own so that the listener's
    side wakes once per frame (not per token) and can also wake when held frames fall due.

    The reader assembles each delta as it comes (``FrameAssembler``) and counts its tokens;
    ``next`` hands over the frames read since the last call, waiting for one or for ``due``
    seconds. ``close`` cancels the reader, which aborts the engine request, and closes
    ``deltas``.
    """

    def __init__(
        self,
        deltas: AsyncIterator[list[int]],
        assembler: orpheus.FrameAssembler,
        meter: RateMeter,
    ) -> None:
        self.tokens = 0
        self.deliveries = 0  # the engine's outputs: one per token, or per stream interval
        self._meter = meter
        self._deltas = deltas
        self._assembler = assembler
        self._frames: list[orpheus.Frame] = []
        self._ended = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="frame-feed")

    async def _read(self) -> None:
        meter = self._meter
        meter.begin()
        try:
            async for delta in self._deltas:
                self.deliveries += 1
                self.tokens += len(delta)
                meter.tokens += len(delta)
                if frames := self._assembler.push(delta):
                    self._frames += frames
                    self._wake()
        except Exception as exc:  # raised to the listener after the frames before it
            self._error = exc
        finally:
            meter.end()
            self._ended = True
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, due: float | None) -> list[orpheus.Frame] | None:
        """The frames read since the last call, once there is one; ``[]`` if ``due`` seconds
        (``None``: no limit) pass first; ``None`` once the engine is done and all were taken.
        Raises the engine's error after the frames it sent before it."""
        if not self._frames and not self._ended:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = None if due is None else loop.call_later(due, self._wake)
            try:
                await self._waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self._frames:
            frames, self._frames = self._frames, []
            return frames
        if self._error is not None:
            raise self._error
        return None if self._ended else []

    async def close(self) -> None:
        self._reader.cancel()
        with suppress(asyncio.CancelledError):
            await self._reader
        if isinstance(self._deltas, AsyncGenerator):
            await self._deltas.aclose()


@dataclass
class Continuity:
    """What the next segment's prompt carries of the previous one, so a long text keeps one
    voice and pace: the previous segment's last ``max_frames`` frames and (about) the words
    spoken in them. ``max_frames`` 0: nothing."""

    max_frames: int
    text: str = ""
    frames: list[orpheus.Frame] = field(default_factory=list)

    def context(self) -> tuple[str, list[orpheus.Frame]] | None:
        return (self.text, self.frames) if self.max_frames and self.frames else None

    def remember(self, text: str, frames: list[orpheus.Frame]) -> None:
        kept = frames[-self.max_frames :] if self.max_frames else []
        if kept and len(kept) < len(frames):
            # the same share of the text as of the frames, from the start of a word
            cut = len(text) - len(text) * len(kept) // len(frames)
            space = text.find(" ", cut)
            text = text[space + 1 :] if space >= 0 else text[cut:]
        self.text, self.frames = text.strip(), kept


class LeadingSilenceTrim:
    """Drops the near-silent audio at the very start of a stream: everything before the 10 ms
    window ahead of the first one louder than ``threshold_db`` (``voicehost.audio.speech_start``;
    windows counted from each chunk's start), and never more than ``max_seconds``."""

    WINDOW = window_samples(orpheus.SAMPLE_RATE)

    def __init__(self, threshold_db: float, max_seconds: float = 1.0) -> None:
        self.threshold_db = threshold_db
        self.budget = int(max_seconds * orpheus.SAMPLE_RATE)
        self.dropped = 0  # samples
        self.done = False

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        """The part of ``pcm`` to play (empty while the stream is still silent)."""
        if self.done or not pcm.size:
            return pcm
        room = self.budget - self.dropped
        loud = speech_start(pcm[:room], self.threshold_db)
        if loud is not None:
            cut = max(0, loud - self.WINDOW)
        elif pcm.size >= room:
            cut = room  # a second of silence: trim no further
        else:
            self.dropped += pcm.size
            return pcm[:0]
        self.dropped += cut
        self.done = True
        return pcm[cut:]


class PlaybackClock:
    """A stream's playback as its listener hears it, kept on the server: the audio plays from
    its first chunk on, in real time. A chunk sent after all the audio before it has played is an
    underrun (the listener heard a gap: a stutter): it is counted, and playback starts again from
    it. A segment whose text came after the audio before it had played out starts afresh:
    waiting for the next words is not a stutter."""

    def __init__(
        self, counter: Counter | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.counter = counter
        self.clock = clock
        self.started: float | None = None
        self.samples = 0  # played since ``started``
        self.underruns = 0

    def played_out(self) -> float:
        """When the audio sent so far has all played."""
        if self.started is None:
            return -math.inf
        return self.started + self.samples / orpheus.SAMPLE_RATE

    def segment(self, arrived: float) -> None:
        """A segment starts whose text arrived at ``arrived``."""
        if arrived >= self.played_out():
            self.started = None

    def play(self, samples: int) -> None:
        """``samples`` (24 kHz) are sent to the listener now."""
        now = self.clock()
        if self.started is not None and now > self.played_out():
            self.underruns += 1
            if self.counter is not None:
                self.counter.inc()
            self.started = None
        if self.started is None:
            self.started, self.samples = now, 0
        self.samples += samples


@dataclass(frozen=True, slots=True)
class SpeakOptions:
    """How a text of one or more segments is spoken."""

    seed: int | None = None
    continuity_frames: int = 0
    prefetch: int = 1  # segments generated at once when continuity is off
    trim_db: float | None = None  # drop leading silence quieter than this (None: keep it)
    aligner: Aligner | None = None  # word timing: ``SpokenWord`` events (None: none)
    # what a timed word is said as (``TextStage.say``); None: as written
    say: Callable[[str], str] | None = None


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    index: int
    segment: Segment


@dataclass(frozen=True, slots=True)
class SegmentDone:
    index: int
    segment: Segment
    samples: int


@dataclass(frozen=True, slots=True)
class SpokenWord:
    """A word of a segment, once its timing is final: its span in the whole input (the
    segment's offsets added) and its start and end in seconds of the stream's audio (the
    model's clock: before ``speed``). Comes after the chunk its audio ends in, or with the
    segment's end; produced by ``aligner``."""

    index: int
    text: str
    start: int
    end: int
    audio_start: float
    audio_end: float
    aligner: str
    said: str = ""  # what it was said as: its numbers and lexicon words as the engine had them

    @classmethod
    def of(
        cls,
        index: int,
        segment: Segment,
        offset: float,
        aligner: str,
        said: SaidWords | None,
        word: WordTiming,
    ) -> SpokenWord:
        """``word`` of segment ``index``, whose audio starts ``offset`` s into the stream."""
        return cls(
            index,
            word.text,
            segment.start + word.start,
            segment.start + word.end,
            offset + word.audio_start,
            offset + word.audio_end,
            aligner,
            said.of(word.start, word.end) if said is not None else word.text,
        )


def said_words(options: SpeakOptions, segment: Segment) -> SaidWords | None:
    """What the words of ``segment`` are said as, where its words are timed."""
    if options.aligner is None or options.say is None or not segment.text:
        return None
    return SaidWords(options.say, segment.text)


async def call_now(step: Callable[[Any], list[WordTiming]], samples: Any) -> list[WordTiming]:
    """``step(samples)``, here (an aligner's step cheap enough for the event loop)."""
    return step(samples)


SpeechEvent = SegmentStarted | np.ndarray | SpokenWord | SegmentDone
# Where a segment's audio comes from: a producer's queue, or (text, seed) to stream directly.
Source = asyncio.Queue[Any] | tuple[str, int | None]


class Synthesizer:
    """Turns (text, voice) into a stream of 24 kHz float PCM chunks, as the engine generates."""

    def __init__(
        self,
        engine: SpeechEngine,
        scheduler: DecodeScheduler,
        metrics: SpeechMetrics,
        lookahead: int,
        max_chunk: int,
        meter: RateMeter | None = None,
    ) -> None:
        self.engine = engine
        self.meter = meter or RateMeter()  # what admission measures the engine's rate by
        self.scheduler = scheduler
        self.metrics = metrics
        self.lookahead = lookahead
        self.max_chunk = max_chunk
        self.active = 0  # streams in progress, reported to the cluster as this worker's load

    async def speak_segments(
        self, segments: AsyncIterator[Segment], voice: Voice, options: SpeakOptions
    ) -> AsyncIterator[SpeechEvent]:
        """Speak segments in order as one stream: for each, ``SegmentStarted``, its PCM chunks,
        ``SegmentDone``. Segments with nothing to say (no letter, digit or tag) are skipped.
        Closing the iterator aborts the engine requests in progress.

        The stream's time to first audio is observed once: from its first segment's arrival to
        its first samples the listener gets (after any trim). A later segment's start is no
        listener's wait, and a stream abandoned early adds nothing to the histogram later."""
        trim = LeadingSilenceTrim(options.trim_db) if options.trim_db is not None else None
        playback = PlaybackClock(self.metrics.underruns)
        began: float | None = None  # the first segment's arrival, until its first audio
        stream_samples = 0  # of the stream so far, for word timing
        async with aclosing(self._generated(segments, voice, options)) as generated:
            async for index, segment, arrived, chunks in generated:
                if index == 0:
                    began = arrived
                self.metrics.segments.inc()
                playback.segment(arrived)
                yield SegmentStarted(index, segment)
                samples = 0
                aligner = options.aligner
                alignment = (
                    aligner.begin(segment.text, voice.language) if aligner is not None else None
                )
                threaded = aligner is not None and aligner.threaded  # a model's: off the loop
                aligned = asyncio.to_thread if threaded else call_now
                placed = partial(
                    SpokenWord.of,
                    index,
                    segment,
                    stream_samples / orpheus.SAMPLE_RATE,  # where this segment's audio starts
                    aligner.name if aligner is not None else "",
                    said_words(options, segment),
                )
                async for pcm in chunks:
                    if trim is not None and not trim.done:
                        pcm = trim(pcm)
                        if trim.done:
                            self.metrics.trimmed_seconds.inc(trim.dropped / orpheus.SAMPLE_RATE)
                    if pcm.size:
                        if began is not None:
                            self.metrics.time_to_first_audio.observe(time.monotonic() - began)
                            began = None
                        samples += pcm.size
                        stream_samples += pcm.size
                        playback.play(pcm.size)
                        yield pcm
                        if alignment is not None:
                            for word in await aligned(alignment.feed, pcm):
                                yield placed(word)
                if alignment is not None:
                    for word in await aligned(alignment.finish, None):
                        yield placed(word)
                yield SegmentDone(index, segment, samples)

    async def _generated(
        self, segments: AsyncIterator[Segment], voice: Voice, options: SpeakOptions
    ) -> AsyncIterator[tuple[int, Segment, float, AsyncIterator[np.ndarray]]]:
        """The segments to speak, in order, each with when its text arrived and its PCM as it
        is generated.

        Up to ``options.prefetch`` segments are generated at once (batched by the engine) and
        held until played; with continuity one at a time, as each prompt needs the frames of
        the segment before. A segment that nothing runs ahead of (the first, or every one when
        one is generated at a time) is streamed straight through, with no task between the
        engine and the listener.
        """
        continuity = Continuity(options.continuity_frames)
        at_once = 1 if options.continuity_frames else max(1, options.prefetch)
        ahead = asyncio.Semaphore(at_once)  # segments generating or waiting to be played
        order: asyncio.Queue[tuple[int, Segment, float, Source] | BaseException | None]
        order = asyncio.Queue()
        producers: list[asyncio.Task[None]] = []

        async def produce(text: str, seed: int | None, out: asyncio.Queue[Any]) -> None:
            try:
                async with aclosing(self.stream(text, voice, seed, continuity)) as chunks:
                    async for pcm in chunks:
                        out.put_nowait(pcm)
                out.put_nowait(None)
            except Exception as exc:
                out.put_nowait(exc)

        async def sources() -> AsyncIterator[tuple[int, Segment, float, Source]]:
            index = 0
            async for segment in segments:
                arrived = time.monotonic()
                text = segment.speech  # the text stage's last word (``voicehost.text.stage``)
                if not any(ch.isalnum() for ch in text):
                    continue
                await ahead.acquire()  # released once the segment has been played
                seed = None if options.seed is None else options.seed + index
                source: Source = (text, seed)
                if index and at_once > 1:  # generated ahead, while the one before plays
                    source = asyncio.Queue()
                    producers.append(asyncio.create_task(produce(text, seed, source)))
                yield index, segment, arrived, source
                index += 1

        async def feed(rest: AsyncIterator[tuple[int, Segment, float, Source]]) -> None:
            try:
                async for item in rest:
                    order.put_nowait(item)
                order.put_nowait(None)
            except Exception as exc:
                order.put_nowait(exc)

        async def played(out: asyncio.Queue[Any]) -> AsyncIterator[np.ndarray]:
            while (item := await out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item

        # The first segment is read in this task, not the feeder's: a request reaches the
        # engine without waiting its turn behind every other request's work on the loop.
        pending = sources()
        feeder: asyncio.Task[None] | None = None
        try:
            if (first := await anext(pending, None)) is None:
                return
            order.put_nowait(first)
            feeder = asyncio.create_task(feed(pending), name="segment-feeder")
            while (item := await order.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                index, segment, arrived, source = item
                if isinstance(source, asyncio.Queue):
                    yield index, segment, arrived, played(source)
                else:
                    text, seed = source
                    async with aclosing(self.stream(text, voice, seed, continuity)) as chunks:
                        yield index, segment, arrived, chunks
                ahead.release()
        finally:
            tasks = [t for t in (feeder, *producers) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pending.aclose()

    async def stream(
        self,
        text: str,
        voice: Voice,
        seed: int | None = None,
        continuity: Continuity | None = None,
    ) -> AsyncIterator[np.ndarray]:
        """Yield PCM chunks in order; closing the iterator aborts the engine request.

        ``continuity``: the prompt carries its context, and it remembers this text's frames
        once the stream has ended.
        """
        started = time.monotonic()
        prompt = self.engine.prompt(text, voice, continuity.context() if continuity else None)
        options = self.engine.sampling(text, seed, len(prompt))
        deltas = self.engine.audio_tokens(prompt, voice, options)
        frames: list[orpheus.Frame] | None = [] if continuity is not None else None
        async with aclosing(self.play(deltas, started, frames)) as chunks:
            async for pcm in chunks:
                yield pcm
        if continuity is not None and frames is not None:
            continuity.remember(text, frames)

    async def play(
        self,
        deltas: AsyncIterator[list[int]],
        started: float,
        keep: list[orpheus.Frame] | None = None,
    ) -> AsyncIterator[np.ndarray]:
        """Audio token deltas -> frames (appended to ``keep``) -> PCM chunks, in order; closing
        the iterator closes ``deltas``. While the engine is quiet, frames held for a bigger
        window are decoded before the listener's lead runs out."""
        assembler = orpheus.FrameAssembler()
        decoder = FrameDecoder(self.scheduler, self.lookahead, self.max_chunk)
        counted = delivered = 0  # already in the metrics: updated per frame batch, not per token
        self.metrics.active_streams.inc()
        self.active += 1
        feed = FrameFeed(deltas, assembler, self.meter)
        try:
            while (frames := await feed.next(decoder.due_in())) is not None:
                if frames:
                    self.metrics.audio_tokens.inc(feed.tokens - counted)
                    self.metrics.engine_outputs.inc(feed.deliveries - delivered)
                    counted, delivered = feed.tokens, feed.deliveries
                    if keep is not None:
                        keep.extend(frames)
                    pcm = await decoder.push(frames)
                else:  # held frames fell due while the engine said nothing
                    pcm = await decoder.flush()
                    self.metrics.stall_flushes.inc()
                if pcm.size:
                    yield pcm
            if feed.tokens > counted:
                self.metrics.audio_tokens.inc(feed.tokens - counted)
            self.metrics.engine_outputs.inc(feed.deliveries - delivered)
            pcm = await decoder.finish()
            if pcm.size:
                yield pcm
            self._record(started, feed.tokens, assembler)
        finally:
            await feed.close()
            decoder.close()
            self.metrics.active_streams.dec()
            self.active -= 1

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
