"""Segments of each script: sentences and clauses end at its marks, and a text written without
spaces is cut where it may be."""

from __future__ import annotations

import pytest

from voicehost.text.segment import TextSegmenter, split_text
from voicehost.text.stage import TIMED_WORDS, SaidWords, TextStage, speech_length

pytestmark = pytest.mark.unit


def texts(segments):
    return [s.text for s in segments]


def streamed(text, **options):
    segmenter = TextSegmenter(**options)
    out = []
    for char in text:
        out += segmenter.push(char)
    return out + segmenter.flush()


def test_chinese_sentences_end_at_full_width_marks_without_a_space():
    text = "今天天气很好，我们去公园散步吧。你觉得怎么样？“好啊！”他说。"
    assert texts(streamed(text)) == [
        "今天天气很好，",  # the first segment ends at the first clause of four characters
        "我们去公园散步吧。",
        "你觉得怎么样？",
        "“好啊！”",
        "他说。",
    ]


def test_a_full_width_mark_is_not_cut_before_the_next_character_shows_it_is_no_closer():
    segmenter = TextSegmenter(first_min_words=None)
    assert segmenter.push("你好。") == []  # a closing quote may still follow
    assert texts(segmenter.push("」")) == []
    assert texts(segmenter.push("我")) == ["你好。」"]


def test_a_run_of_marks_stays_together():
    assert texts(streamed("真的吗？！是的。", first_min_words=None)) == ["真的吗？！", "是的。"]


def test_hindi_sentences_end_at_the_danda_and_double_danda():
    text = "मैं आज बाज़ार गया। वहाँ बहुत भीड़ थी॥ फिर घर लौटा।"
    assert texts(streamed(text, first_min_words=None)) == [
        "मैं आज बाज़ार गया।",
        " वहाँ बहुत भीड़ थी॥",
        " फिर घर लौटा।",
    ]


def test_korean_sentences_end_at_latin_marks():
    text = "안녕하세요. 반갑습니다! 잘 지내요?"
    assert texts(streamed(text, first_min_words=None)) == [
        "안녕하세요.",
        " 반갑습니다!",
        " 잘 지내요?",
    ]


def test_chinese_without_marks_is_cut_at_the_limit_but_not_inside_a_number():
    text = "我" * 80 + "12345" + "好" * 80
    segments = split_text(text, max_chars=82)
    assert "".join(texts(segments)) == text
    assert texts(segments)[0] == "我" * 80
    assert texts(segments)[1].startswith("12345")


def test_a_long_chinese_text_is_cut_at_its_clauses_within_the_limit():
    clause = "我们今天讨论的问题非常重要，"
    text = clause * 20
    segments = split_text(text, max_chars=70)
    assert "".join(texts(segments)) == text
    assert all(len(s.text) <= 70 and s.text.endswith("，") for s in segments)


def test_a_chinese_segment_holds_a_third_of_the_characters_of_an_english_one():
    assert TextStage(max_chars=300, language="zh").segment_chars == 100
    assert TextStage(max_chars=300, language="ko-KR").segment_chars == 150
    assert TextStage(max_chars=300, language="fr").segment_chars == 300
    assert TextStage(max_chars=100, language="zh").segment_chars == 66  # the segmenter's least
    assert speech_length("你好") == 6 and speech_length("hello") == 5
    assert speech_length("안녕 ok") == 7 and speech_length("पहला") == 4  # by script


def test_the_stage_normalises_by_its_language():
    stage = TextStage(language="fr")
    assert [s.speech for s in stage.whole("Ça coûte 42,50 €. Merci !")] == [
        "Ça coûte quarante-deux euros cinquante. Merci !"
    ]
    assert [s.speech for s in TextStage(language="zh").whole("共35%。")] == ["共百分之三十五。"]
    assert [s.speech for s in TextStage(language="ja").whole("42,50 €")] == ["42,50 €"]
    assert [s.speech for s in TextStage().whole("$5")] == ["five dollars"]


def test_streamed_chinese_is_normalised_per_segment():
    stream = TextStage(language="zh").streamed()
    out = []
    for char in "价格是42.50元。明天见！":
        out += stream.push(char)
    out += stream.flush()
    assert [s.speech for s in out] == ["价格是四十二元五角。", "明天见！"]


def test_korean_counts_words_by_its_spaces_for_the_early_first_segment():
    # Hangul is written with spaces between words: a clause of one word is not four words.
    assert texts(streamed("안녕하세요, 저는 김민수입니다. 반갑습니다."))[0] == (
        "안녕하세요, 저는 김민수입니다."
    )
    assert texts(streamed("오늘은 날씨가 정말 좋네요, 산책하러 갈까요?"))[0] == (
        "오늘은 날씨가 정말 좋네요,"
    )


def said_by_word(text: str, language: str) -> list[tuple[str, str]]:
    stage = TextStage(language=language)
    said = SaidWords(stage.say, text)
    return [(m.group(), said.of(m.start(), m.end())) for m in TIMED_WORDS.finditer(text)]


def test_each_word_is_said_as_its_part_of_what_the_stage_says():
    french = dict(said_by_word("Le billet coûte 42,50 € le 3 mars.", "fr"))
    # said together: both words of the price carry it
    assert french["42,50"] == french["€"] == "quarante-deux euros cinquante"
    assert french["3"] == "trois" and french["billet"] == "billet"
    chinese = said_by_word("我有2个苹果。", "zh")
    assert chinese[2] == ("2", "两个") and chinese[3] == ("个", "两个")  # 2 before a counter
    assert chinese[0] == ("我", "我")
    english = SaidWords(TextStage().say, "Hello there, friend.")
    assert english.plain and english.of(6, 12) == "there,"  # said as written: nothing to say
