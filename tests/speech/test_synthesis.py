"""The pipeline from audio token deltas to PCM: pacing while the engine is quiet."""

import asyncio
import time

import pytest
from helpers import random_frames

from voicehost.metrics import SpeechMetrics
from voicehost.model import orpheus
from voicehost.model.codec import DecodeScheduler
from voicehost.speech.synthesis import Synthesizer

pytestmark = pytest.mark.unit


async def stalling_engine(frames, stall_after: int, stall_seconds: float, speed: float):
    """Token deltas of ``frames`` generated ``speed`` x faster than real time, one frame per
    delta, with the engine silent for ``stall_seconds`` after frame ``stall_after``."""
    for index, frame in enumerate(frames):
        await asyncio.sleep(orpheus.FRAME_SECONDS / speed)
        if index == stall_after:
            await asyncio.sleep(stall_seconds)
        yield frame.tokens()


@pytest.mark.paced
def test_frames_held_for_a_bigger_window_play_before_the_listener_runs_dry_in_a_stall(codec):
    """Generated at 3x, then the engine stalls for 3 s: every decodable frame is handed out
    while the listener still has audio queued, and the rest of the stream plays after."""
    frames = random_frames(36, seed=21)
    stall_after = 30

    async def run():
        synthesizer = Synthesizer(None, DecodeScheduler(codec), SpeechMetrics(), 2, 16)
        started = time.monotonic()
        first_audio, handed_out, chunks = None, 0.0, []
        deltas = stalling_engine(frames, stall_after, stall_seconds=3.0, speed=3.0)
        async for pcm in synthesizer.play(deltas, started):
            now = time.monotonic()
            first_audio = first_audio or now
            lead = handed_out - (now - first_audio)  # audio still queued when this chunk came
            chunks.append((now - started, lead, pcm.size // orpheus.SAMPLES_PER_FRAME))
            handed_out += pcm.size / orpheus.SAMPLE_RATE
        return synthesizer, chunks

    synthesizer, chunks = asyncio.run(run())
    assert sum(size for _, _, size in chunks) == 36
    stall_ends = (stall_after + 1) * orpheus.FRAME_SECONDS / 3.0 + 3.0
    before_end = [(lead, size) for at, lead, size in chunks if at < stall_ends]
    # 30 frames came before the stall, 28 of them with their right context: all played
    # before the stall ended, each chunk while the listener still had audio queued
    assert sum(size for _, size in before_end) == stall_after - 2
    assert all(lead > 0 for lead, _ in before_end[1:])
    assert synthesizer.metrics.stall_flushes._value.get() >= 1


def test_closing_a_stream_closes_the_engine_stream_and_tokens_are_all_counted(codec):
    """The frame reader is a task of its own: closing the listener's iterator after its first
    chunk still closes the engine's stream (which aborts the request), and a stream played to
    the end counts every token it read in the metric, updated per frame batch."""
    frames = random_frames(12, seed=5)
    closed: list[str] = []

    async def engine(count: int):
        try:
            for frame in frames[:count]:
                tokens = frame.tokens()
                yield tokens[:3]  # deltas that split frames
                await asyncio.sleep(0)
                yield tokens[3:]
            yield [orpheus.END_OF_SPEECH]
        finally:
            closed.append("closed")

    async def run():
        closing = Synthesizer(None, DecodeScheduler(codec), SpeechMetrics(), 2, 16)
        chunks = closing.play(engine(12), time.monotonic())
        first = await anext(chunks)
        await chunks.aclose()
        synthesizer = Synthesizer(None, DecodeScheduler(codec), SpeechMetrics(), 2, 16)
        whole = [pcm async for pcm in synthesizer.play(engine(12), time.monotonic())]
        return first, whole, synthesizer.metrics.audio_tokens._value.get()

    first, whole, tokens = asyncio.run(run())
    assert first.size == orpheus.SAMPLES_PER_FRAME
    assert closed == ["closed", "closed"]
    assert sum(pcm.size for pcm in whole) == 12 * orpheus.SAMPLES_PER_FRAME
    assert tokens == 12 * orpheus.TOKENS_PER_FRAME + 1  # the stop token included


def test_deltas_of_a_stream_interval_give_first_audio_from_exactly_three_frames(codec):
    """vLLM with ``stream_interval`` 7 hands over a request's first token at once, then 7 at a
    time: 1, 8, 15, 22 ... so the third frame (token 21) comes with the delivery of token 22,
    one engine step after it would alone. The first audio is the same: frame 0, decoded with
    its two frames of lookahead; the tokens per output are counted."""
    frames = random_frames(12, seed=9)
    tokens = [t for frame in frames for t in frame.tokens()] + [orpheus.END_OF_SPEECH]

    async def engine(interval: int):
        sent = 0
        for size in [1, *[interval] * len(tokens)]:
            if sent >= len(tokens):
                return
            yield tokens[sent : sent + size]
            sent += size
            await asyncio.sleep(0)

    async def first_chunk(interval: int):
        synthesizer = Synthesizer(None, DecodeScheduler(codec), SpeechMetrics(), 2, 16)
        chunks = synthesizer.play(engine(interval), time.monotonic())
        first = await anext(chunks)
        rest = [pcm async for pcm in chunks]
        metrics = synthesizer.metrics
        ratio = metrics.audio_tokens._value.get() / metrics.engine_outputs._value.get()
        return first, sum(p.size for p in [first, *rest]), ratio

    one = asyncio.run(first_chunk(1))
    seven = asyncio.run(first_chunk(7))
    assert one[0].size == seven[0].size == orpheus.SAMPLES_PER_FRAME
    assert (one[0] == seven[0]).all()  # the same first audio, from the same three frames
    assert one[1] == seven[1] == 12 * orpheus.SAMPLES_PER_FRAME
    assert one[2] == 1.0 and seven[2] == pytest.approx(85 / 13)  # 1 + 12 outputs of 7


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_playback_clock_counts_audio_sent_after_the_audio_before_it_has_played():
    from prometheus_client import CollectorRegistry, Counter

    from voicehost.speech.synthesis import PlaybackClock

    counter = Counter("underruns", "test", registry=CollectorRegistry())
    clock = Clock()
    playback = PlaybackClock(counter, clock)
    second = orpheus.SAMPLE_RATE
    playback.segment(clock.now)
    playback.play(second)  # plays from now for 1 s
    clock.now += 0.9
    playback.play(second)  # in time: 1.1 s of audio left to play
    clock.now += 1.5
    playback.play(second)  # 0.4 s late: the listener heard a gap
    assert playback.underruns == 1 and counter._value.get() == 1
    clock.now += 0.5
    playback.play(second)  # playback started again from the late chunk: in time
    assert playback.underruns == 1
    # text that came after the audio before it had played out: waiting for words, no stutter
    clock.now += 5
    playback.segment(clock.now)
    playback.play(second)
    assert playback.underruns == 1
    # the next segment's text was there all along: its late first chunk is a stutter
    arrived = clock.now
    clock.now += 3
    playback.segment(arrived)
    playback.play(second)
    assert playback.underruns == 2 and counter._value.get() == 2
