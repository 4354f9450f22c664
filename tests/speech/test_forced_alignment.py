"""The forced aligner (``VOICEHOST_ALIGNER_MODEL``): Viterbi through a CTC model's frames, and the
aligner interface with a model the test builds (``helpers.tiny_ctc_model``: random weights, so
its timing is arbitrary; the interface is what is tested, on espeak-ng's speech)."""

import itertools
from pathlib import Path

import numpy as np
import pytest
import soxr
from helpers import tiny_ctc_model

from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.alignment import EstimatedAligner, align
from voicehost.speech.forced_alignment import CtcAligner, load_aligner, viterbi
from voicehost.tools.devcorpus import spoken_words

pytestmark = pytest.mark.unit

TEXT = "The quick brown fox, jumping over the lazy dog, paid $42.50. Then it ran away."


@pytest.fixture(scope="module")
def ctc(tmp_path_factory: pytest.TempPathFactory) -> CtcAligner:
    aligner = load_aligner(tiny_ctc_model(tmp_path_factory.mktemp("aligner") / "tiny-ctc"))
    assert isinstance(aligner, CtcAligner)
    return aligner


def emissions(frames: list[int], classes: int = 4) -> np.ndarray:
    """Log-probabilities that say ``frames`` (a class a frame) all but surely."""
    probs = np.full((len(frames), classes), 0.01)
    probs[np.arange(len(frames)), frames] = 0.97
    return np.log(probs)


def test_viterbi_finds_the_path_through_the_targets_and_a_free_end_stops_early():
    said = emissions([0, 1, 1, 0, 2, 2, 0, 3, 0, 0])  # blank is 0
    assert viterbi(said, [1, 2, 3], 0, free_end=False) == [-1, 0, 0, -1, 1, 1, -1, 2, -1, -1]
    # half of it heard: the path stops at the second target, the third not said yet
    assert viterbi(said[:5], [1, 2, 3], 0, free_end=True) == [-1, 0, 0, -1, 1]
    assert viterbi(said[:2], [1, 2, 3], 0, free_end=False) is None  # too few frames
    # a letter twice needs a blank between: two frames cannot hold "LL"
    assert viterbi(emissions([1, 1]), [1, 1], 0, free_end=False) is None
    assert viterbi(emissions([1, 0, 1]), [1, 1], 0, free_end=False) == [0, -1, 1]


def test_a_ctc_model_from_a_folder_times_every_word_once_in_order_within_the_audio(ctc):
    spoken = spoken_words(TEXT, "en-us+f2", 175)
    audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
    assert ctc.name == "ctc:tiny-ctc" and ctc.threaded
    for chunk in (0, SAMPLE_RATE * 3 // 10):  # whole, and streamed as the engine gives it
        words = align(ctc, TEXT, audio, chunk)
        assert [TEXT[w.start : w.end] for w in words] == TEXT.split()
        assert words[-1].audio_end <= audio.size / SAMPLE_RATE
        for before, after in itertools.pairwise(words):
            assert before.audio_start <= before.audio_end <= after.audio_start


def test_streamed_words_are_given_only_once_their_audio_has_been_heard(ctc):
    spoken = spoken_words(TEXT, "en-us+m1", 175)
    audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
    alignment = ctc.begin(TEXT)
    chunk, streamed = SAMPLE_RATE // 4, 0
    for first in range(0, audio.size, chunk):
        heard = min(audio.size, first + chunk) / SAMPLE_RATE
        for word in alignment.feed(audio[first : first + chunk]):
            assert word.audio_end <= heard
            streamed += 1
    assert streamed > 0  # the free end gives words before the segment ends
    assert streamed + len(alignment.finish()) == len(TEXT.split())


def test_audio_too_short_for_its_letters_is_placed_by_the_estimate(ctc):
    short = np.zeros(SAMPLE_RATE // 10, dtype=np.float32)  # 5 frames for 40 letters
    words = align(ctc, "Far too many letters for so little sound.", short)
    expected = align(EstimatedAligner(), "Far too many letters for so little sound.", short)
    assert [(w.start, w.end) for w in words] == [(w.start, w.end) for w in expected]
    assert align(ctc, "", short) == []


def test_the_setting_picks_the_aligner(tmp_path: Path):
    assert load_aligner(None).name == "estimated"
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_aligner(tmp_path)
