"""The one detector of where speech starts (runtime trim, training trim, benchmark)."""

from __future__ import annotations

import numpy as np
import pytest

from voicehost.audio.speech_start import loud_windows, speech_start, window_levels_db

pytestmark = pytest.mark.unit

RATE = 24000
WINDOW = 240  # 10 ms at 24 kHz


def tone(seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return amplitude * np.sin(2 * np.pi * 440 * t)


def test_window_levels_are_rms_dbfs_of_10ms_windows_the_last_one_short():
    audio = np.concatenate([np.zeros(WINDOW), np.full(WINDOW, 0.5), np.full(100, 0.1)])
    levels = window_levels_db(audio, RATE)
    assert levels.shape == (3,)
    assert levels[0] < -150  # digital silence
    assert levels[1] == pytest.approx(20 * np.log10(0.5))
    assert levels[2] == pytest.approx(20 * np.log10(0.1))  # over its own 100 samples only


def test_speech_starts_at_the_first_window_louder_than_the_threshold():
    audio = np.concatenate([np.zeros(12000), tone(0.5, 0.1)])  # -23 dBFS from sample 12000
    assert speech_start(audio, -45.0, RATE) == 12000
    assert speech_start(audio, -20.0, RATE) is None
    assert speech_start(np.zeros(0), -45.0, RATE) is None


def test_a_window_exactly_at_the_threshold_is_not_loud():
    level = 20 * np.log10(0.25)
    audio = np.concatenate([np.zeros(WINDOW), np.full(WINDOW, 0.25)])
    assert loud_windows(audio, level - 0.01, RATE).tolist() == [1]
    assert loud_windows(audio, level + 0.01, RATE).tolist() == []


def test_a_window_that_is_loud_only_partly_is_found_at_its_start():
    audio = np.zeros(3 * WINDOW)
    audio[WINDOW + 200 :] = 0.5  # loud from the middle of window 1
    assert speech_start(audio, -20.0, RATE) == WINDOW
