"""Where speech starts: the one detector behind the runtime's leading-silence trim
(``synthesis.LeadingSilenceTrim``), the training data's trim (``lora_training.trim``) and the
benchmark's time to first speech (``voicehost.tools.bench``).

Audio (float samples, full scale 1.0) is cut into consecutive 10 ms windows from its first sample,
the last one possibly short; a window is loud when its RMS level exceeds a threshold in dBFS.
Callers differ only in the threshold: a fixed level for a stream (runtime, benchmark), one
relative to the clip's own loud windows for a training clip.
"""

from __future__ import annotations

import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE

WINDOW_SECONDS = 0.010
SILENT_DB = -200.0  # the level of digital silence (a floor instead of -inf)


def window_samples(sample_rate: int = SAMPLE_RATE) -> int:
    return max(1, round(WINDOW_SECONDS * sample_rate))


def window_levels_db(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The RMS level (dBFS) of each 10 ms window of ``samples``, in order."""
    size = window_samples(sample_rate)
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0)
    padded = np.zeros(-(-x.size // size) * size)
    padded[: x.size] = x
    counts = np.full(padded.size // size, size, dtype=np.float64)
    counts[-1] = x.size - (counts.size - 1) * size  # the short last window: its own samples only
    power = np.square(padded).reshape(-1, size).sum(axis=1) / counts
    return 10 * np.log10(np.maximum(power, 10 ** (SILENT_DB / 10)))


def loud_windows(
    samples: np.ndarray, threshold_db: float, sample_rate: int = SAMPLE_RATE
) -> np.ndarray:
    """Indices of the windows louder than ``threshold_db``."""
    return np.flatnonzero(window_levels_db(samples, sample_rate) > threshold_db)


def speech_start(
    samples: np.ndarray, threshold_db: float, sample_rate: int = SAMPLE_RATE
) -> int | None:
    """The first sample of the first window louder than ``threshold_db``; ``None`` if none is."""
    loud = loud_windows(samples, threshold_db, sample_rate)
    return int(loud[0]) * window_samples(sample_rate) if loud.size else None
