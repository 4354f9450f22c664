"""Streaming SNAC decoding: exact against a one-shot decode, every frame played once, in order;
windows of concurrent streams batched into one SNAC call; chunks that grow with the lead."""

import asyncio
import random
import threading
import time

import numpy as np
import pytest
from helpers import random_frames

from voicehost.model import orpheus
from voicehost.model.codec import (
    GRAPH_CALL_FRAMES,
    DecodeScheduler,
    FrameDecoder,
    SnacCodec,
    Span,
    is_graph_shape,
    padded_shape,
)

pytestmark = pytest.mark.unit


def stream(codec, frames, lookahead, chunk_sizes, max_chunk=1):
    """Push ``frames`` in chunks; returns the audio and after how many frames it first came."""

    async def run():
        decoder = FrameDecoder(DecodeScheduler(codec), lookahead, max_chunk)
        pieces, first, i = [], None, 0
        sizes = iter(chunk_sizes)
        while i < len(frames):
            n = next(sizes)
            pcm = await decoder.push(frames[i : i + n])
            i += n
            if pcm.size and first is None:
                first = i
            pieces.append(pcm)
        pieces.append(await decoder.finish())
        return np.concatenate(pieces), first

    return asyncio.run(run())


@pytest.mark.parametrize("chunking", ["one", "random", "all"])
def test_lookahead_two_equals_a_one_shot_decode(codec, chunking):
    frames = random_frames(24, seed=3)
    reference = codec.decode(frames)
    rng = random.Random(9)
    sizes = {
        "one": [1] * 100,
        "random": [rng.choice([1, 2, 3, 5, 8]) for _ in range(100)],
        "all": [len(frames)],
    }[chunking]
    audio, _ = stream(codec, frames, 2, sizes, max_chunk=16)
    assert audio.shape == reference.shape == (24 * orpheus.SAMPLES_PER_FRAME,)
    assert np.abs(audio - reference).max() < 1e-3
    assert np.abs(reference).max() > 0.01  # the codec really made sound


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_first_audio_after_one_plus_lookahead_frames_starting_with_frame_zero(codec, lookahead):
    frames = random_frames(10, seed=5)
    audio, first = stream(codec, frames, lookahead, [1] * 10)
    assert first == 1 + lookahead
    assert audio.size == 10 * orpheus.SAMPLES_PER_FRAME
    # frame 0 comes first: the first samples are frame 0 of the frames seen by then
    head = codec.decode(frames[: 1 + lookahead])[: orpheus.SAMPLES_PER_FRAME]
    assert np.abs(audio[: orpheus.SAMPLES_PER_FRAME] - head).max() < 1e-4


def test_lookahead_two_is_closer_than_smaller_lookaheads(codec):
    frames = random_frames(16, seed=7)
    reference = codec.decode(frames)
    errors = [np.abs(stream(codec, frames, la, [1] * 16)[0] - reference).max() for la in (0, 1, 2)]
    assert errors[2] < errors[1] < errors[0]


def test_a_stream_shorter_than_the_lookahead_still_plays_every_frame(codec):
    frames = random_frames(2, seed=1)
    audio, first = stream(codec, frames, 2, [1, 1])
    assert first is None  # nothing before the end
    assert np.abs(audio - codec.decode(frames)).max() < 1e-3


def test_lookahead_outside_zero_to_two_is_refused(codec):
    with pytest.raises(ValueError):
        FrameDecoder(DecodeScheduler(codec), 3)


def test_encode_then_decode_keeps_the_length(codec):
    audio = np.sin(np.linspace(0, 440 * 2 * np.pi, 24000)).astype(np.float32) * 0.3
    frames = codec.encode(audio)
    assert len(frames) == int(np.ceil(24000 / 2048))
    assert codec.decode(frames).size == len(frames) * orpheus.SAMPLES_PER_FRAME


def test_spans_of_different_lengths_share_calls_and_equal_their_decodes_alone(codec):
    spans = [
        Span(tuple(random_frames(21, seed=1)), 3, 19),  # mid-stream: pad after
        Span(tuple(random_frames(6, seed=2)), 3, 4),  # one new frame: pad after
        Span(tuple(random_frames(5, seed=3)), 0, 3),  # a stream's first window: pad after
        Span(tuple(random_frames(9, seed=4)), 3, 9),  # a stream's last window: pad before
        Span(tuple(random_frames(4, seed=5)), 0, 4),  # a whole short stream: no padding,
        Span(tuple(random_frames(4, seed=6)), 0, 4),  # so only with its own length
    ]
    roomy = SnacCodec(codec.model, codec.device, max_call_frames=96)
    batched = roomy.decode_batch(spans)
    assert roomy.calls == 2  # 4 paddable spans padded to 21 frames (84), the two of 4 frames
    spf = orpheus.SAMPLES_PER_FRAME
    for span, audio in zip(spans, batched, strict=True):
        alone = codec.decode(span.frames)[span.keep_start * spf : span.keep_stop * spf]
        assert audio.shape == alone.shape == ((span.keep_stop - span.keep_start) * spf,)
        assert np.abs(audio - alone).max() < 1e-3


def test_calls_padded_to_bucket_shapes_equal_their_decodes_alone(codec):
    """The padding a GPU's CUDA graphs need (rows and frames up to fixed buckets) changes no
    kept sample; a call that cannot be padded keeps its own shape."""
    spans = [
        Span(tuple(random_frames(11, seed=31)), 3, 9),  # padded after, to 12 frames
        Span(tuple(random_frames(7, seed=32)), 3, 7),  # padded before
        Span(tuple(random_frames(6, seed=33)), 0, 4),  # a first window
    ]
    bucketed = SnacCodec(codec.model, codec.device, max_call_frames=96, buckets=True)
    shapes = []
    decode = bucketed.model.decode
    bucketed.model.decode = lambda codes: shapes.append(tuple(codes[0].shape)) or decode(codes)
    try:
        batched = bucketed.decode_batch(spans)
        lone = Span(tuple(random_frames(5, seed=34)), 0, 5)  # no side to pad: as it is
        assert bucketed.decode_batch([lone])[0].size == 5 * orpheus.SAMPLES_PER_FRAME
    finally:
        del bucketed.model.decode
    assert shapes == [(4, 12), (1, 5)]  # 3 rows -> 4, 11 frames -> 12
    spf = orpheus.SAMPLES_PER_FRAME
    for span, audio in zip(spans, batched, strict=True):
        alone = codec.decode(span.frames)[span.keep_start * spf : span.keep_stop * spf]
        assert audio.shape == alone.shape
        assert np.abs(audio - alone).max() < 1e-3


def test_only_calls_small_enough_for_graphs_are_padded():
    """Padding pays only where a call is bound by kernel launches (a CUDA graph removes them);
    a bigger call is bound by arithmetic and keeps its own shape."""
    assert padded_shape(3, 11) == (4, 12)
    assert padded_shape(1, 6) == (1, 8)
    assert padded_shape(8, 21) == (8, 24)  # 192 padded frames
    assert padded_shape(16, 21) == (16, 21)  # 16 x 24 would be 384 > GRAPH_CALL_FRAMES
    assert padded_shape(37, 6) == (37, 6)
    assert padded_shape(2, 40) == (2, 40)  # longer than every frame bucket
    assert padded_shape(300, 4) == (300, 4)
    for rows, frames in [(r, f) for r in range(1, 70) for f in range(1, 40)]:
        padded = padded_shape(rows, frames)
        assert padded[0] >= rows and padded[1] >= frames
        assert padded == (rows, frames) or is_graph_shape(*padded)
        assert padded[0] * padded[1] <= max(GRAPH_CALL_FRAMES, rows * frames)


def test_capture_graphs_is_a_no_op_off_a_gpu(codec):
    assert SnacCodec(codec.model, codec.device, buckets=True).capture_graphs() == 0


def test_concurrent_streams_share_batches_and_each_equals_its_one_shot_decode(codec):
    streams = [random_frames(12, seed=100 + i) for i in range(8)]

    async def run():
        scheduler = DecodeScheduler(codec, window_ms=50)
        decoders = [FrameDecoder(scheduler, 2, max_chunk=1) for _ in streams]

        async def one(decoder, frames):
            pieces = []
            for frame in frames:
                pieces.append(await decoder.push([frame]))
            pieces.append(await decoder.finish())
            decoder.close()
            return np.concatenate(pieces)

        audio = await asyncio.gather(*(one(d, f) for d, f in zip(decoders, streams, strict=True)))
        await scheduler.close()
        return audio, scheduler

    audio, scheduler = asyncio.run(run())
    for frames, pcm in zip(streams, audio, strict=True):
        assert np.abs(pcm - codec.decode(frames)).max() < 1e-3
    assert scheduler.windows == 8 * 12  # a window per frame (max_chunk 1)
    assert scheduler.windows / scheduler.batches >= 4  # 8 streams: mostly full batches


class FrozenClock:
    """Time that moves only when told: playback stands still, so the lead only grows."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def paced(codec, frames, step_seconds):
    """Push ``frames`` one at a time, the clock moving ``step_seconds(i)`` before frame i.
    Returns the decoder, the chunk sizes played (in frames) and the lead before each frame."""
    clock = FrozenClock()

    async def run():
        decoder = FrameDecoder(DecodeScheduler(codec), 2, max_chunk=16, clock=clock)
        sizes, leads = [], []
        for index, frame in enumerate(frames):
            clock.now += step_seconds(index)
            if decoder.first_audio_at is not None:
                leads.append(decoder.lead_seconds())
            pcm = await decoder.push([frame])
            if pcm.size:
                sizes.append(pcm.size // orpheus.SAMPLES_PER_FRAME)
        sizes.append((await decoder.finish()).size // orpheus.SAMPLES_PER_FRAME)
        return decoder, sizes, leads

    return asyncio.run(run())


def test_chunks_grow_with_the_lead_and_decoding_approaches_one_frame_per_frame(codec):
    decoder, sizes, _ = paced(codec, random_frames(192, seed=11), lambda i: 0.0)
    assert sizes[0] == 1  # first audio as early as the lookahead allows
    assert sizes[:-1] == sorted(sizes[:-1]) and max(sizes) == 16
    assert sum(sizes) == 192
    assert decoder.decoded / 192 < 1.5  # the public decoders decode 4 frames per frame played


def test_a_stream_behind_playback_plays_each_frame_as_soon_as_it_can(codec):
    # a frame every second: far slower than real time
    _, sizes, _ = paced(codec, random_frames(20, seed=12), lambda i: 1.0)
    assert sizes == [1] * 18 + [2]  # the last two frames wait for the end of the stream


def test_chunks_follow_the_generation_speed_and_the_listener_never_runs_dry(codec):
    """Generated at 2x real time, then at 1x: chunks grow with the lead and the speed, and
    before each new frame the audio handed out still covers what has played."""
    frame_s = orpheus.FRAME_SECONDS
    frames = random_frames(160, seed=15)
    decoder, sizes, leads = paced(codec, frames, lambda i: frame_s / (2.0 if i < 80 else 1.0))
    assert min(leads) > 0
    assert max(sizes) == 16
    assert decoder.decoded / len(frames) < 1.7


@pytest.mark.paced
def test_a_lone_stream_never_waits_for_the_batch_window(codec):
    frames = random_frames(4, seed=13)

    async def decode_one(idle_streams: int) -> float:
        scheduler = DecodeScheduler(codec, window_ms=2000)
        for _ in range(idle_streams):
            scheduler.attach()
        await scheduler.decode(Span.whole(frames))  # the first call also starts the loop
        started = time.monotonic()
        await scheduler.decode(Span.whole(frames))
        elapsed = time.monotonic() - started
        await scheduler.close()
        return elapsed

    assert asyncio.run(decode_one(idle_streams=1)) < 1.5
    assert asyncio.run(decode_one(idle_streams=2)) >= 1.9  # waits for the other live stream


def test_each_decode_batch_tells_its_wall_time_and_the_audio_it_gave(codec):
    """What admission counts a front end's decoding by (``DecodeCost``): every batch, its
    seconds and the seconds of audio its windows kept."""
    told: list[tuple[float, float]] = []

    async def run() -> float:
        scheduler = DecodeScheduler(codec, record=lambda busy, audio: told.append((busy, audio)))
        started = time.monotonic()
        for seed in (15, 16):
            await scheduler.decode(Span.whole(random_frames(5, seed=seed)))
        elapsed = time.monotonic() - started
        await scheduler.close()
        return elapsed

    elapsed = asyncio.run(run())
    assert [audio for _, audio in told] == [5 * orpheus.SAMPLES_PER_FRAME / orpheus.SAMPLE_RATE] * 2
    assert all(busy > 0 for busy, _ in told) and sum(busy for busy, _ in told) <= elapsed


def test_a_failed_decode_reaches_its_stream_and_the_loop_serves_on(codec):
    broken = [orpheus.Frame((5000,), (0, 0), (0, 0, 0, 0))]  # no such code

    async def run():
        scheduler = DecodeScheduler(codec)
        with pytest.raises(IndexError):
            await scheduler.decode(Span.whole(broken))
        audio = await scheduler.decode(Span.whole(random_frames(3, seed=14)))
        await scheduler.close()
        return audio

    assert asyncio.run(run()).size == 3 * orpheus.SAMPLES_PER_FRAME


def test_closing_the_scheduler_fails_the_windows_waiting_on_it(codec):
    async def run():
        scheduler = DecodeScheduler(codec, window_ms=5000)
        scheduler.attach()
        scheduler.attach()  # a second live stream that never sends: the batch waits for it
        waiting = asyncio.ensure_future(scheduler.decode(Span.whole(random_frames(3, seed=16))))
        await asyncio.sleep(0.1)
        await scheduler.close()
        with pytest.raises(RuntimeError, match="decode loop stopped"):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(run())


class HeldCodec(SnacCodec):
    """The real codec, whose decodes start only once released."""

    def __init__(self, codec: SnacCodec) -> None:
        super().__init__(codec.model, codec.device)
        self.entered, self.release = threading.Event(), threading.Event()

    def decode_batch(self, spans):
        self.entered.set()
        self.release.wait(10)
        return super().decode_batch(spans)


def test_closing_the_scheduler_mid_decode_fails_the_windows_being_decoded(codec):
    held = HeldCodec(codec)

    async def run():
        scheduler = DecodeScheduler(held)
        waiting = asyncio.ensure_future(scheduler.decode(Span.whole(random_frames(3, seed=17))))
        assert await asyncio.to_thread(held.entered.wait, 5)
        await scheduler.close()
        with pytest.raises(RuntimeError, match="decode loop stopped"):
            await asyncio.wait_for(waiting, 5)

    try:
        asyncio.run(run())
    finally:
        held.release.set()
        held.close()


def test_a_burst_of_frames_is_decoded_in_windows_of_at_most_max_chunk_new_frames(codec):
    frames = random_frames(100, seed=18)

    async def run():
        scheduler = DecodeScheduler(codec)
        decoder = FrameDecoder(scheduler, 2, max_chunk=16)
        audio = np.concatenate([await decoder.push(frames), await decoder.finish()])
        return audio, scheduler

    audio, scheduler = asyncio.run(run())
    assert np.abs(audio - codec.decode(frames)).max() < 1e-3
    assert scheduler.windows >= 100 / 16
    assert scheduler.frames_decoded <= scheduler.windows * (16 + 5)
