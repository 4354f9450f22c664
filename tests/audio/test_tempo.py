"""``speed``: the audio is time-stretched as it streams, its pitch kept (FFmpeg's atempo through
PyAV, chained beyond 0.5-2), measured through the FormatWriter every response goes through."""

from __future__ import annotations

import math

import numpy as np
import pytest

from voicehost.audio.formats import FormatWriter
from voicehost.audio.tempo import ATEMPO_RANGE, TimeStretch, atempo_steps
from voicehost.model.orpheus import SAMPLE_RATE

pytestmark = pytest.mark.unit

TONE_HZ = 440.0
SPEEDS = (0.25, 0.6, 1.5, 2.5, 4.0)  # chained below 0.5 and above 2, one step between


def tone(seconds: float, hz: float = TONE_HZ) -> np.ndarray:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    # a voice-like tone: a fundamental and two harmonics
    wave = np.sin(2 * np.pi * hz * t) + 0.5 * np.sin(4 * np.pi * hz * t)
    return (0.4 * (wave + 0.25 * np.sin(6 * np.pi * hz * t))).astype(np.float32)


def through_the_writer(samples: np.ndarray, speed: float) -> np.ndarray:
    """``samples`` as a pcm response at ``speed``, fed in uneven chunks as the decoder yields
    them, decoded back to floats."""
    writer = FormatWriter("pcm", None, speed)
    sizes = np.random.default_rng(0).integers(1, 4096, size=len(samples) // 1000 + 1)
    cuts = np.minimum(np.cumsum(sizes), len(samples))
    out = bytearray()
    start = 0
    for cut in cuts:
        out += writer.encode(samples[start:cut])
        start = cut
    out += writer.encode(samples[start:])
    out += writer.finish()
    return np.frombuffer(bytes(out), dtype="<i2").astype(np.float32) / 32768


def dominant_hz(samples: np.ndarray, seconds: float = 0.25) -> float:
    """The strongest frequency of the middle ``seconds``, to 0.4 Hz (a Hann window, padded)."""
    middle = len(samples) // 2
    window = samples[middle - round(seconds * SAMPLE_RATE / 2) :][: round(seconds * SAMPLE_RATE)]
    size = 1 << 16
    spectrum = np.abs(np.fft.rfft(window * np.hanning(len(window)), n=size))
    return float(np.argmax(spectrum) * SAMPLE_RATE / size)


@pytest.mark.parametrize("speed", SPEEDS)
def test_speed_scales_the_duration_and_keeps_the_pitch(speed):
    source = tone(1.5)
    stretched = through_the_writer(source, speed)
    ratio = len(stretched) / len(source)
    assert ratio == pytest.approx(1 / speed, rel=0.03), f"{ratio:.4f} at speed {speed}"
    assert dominant_hz(source) == pytest.approx(TONE_HZ, rel=0.005)  # the measure itself
    heard = dominant_hz(stretched)
    assert heard == pytest.approx(TONE_HZ, rel=0.02), f"{heard:.1f} Hz at speed {speed}"


def test_factors_beyond_one_atempo_are_chained_in_equal_steps_inside_its_range():
    low, high = ATEMPO_RANGE
    for speed in (*SPEEDS, 0.3, 2.5, 1.0):
        steps = atempo_steps(speed)
        assert all(low <= step <= high for step in steps), steps
        assert math.prod(steps) == pytest.approx(speed)
        assert len(steps) == (1 if low <= speed <= high else 2)
    for speed in (0.2, 4.5, 0.0):
        with pytest.raises(ValueError):
            atempo_steps(speed)


def test_speed_one_leaves_the_samples_exactly_as_they_were():
    source = tone(0.5)
    assert np.array_equal(
        through_the_writer(source, 1.0),
        np.frombuffer(FormatWriter("pcm").encode(source), dtype="<i2").astype(np.float32) / 32768,
    )


def test_the_stream_says_how_many_samples_the_listener_gets():
    """``segment.done`` and SSE's ``done`` count what is heard: at the output rate, stretched."""
    assert FormatWriter("pcm", None, 2.0).output_samples(24000) == 12000
    assert FormatWriter("wav", 16000, 0.5).output_samples(24000) == 32000


def test_a_finished_stretch_takes_no_more_audio():
    stretch = TimeStretch(2.0)
    stretch.push(tone(0.1))
    stretch.finish()
    with pytest.raises(RuntimeError):
        stretch.push(tone(0.1))
