"""The built-in aligner on real speech: espeak-ng's, whose C library says where each word
starts (``devcorpus.spoken_words``)."""

import itertools

import numpy as np
import pytest
import soxr

from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.alignment import EstimatedAligner, align, phrases, text_words
from voicehost.tools.devcorpus import spoken_words

pytestmark = pytest.mark.unit

TEXT = "The quick brown fox, jumping over the lazy dog, said hello. Then it ran away quickly."


def speech(text: str, voice: str = "en-us+m1", speed: int = 175) -> tuple[np.ndarray, dict]:
    spoken = spoken_words(text, voice, speed)
    return soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE), dict(spoken.starts)


def test_the_text_is_cut_into_weighted_words_and_phrases_at_punctuation():
    words = text_words("Hello, world -- it's 3.5 kg. Ok")
    assert [(w.text, w.start, w.end) for w in words] == [
        ("Hello,", 0, 6),
        ("world", 7, 12),
        ("it's", 16, 20),
        ("3.5", 21, 24),
        ("kg.", 25, 28),
        ("Ok", 29, 31),
    ]
    # letters, and one per syllable of what is said ("3.5": three point five)
    assert [w.syllables for w in words] == [2, 1, 1, 3, 1, 1]
    assert [w.weight for w in words] == [7, 6, 4, 5, 3, 3]
    assert phrases(words) == [[0], [1, 2, 3, 4], [5]]


@pytest.mark.parametrize(("voice", "speed"), [("en-us+m1", 175), ("en-us+f2", 140)])
def test_every_word_is_placed_once_in_order_near_where_espeak_said_it(voice, speed):
    audio, truth = speech(TEXT, voice, speed)
    words = align(EstimatedAligner(), TEXT, audio)
    assert [TEXT[w.start : w.end] for w in words] == TEXT.split()
    starts = [w.audio_start for w in words]
    assert starts == sorted(starts) and all(w.audio_end >= w.audio_start for w in words)
    errors = np.abs([w.audio_start - truth[w.start] for w in words])
    assert np.median(errors) < 0.08, errors
    assert errors[TEXT.split().index("jumping")] < 0.05  # after a comma's pause
    assert errors[TEXT.split().index("Then")] < 0.05  # after a full stop's


def test_a_stream_gets_each_phrase_once_its_pause_is_heard_and_never_before_its_audio():
    audio, truth = speech(TEXT)
    alignment = EstimatedAligner().begin(TEXT)
    chunk = SAMPLE_RATE * 3 // 10
    given_at: list[tuple[float, object]] = []
    for first in range(0, audio.size, chunk):
        heard = min(audio.size, first + chunk) / SAMPLE_RATE
        given_at += [(heard, word) for word in alignment.feed(audio[first : first + chunk])]
    streamed = len(given_at)
    given_at += [(audio.size / SAMPLE_RATE, word) for word in alignment.finish()]
    words = [word for _, word in given_at]
    assert [TEXT[w.start : w.end] for w in words] == TEXT.split()
    assert streamed == len(words) - 1  # all but the segment's last word, as they were said
    for before, after in itertools.pairwise(words):  # in order, the last given at the end too
        assert before.audio_start <= before.audio_end <= after.audio_start
    for heard, word in given_at:
        assert word.audio_end <= heard + 1e-6  # never a word whose audio has not come
    # a word is given in the chunk after the one it ended in (its end: the next word's start)
    starts = sorted(truth.values())
    ends = [*starts[1:], audio.size / SAMPLE_RATE]
    deadlines = [(np.floor(end / 0.3) + 2) * 0.3 for end in ends]
    on_time = [
        heard <= deadline + 1e-6 for (heard, _), deadline in zip(given_at, deadlines, strict=True)
    ]
    assert sum(on_time) >= 0.8 * len(words), on_time


def test_a_pad_moves_every_word_by_the_pad():
    audio, _ = speech(TEXT)
    padded = np.concatenate([np.zeros(SAMPLE_RATE * 2 // 5, dtype=audio.dtype), audio])
    plain = align(EstimatedAligner(), TEXT, audio)
    later = align(EstimatedAligner(), TEXT, padded)
    shifts = np.array([b.audio_start - a.audio_start for a, b in zip(plain, later, strict=True)])
    assert np.allclose(shifts, 0.4, atol=0.03), shifts


def test_silence_or_no_words_still_ends():
    assert align(EstimatedAligner(), "", np.zeros(SAMPLE_RATE)) == []
    quiet = align(EstimatedAligner(), "Nothing was said.", np.zeros(SAMPLE_RATE))
    assert [w.text for w in quiet] == ["Nothing", "was", "said."]
    assert align(EstimatedAligner(), "Hi.", np.zeros(0))[0].audio_start == 0.0
