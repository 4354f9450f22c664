"""``speed``: the model's PCM played faster or slower with its pitch kept, as it streams.

FFmpeg's ``atempo`` filter (WSOLA: overlapping windows re-spaced where the waveforms line up)
through PyAV's filter graph, no DSP of our own. One ``atempo`` takes 0.5 to 2 without artefacts
of its own design (FFmpeg's documentation says to chain it beyond), so a factor outside that is
split into equal steps inside it: 4.0 is two steps of 2.0, 0.25 two of 0.5.
"""

from __future__ import annotations

import math
from fractions import Fraction

import av
import av.filter
import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE

MIN_SPEED = 0.25  # OpenAI's range for ``speed``
MAX_SPEED = 4.0
ATEMPO_RANGE = (0.5, 2.0)  # what one atempo step takes


def atempo_steps(speed: float) -> list[float]:
    """The fewest equal ``atempo`` factors, each within ``ATEMPO_RANGE``, whose product is
    ``speed``; ``ValueError`` outside ``MIN_SPEED`` to ``MAX_SPEED``."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be {MIN_SPEED} to {MAX_SPEED}, not {speed}")
    low, high = ATEMPO_RANGE
    steps = max(1, math.ceil(abs(math.log(speed)) / math.log(high) - 1e-9))
    step = speed ** (1 / steps)
    assert low - 1e-9 <= step <= high + 1e-9
    return [step] * steps


class TimeStretch:
    """One stream's tempo change: float32 mono chunks at ``rate`` in (any length, 0 included),
    the same audio ``speed`` times faster out, pitch unchanged, as whole filter frames are ready.

    ``push`` every chunk, then ``finish`` once; the concatenation of what they return is the
    whole stretched stream, ``len(input) / speed`` samples give or take a few ms. The filter
    holds back up to one analysis window (about 40 ms) until more audio or ``finish`` comes.
    Not thread-safe.
    """

    def __init__(self, speed: float, rate: int = SAMPLE_RATE) -> None:
        self.speed = speed
        self._rate = rate
        self._graph = av.filter.Graph()
        self._source = self._graph.add_abuffer(
            format="flt", sample_rate=rate, layout="mono", time_base=Fraction(1, rate)
        )
        previous = self._source
        for step in atempo_steps(speed):
            tempo = self._graph.add("atempo", f"{step:.9f}")
            previous.link_to(tempo)
            previous = tempo
        self._sink = self._graph.add("abuffersink")
        previous.link_to(self._sink)
        self._graph.configure()
        self._pts = 0
        self._finished = False

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Stretch ``samples``; returns what the filter has ready now (possibly nothing)."""
        if self._finished:
            raise RuntimeError("this TimeStretch is finished")
        samples = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples[np.newaxis, :], format="flt", layout="mono")
            frame.sample_rate = self._rate
            frame.time_base = Fraction(1, self._rate)
            frame.pts = self._pts
            self._pts += samples.size
            self._source.push(frame)
        return self._pull()

    def finish(self) -> np.ndarray:
        """Flush the filter; returns the rest of the stretched stream."""
        if self._finished:
            raise RuntimeError("this TimeStretch is finished")
        self._finished = True
        self._source.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        out: list[np.ndarray] = []
        while True:
            try:
                frame = self._sink.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1).astype(np.float32, copy=False))
        return np.concatenate(out) if out else np.zeros(0, np.float32)
