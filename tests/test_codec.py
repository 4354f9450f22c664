"""Streaming SNAC decoding: exact against a one-shot decode, every frame played once, in order."""

import asyncio
import random

import numpy as np
import pytest

from voicehost import orpheus
from voicehost.codec import FrameDecoder, SnacCodec


@pytest.fixture(scope="module")
def codec(dev_model):
    return SnacCodec.load(dev_model.codec, device="cpu", noise=False)


def random_frames(count: int, seed: int) -> list[orpheus.Frame]:
    rng = random.Random(seed)
    frames = [
        orpheus.Frame.from_codes(
            [rng.randrange(4096)],
            [rng.randrange(4096) for _ in range(2)],
            [rng.randrange(4096) for _ in range(4)],
        )
        for _ in range(count)
    ]
    frames[0] = orpheus.Frame((0,), (0, 0), (0, 0, 0, 0))  # code 0 is a real code
    frames[-1] = orpheus.Frame((4095,), (4095, 4095), (4095, 4095, 4095, 4095))
    return frames


def stream(codec, frames, lookahead, chunk_sizes):
    """Push ``frames`` in chunks; returns the audio and after how many frames it first came."""

    async def run():
        decoder = FrameDecoder(codec, lookahead)
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
    audio, _ = stream(codec, frames, 2, sizes)
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
        FrameDecoder(codec, 3)


def test_encode_then_decode_keeps_the_length(codec):
    audio = np.sin(np.linspace(0, 440 * 2 * np.pi, 24000)).astype(np.float32) * 0.3
    frames = codec.encode(audio)
    assert len(frames) == int(np.ceil(24000 / 2048))
    assert codec.decode(frames).size == len(frames) * orpheus.SAMPLES_PER_FRAME
