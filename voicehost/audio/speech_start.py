"""Where speech starts: the one detector behind the runtime's leading-silence trim
(``synthesis.LeadingSilenceTrim``), the training data's trim (``lora_training.trim``), a clone's
evaluation (``voicehost.cloning.evaluation``) and the benchmark's time to first speech
(``voicehost.tools.bench``).

Audio (float samples, full scale 1.0) is cut into consecutive 10 ms windows from its first sample,
the last one possibly short; a window is loud when its RMS level exceeds a threshold in dBFS.
Callers differ only in the threshold: a fixed level for a stream (runtime, evaluation,
benchmark), one relative to the clip's own loud windows for a training clip
(``relative_threshold_db``).
"""

from __future__ import annotations

import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE

WINDOW_SECONDS = 0.010
SILENT_DB = -200.0  # the level of digital silence (a floor instead of -inf)
RELATIVE_THRESHOLD_DB = 35.0  # a training clip's window this far below its loud windows is silence
FLOOR_DB = -60.0  # and so is anything below this level, however quiet the clip


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


def leading_silence_ms(
    samples: np.ndarray, threshold_db: float, sample_rate: int = SAMPLE_RATE
) -> float:
    """How long ``samples`` are silent before speech starts (``speech_start``), in ms; the whole
    clip if it never does."""
    start = speech_start(samples, threshold_db, sample_rate)
    return (len(samples) if start is None else start) * 1000 / sample_rate


def relative_threshold_db(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """A training clip's threshold: ``RELATIVE_THRESHOLD_DB`` below its loud windows (the 95th
    percentile of its window levels), never below ``FLOOR_DB``."""
    levels = window_levels_db(samples, sample_rate)
    if levels.size == 0:
        return FLOOR_DB
    return max(float(np.percentile(levels, 95)) - RELATIVE_THRESHOLD_DB, FLOOR_DB)
