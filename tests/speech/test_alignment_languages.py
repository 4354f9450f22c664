"""The built-in aligner in each language a voice may speak (issue 44): words cut and weighed by
their script, and placed in espeak-ng's speech of each of the eight languages, whose C library
says where each word starts (``devcorpus.spoken_words``)."""

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soxr

from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.alignment import EstimatedAligner, align, phrases, spoken_letters, text_words
from voicehost.tools.devcorpus import spoken_words

pytestmark = pytest.mark.unit

# language: (espeak-ng's voice, a sentence with a clause's pause and a sentence end)
SPEECH = {
    "en": ("en-us+m1", "The quick brown fox, jumping over the lazy dog, said hello. Then it ran."),
    "fr": ("fr+m1", "Le café est très bon, mais il coûte cher. Nous parlons souvent de nos amis."),
    "de": ("de+m1", "Am Wochenende besuchen wir meine Großeltern, die auf dem Land wohnen."),
    "es": ("es+m1", "Mañana vamos a la playa con nuestros amigos, si no llueve demasiado."),
    "it": ("it+m1", "Domani andiamo al mare con i nostri amici, se non piove troppo."),
    "ko": ("ko+m1", "안녕하세요, 저는 학생입니다. 오늘 날씨가 정말 좋네요."),
    "hi": ("hi+m1", "मैं आज बाज़ार जा रहा हूँ। क्या आप भी मेरे साथ चलेंगे?"),
    "zh": ("cmn+m1", "我们今天去公园散步，天气很好。明天我要去北京。"),  # noqa: RUF001
}


def test_each_script_is_weighed_by_what_it_is_said_in():
    def said(text: str, language: str) -> list[int]:
        return [w.syllables for w in text_words(text, language=language)]

    # vowel groups; French's silent final e, es and verbs' ent, but not an adverb's or a noun's
    assert said("coûte parlent souvent moment café", "fr") == [1, 1, 2, 2, 2]
    assert said("Über großer geredet", "de") == [2, 2, 3]  # a German final e is said
    assert said("playa ayer c'era", "es") == [2, 2, 2]  # a y before a vowel; an elision
    # a Hangul block, a Devanagari akshara (a virama joins; a final bare consonant's vowel is
    # not said), a Han character: a syllable each
    assert said("안녕하세요, 저는", "ko") == [5, 2]
    assert said("बाज़ार क्या चलेंगे? धन्यवाद", "hi") == [2, 1, 3, 3]
    # a lone consonant's inherent vowel between a vowel and a consonant with its vowel is not
    # said either, right to left: kar-ne, baith-kar, pa-kar-nii (not ka-ra-ne, bai-tha-ka-ra)
    assert said("करने बैठकर पकड़नी समझना", "hi") == [2, 2, 3, 3]
    assert said("我们", "zh") == [1, 1]
    assert said("2024", "fr") == [6]  # no language's numbers read here: about 1.5 a digit
    # a Hangul block's letters are its jamo: 안 (3) 녕 (3) 하 (2) 세 (2) 요 (2), and 5 syllables
    assert text_words("안녕하세요", language="ko")[0].weight == 17
    assert text_words("Hello", language="en-US") == text_words("Hello")  # English's own rules


def test_a_vowel_that_meets_the_next_words_vowel_is_known_from_the_text():
    def meets(text: str, language: str) -> list[bool]:
        return [w.meets for w in text_words(text, language=language)]

    # Italian's and Spanish's synalepha: one syllable; not across a pause, nor a consonant
    assert meets("Domani andiamo al mare, e poi", "it") == [False, True, True, False, False, False]
    assert meets("vamos a la playa ahora", "es") == [False, False, False, False, True]  # silent h
    assert meets("क्या आप भी मेरे साथ", "hi") == [False, True, False, False, False]  # kyaa aap


def test_a_language_without_spaces_has_a_word_a_character_each_a_span_of_the_clients_text():
    text = "“你好”，他说：OK 2024年。"  # noqa: RUF001
    words = text_words(text, language="zh")
    assert [w.text for w in words] == ["“你", "好”，", "他", "说：", "OK", "2024", "年。"]  # noqa: RUF001
    assert all(text[w.start : w.end] == w.text for w in words)
    assert phrases(words) == [[0, 1], [2, 3], [4, 5, 6]]  # fullwidth comma and colon pause
    # Korean's words are its spaced eojeol; a danda, a guillemet standing alone, pause
    korean = text_words("저는 학생입니다.", language="ko")
    assert [w.text for w in korean] == ["저는", "학생입니다."]
    hindi = text_words("मैं घर जा रहा हूँ । तुम", language="hi")
    assert phrases(hindi) == [[0, 1, 2, 3, 4], [5]]
    assert phrases(text_words("« Bonjour » dit-il", language="fr")) == [[0], [1]]
    assert [w.text for w in text_words("Pourriez-vous", language="fr")] == ["Pourriez-vous"]


@pytest.mark.parametrize("language", list(SPEECH))
def test_espeaks_speech_in_each_language_is_timed_word_by_word_near_its_own_positions(language):
    voice, text = SPEECH[language]
    spoken = spoken_words(text, voice, 175)
    audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
    truth = dict(spoken.starts)
    aligner = EstimatedAligner(spoken_letters)  # as the service builds it
    for chunk in (0, SAMPLE_RATE * 3 // 10):  # whole, and streamed in 0.3 s chunks
        words = align(aligner, text, audio, chunk, language)
        assert words and all(text[w.start : w.end] == w.text for w in words)
        assert [w.text for w in words] == [w.text for w in text_words(text, language=language)]
        for before, after in itertools.pairwise(words):
            assert before.audio_start <= before.audio_end <= after.audio_start
        errors = np.abs([w.audio_start - truth[w.start] for w in words if w.start in truth])
        assert errors.size >= 0.8 * len(words)  # espeak-ng's words are these words
        assert np.median(errors) < (0.06 if chunk == 0 else STREAMED.get(language, 0.1)), errors


STREAMED: dict[str, float] = {}  # a language whose streamed words may be further off


def bench() -> ModuleType:
    """``scripts/bench_alignment.py``: its texts and voices are the tests' too."""
    path = Path(__file__).parents[2] / "scripts" / "bench_alignment.py"
    spec = importlib.util.spec_from_file_location("bench_alignment", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_speech() -> dict[str, list[tuple[str, np.ndarray, dict[int, float]]]]:
    """The bench's speech: its five texts of each language in espeak-ng's variants m1, f2, m3
    and f4 of the language's voice (English's four voices), at 140, 175 and 220 words a
    minute. (The languages' timings, ``alignment.TIMINGS``, were chosen on m1 and f2 and
    checked on m3 and f4 alone too; the four together keep English's median, the measure,
    steadier from one espeak-ng rendering to the next.)"""
    script = bench()
    speech = {}
    english, variants = "en-us+m1,en-us+f2,en+m3,en-us+f4", "m1,f2,m3,f4"
    for language, texts in script.TEXTS_BY_LANGUAGE.items():
        speech[language] = []
        for voice in script.voices_of(language, english, variants):
            for speed, text in itertools.product((140, 175, 220), texts):
                spoken = spoken_words(text, voice, speed)
                audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
                speech[language].append((text, audio, dict(spoken.starts)))
    return speech


@pytest.mark.parametrize("chunk", [0, SAMPLE_RATE * 3 // 10], ids=["whole", "streamed"])
def test_each_languages_median_error_is_within_half_again_of_englishs(bench_speech, chunk):
    """Issue 44's done-when, whole and streamed in 0.3 s chunks: each language's median
    word-start error on espeak-ng's speech is at most 1.5 times English's."""
    aligner = EstimatedAligner(spoken_letters)
    medians = {}
    for language, cases in bench_speech.items():
        errors = []
        for text, audio, truth in cases:
            words = align(aligner, text, audio, chunk, language)
            errors += [abs(w.audio_start - truth[w.start]) for w in words if w.start in truth]
        medians[language] = round(1000 * float(np.median(errors)), 1)
    assert all(ms <= 1.5 * medians["en"] for ms in medians.values()), medians
