"""Trim: cut each clip's leading silence to a small pad and bound its trailing silence.

Stock Orpheus voices open with about 600 ms of silence that still costs tokens to generate; a
voice trained on trimmed clips starts speaking at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from voicehost.audio.speech_start import (
    leading_silence_ms,
    loud_windows,
    relative_threshold_db,
    window_samples,
)
from voicehost.model.orpheus import SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class TrimSettings:
    lead_pad_ms: float = 40.0
    max_trailing_ms: float = 200.0


@dataclass(frozen=True, slots=True)
class TrimmedClip:
    samples: np.ndarray
    leading_before_ms: float
    leading_after_ms: float


def speech_bounds(samples: np.ndarray) -> tuple[int, int] | None:
    """Sample indices of the first and past the last non-silent window; ``None`` if all silent.
    A window is silent below the clip's own threshold (``voicehost.audio.speech_start``:
    ``relative_threshold_db``)."""
    loud = loud_windows(samples, relative_threshold_db(samples))
    if loud.size == 0:
        return None
    size = window_samples()
    return int(loud[0]) * size, min(int(loud[-1] + 1) * size, samples.size)


def trim(samples: np.ndarray, settings: TrimSettings = TrimSettings()) -> TrimmedClip | None:
    """The clip with ``lead_pad_ms`` of silence before speech and at most ``max_trailing_ms``
    after it; ``None`` for a clip with no speech at all."""
    bounds = speech_bounds(samples)
    if bounds is None:
        return None
    start, end = bounds
    pad = int(settings.lead_pad_ms * SAMPLE_RATE / 1000)
    tail = int(settings.max_trailing_ms * SAMPLE_RATE / 1000)
    trimmed = samples[max(0, start - pad) : min(samples.size, end + tail)]
    after = leading_silence_ms(trimmed, relative_threshold_db(trimmed))
    return TrimmedClip(trimmed, start * 1000 / SAMPLE_RATE, after)


def percentiles_ms(values: Sequence[float]) -> dict[str, float]:
    """``{"p50", "p95"}`` of a list of durations, rounded to 0.1 ms."""
    if not values:
        return {"p50": 0.0, "p95": 0.0}
    return {
        "p50": round(float(np.percentile(values, 50)), 1),
        "p95": round(float(np.percentile(values, 95)), 1),
    }
