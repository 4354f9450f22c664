"""The text stage: normalisation to speakable words and segmentation of streamed text."""

from __future__ import annotations

import random
import time

import pytest

from voicehost.text.lexicon import Lexicon, LexiconEntry
from voicehost.text.normalize import normalize
from voicehost.text.segment import ABBREVIATIONS, Segment, TextSegmenter, fit, split_text
from voicehost.text.stage import TextStage, TextTooLong

pytestmark = pytest.mark.unit

EMOTIVE_TAGS = ["<laugh>", "<chuckle>", "<sigh>", "<cough>", "<sniffle>", "<groan>", "<yawn>"]
EMOTIVE_TAGS += ["<gasp>"]

PARAGRAPH = (
    "So here is the thing, and I want to be honest with you about it. Last week I met "
    "Dr. Smith at the clinic on St. Mary's road, e.g. the one near the station, and she told me "
    "that the new treatment works in about 3.5 percent of cases. <sigh> That is not a lot. "
    'Mr. Jones, who was waiting outside, said: "Well, numbers are numbers!" and then he left '
    "without another word. I went home, made some tea, and read a few chapters of a book by "
    "J. R. R. Tolkien, because nothing calms me down quite like a long walk through the Shire… "
    "Honestly? It helped. <laugh> The next morning, at 7:30 am, the phone rang again; it was the "
    "clinic, asking whether I could come in on 2024-03-05 instead of the original date, which "
    "was a Friday, approx. two weeks later than I had hoped, but fine. We talked about costs "
    "($3.50 for the form, €20 for the visit, etc.) and about the waiting list, which has grown "
    "by 50% since 1999 — or so they claim. In the end I said yes, of course, since there was "
    "really no other option that made any sense at all, and I wrote the appointment into my "
    "calendar twice, just to be sure I would not forget it this time around. "
)


def segment(text: str, pieces: list[str] | None = None, **options: int | None) -> list[Segment]:
    segmenter = TextSegmenter(**options)  # type: ignore[arg-type]
    segments: list[Segment] = []
    for piece in pieces if pieces is not None else [text]:
        segments += segmenter.push(piece)
    return segments + segmenter.flush()


def texts(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments]


def random_pieces(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        size = rng.choice([1, 1, 2, 3, rng.randint(1, 12), rng.randint(1, 40)])
        pieces.append(text[i : i + size])
        i += size
    return pieces


def assert_partition(segments: list[Segment], text: str) -> None:
    assert "".join(s.text for s in segments) == text
    position = 0
    for s in segments:
        assert s.start == position and s.end > s.start
        assert text[s.start : s.end] == s.text
        position = s.end
    assert position == len(text)
    # A blank segment only at flush, from trailing whitespace.
    assert all(s.text.strip() for s in segments[:-1])


# -- normalisation ------------------------------------------------------------------------------

NORMALISED = [
    ("42", "forty-two"),
    ("1,234 people", "one thousand two hundred and thirty-four people"),
    ("3.5", "three point five"),
    ("It was -7 outside.", "It was minus seven outside."),
    ("the 21st century", "the twenty-first century"),
    ("in 1999", "in nineteen ninety-nine"),
    ("Since 2010, prices rose.", "Since twenty ten, prices rose."),
    ("from 1999 to 2004", "from nineteen ninety-nine to two thousand and four"),
    ("the 1990s", "the nineteen nineties"),
    ("2024-03-05", "March fifth, twenty twenty-four"),
    ("March 5, 2024", "March fifth, twenty twenty-four"),
    ("on 5 March 2024", "on the fifth of March, twenty twenty-four"),
    ("the 5th of March", "the fifth of March"),
    ("3:30 pm", "three thirty p m"),
    ("at 7:05", "at seven oh five"),
    ("Come at 5 p.m.", "Come at five p m."),
    ("$5", "five dollars"),
    ("$1", "one dollar"),
    ("$3.50", "three dollars, fifty cents"),
    ("$0.99", "ninety-nine cents"),
    ("€20", "twenty euros"),
    ("£1.5 million", "one point five million pounds"),
    ("$5k", "five thousand dollars"),
    ("50%", "fifty percent"),
    ("5 km", "five kilometers"),
    ("1 kg", "one kilogram"),
    ("Dr. Smith", "Doctor Smith"),
    ("Mr. and Mrs. Jones", "Mister and Missus Jones"),
    ("St. Louis", "Saint Louis"),
    ("Baker St. is long", "Baker Street is long"),
    ("fruit, e.g. apples", "fruit, for example apples"),
    ("one thing, i.e. this", "one thing, that is this"),
    ("apples, pears, etc.", "apples, pears, et cetera."),
    ("cats vs. dogs", "cats versus dogs"),
    ("approx. 10 minutes", "approximately ten minutes"),
    ("mp3 files", "mp three files"),
    ("No. 5", "number five"),
    ("007", "zero zero seven"),
]


@pytest.mark.parametrize(("raw", "spoken"), NORMALISED)
def test_normalize_says_numbers_dates_money_and_abbreviations_as_words(raw: str, spoken: str):
    assert normalize(raw) == spoken


@pytest.mark.parametrize("tag", [*EMOTIVE_TAGS, "<whisper>", "<laugh2>", "<x-1>"])
def test_emotive_tags_come_out_byte_identical(tag: str):
    assert normalize(tag) == tag
    assert normalize(f"{tag}I paid $5{tag}, <sigh> 42{tag}.") == (
        f"{tag}I paid five dollars{tag}, <sigh> forty-two{tag}."
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello, world! How are you?",
        "  Two spaces,\ttabs\nand newlines.  ",
        "Ünïcödé — “quotes” and \N{LEFT SINGLE QUOTATION MARK}more\N{RIGHT SINGLE QUOTATION MARK}"
        "… <laugh> ok",
        "Jekyll's lab (the old one) is closed; nobody knows why.",
    ],
)
def test_text_with_nothing_to_normalise_comes_back_unchanged(text: str):
    assert normalize(text) == text


def test_normalize_never_raises_on_random_unicode():
    rng = random.Random(1234)
    alphabet = "0123456789$€£¥%.,:;-'\N{MINUS SIGN}\N{RIGHT SINGLE QUOTATION MARK} <>/#&"
    alphabet += "amAMpPstndrhkmMbBgC°Dr.e.g.JanMay"
    for _ in range(3000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        else:
            text = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 40)))
        assert isinstance(normalize(text), str)
    assert normalize("9" * 5000).startswith("nine nine")
    assert isinstance(normalize("$" + "9" * 5000 + "th"), str)


def test_normalize_takes_linear_time_on_long_digit_runs():
    started = time.monotonic()
    normalize("9" * 50_000 + " $" + "9" * 50_000 + "%")
    assert time.monotonic() - started < 2  # a quadratic regex takes minutes here


# -- segmentation -------------------------------------------------------------------------------


def test_pieces_of_any_size_give_the_segments_of_the_whole_text():
    whole = segment(PARAGRAPH)
    rng = random.Random(7)
    for _ in range(40):
        assert segment(PARAGRAPH, random_pieces(PARAGRAPH, rng)) == whole
    one_char = segment(PARAGRAPH, list(PARAGRAPH))
    assert one_char == whole


@pytest.mark.parametrize("options", [{}, {"max_chars": 80}, {"target_chars": 150}])
def test_segments_partition_the_input_exactly(options: dict[str, int]):
    rng = random.Random(3)
    text = "  " + PARAGRAPH + PARAGRAPH + "  \n"
    segments = segment(text, random_pieces(text, rng), **options)
    assert_partition(segments, text)
    assert segments[-1].text.isspace()


def test_first_segment_ends_at_the_first_clause_after_four_words():
    text = (
        "Well, you know, I really think so, and then we left. Six, seven, eight nine ten, eleven."
    )
    assert texts(segment(text)) == [
        "Well, you know, I really think so,",
        " and then we left.",
        " Six, seven, eight nine ten, eleven.",
    ]
    assert texts(segment(text, first_min_words=None))[0] == (
        "Well, you know, I really think so, and then we left."
    )


def test_a_date_is_not_a_clause_boundary():
    text = "We met on March 5, 2024, at noon and talked."
    assert texts(segment(text)) == ["We met on March 5, 2024,", " at noon and talked."]


def test_first_segment_is_spoken_as_soon_as_its_clause_ends():
    segmenter = TextSegmenter()
    words = "Okay so the plan is , simple".split(" ")
    pushed = [segmenter.push(w if i == 0 else " " + w) for i, w in enumerate(words)]
    assert [texts(p) for p in pushed] == [[], [], [], [], [], [], ["Okay so the plan is ,"]]


def test_no_sentence_end_after_abbreviations_decimals_or_initials():
    text = (
        "I met Dr. Smith, Mr. Brown and Mrs. Green at 3.5 past nine, e.g. early, etc. and "
        "they quoted J. R. R. Tolkien on the U.S. economy. Done."
    )
    expected = [text[: -len(" Done.")], " Done."]
    assert texts(segment(text, first_min_words=None)) == expected
    assert texts(segment(text, list(text), first_min_words=None)) == expected


def test_a_cut_waits_for_the_whitespace_that_proves_it():
    segmenter = TextSegmenter()
    assert segmenter.push("It costs 3.") == []
    assert segmenter.push("5 dollars.") == []
    assert texts(segmenter.push(" Then")) == ["It costs 3.5 dollars."]
    assert texts(segmenter.flush()) == [" Then"]


def test_sentence_end_takes_its_closing_quotes_and_brackets():
    text = '"Stop!" He ran (fast.) Then he stopped?) Fine.'
    assert texts(segment(text)) == ['"Stop!"', " He ran (fast.)", " Then he stopped?)", " Fine."]


def test_long_sentences_are_cut_at_clauses_then_spaces_within_max_chars():
    clauses = ", ".join(["and the rain kept falling on the quiet little town"] * 20) + "."
    segments = segment(clauses, max_chars=120)
    assert_partition(segments, clauses)
    assert all(len(s.text) <= 120 for s in segments)
    assert all(s.text.endswith(",") for s in segments[:-1])

    words = " ".join(["word"] * 200)
    segments = segment(words, max_chars=100)
    assert_partition(segments, words)
    assert [len(s.text) for s in segments[:-1]] == [99] + [100] * (len(segments) - 2)


def test_a_word_longer_than_max_chars_is_cut_hard_but_not_inside_an_emotive_tag():
    word = "x" * 250
    assert [len(s) for s in texts(segment(word, max_chars=100))] == [100, 100, 50]
    tagged = "y" * 95 + "<laugh>" + "z" * 10
    assert texts(segment(tagged, list(tagged), max_chars=100)) == ["y" * 95, "<laugh>" + "z" * 10]


def test_short_sentences_merge_up_to_target_chars():
    text = "One. Two. Three. Four. Five six seven eight nine ten eleven twelve. End."
    assert texts(segment(text, first_min_words=None, target_chars=20)) == [
        "One. Two. Three.",
        " Four.",
        " Five six seven eight nine ten eleven twelve.",
        " End.",
    ]
    assert texts(segment(text, target_chars=20))[0] == "One."


def test_flush_starts_a_new_input():
    segmenter = TextSegmenter()
    assert segmenter.push("First input. ") == [Segment("First input.", 0, 12)]
    assert segmenter.flush() == [Segment(" ", 12, 13)]
    assert segmenter.push("Second, with four words here, yes.") == [
        Segment("Second, with four words here,", 0, 29)
    ]


def test_split_text_packs_whole_sentences_into_max_chars():
    text = (PARAGRAPH * 20)[:10_000]
    segments = split_text(text, max_chars=300)
    assert_partition(segments, text)
    assert all(len(s.text) <= 300 for s in segments)
    # The paragraph's sentences are at most 230 characters: a segment only ends early when the
    # next sentence would not fit.
    assert all(len(s.text) > 300 - 230 for s in segments[:-1])
    assert all(s.text.rstrip("\"')").endswith((".", "!", "?", "…")) for s in segments[:-1])


def test_segmenter_refuses_limits_it_cannot_keep():
    with pytest.raises(ValueError, match="max_chars"):
        TextSegmenter(max_chars=10)
    with pytest.raises(ValueError, match="first_min_words"):
        TextSegmenter(first_min_words=0)
    with pytest.raises(ValueError, match="target_chars"):
        TextSegmenter(max_chars=100, target_chars=101)


# -- boundaries the names above promise ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("One two three four, five six.", "One two three four,"),  # exactly four words: cut
        ("One two three, four five, six.", "One two three, four five,"),  # three: not yet
        ("<laugh> One two three, four, five.", "<laugh> One two three, four,"),  # tags don't count
        ("One two three four five; six.", "One two three four five;"),
        ("One two three four \N{EM DASH} five.", "One two three four \N{EM DASH}"),
        ("One two three four - five.", "One two three four -"),  # a spaced hyphen
        ("One two three four-five, six.", "One two three four-five,"),  # a hyphen inside a word
    ],
)
def test_the_first_segment_ends_at_the_first_clause_holding_four_words(text, first):
    assert texts(segment(text))[0] == first
    assert "".join(texts(segment(text))) == text


def test_first_min_words_sets_how_many_words_the_first_segment_needs():
    text = "Hi, there you are, my friend. Yes."
    assert texts(segment(text, first_min_words=1)) == ["Hi,", " there you are, my friend.", " Yes."]
    assert texts(segment(text, first_min_words=4))[0] == "Hi, there you are,"
    assert texts(segment(text, first_min_words=5))[0] == "Hi, there you are, my friend."


def test_only_the_first_segment_ends_early_at_a_clause():
    text = "One two three four, five. Six seven eight nine, ten eleven."
    assert texts(segment(text)) == [
        "One two three four,",
        " five.",
        " Six seven eight nine, ten eleven.",
    ]


@pytest.mark.parametrize("abbreviation", sorted(ABBREVIATIONS))
def test_no_sentence_ends_after_any_abbreviation_in_any_case(abbreviation):
    for spelled in (abbreviation, abbreviation.capitalize(), abbreviation.upper()):
        text = f"We asked {spelled}. Smith about it. Done."
        assert texts(segment(text, first_min_words=None)) == [
            f"We asked {spelled}. Smith about it.",
            " Done.",
        ]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Meet me on St. Mary's road. Done.", ["Meet me on St. Mary's road.", " Done."]),
        ("He lives on Baker St. Then he left.", ["He lives on Baker St. Then he left."]),
        ("(St. Louis) is far. Done.", ["(St. Louis) is far.", " Done."]),
        ('"St. Louis," he said. Done.', ['"St. Louis," he said.', " Done."]),
        ("We went to the Est. Then home.", ["We went to the Est.", " Then home."]),
        ("It was the first. Then home.", ["It was the first.", " Then home."]),
        ("Wait.. Then home.", ["Wait..", " Then home."]),
        ("Ask Dr.. Then home.", ["Ask Dr..", " Then home."]),
        ("He read J. Austen. Then home.", ["He read J. Austen.", " Then home."]),
        ("It was j. Then home.", ["It was j.", " Then home."]),  # a lower-case letter ends it
        ("In the U.S. economy. Done.", ["In the U.S. economy.", " Done."]),
    ],
)
def test_a_dot_ends_a_sentence_unless_it_ends_an_abbreviation_or_an_initial(text, sentences):
    assert texts(segment(text, first_min_words=None)) == sentences


@pytest.mark.parametrize(
    ("raw", "spoken"),
    [
        ("St. Louis", "Saint Louis"),
        ("Meet at St. Mary's.", "Meet at Saint Mary's."),
        ("St Louis", "Saint Louis"),  # without the dot too, before a name
        ("Baker St.", "Baker Street"),
        ("Baker St. is long", "Baker Street is long"),
        ("Baker St, London", "Baker St, London"),  # no dot and no name after it: left alone
        ("Stan. Louis", "Stan. Louis"),
        ("1st. Louis", "first. Louis"),
    ],
)
def test_st_is_a_saint_before_a_name_and_a_street_otherwise(raw, spoken):
    assert normalize(raw) == spoken


# Each rule of normalize at its edges: the values either side of a range, every spelling a
# pattern takes, and the text around a replacement.
NORMALISED_EDGES = [
    # clock times: o'clock up to 12, "hundred" for 13..24, 25 is no time; "oh" below 10 minutes
    ("at 10:00", "at ten o'clock"),
    ("at 09:00", "at nine o'clock"),
    ("at 12:00", "at twelve o'clock"),
    ("at 13:00", "at thirteen hundred"),
    ("at 24:00", "at twenty-four hundred"),
    ("at 25:00", "at twenty-five:zero zero"),
    ("at 25:30", "at twenty-five:thirty"),
    ("at 00:30", "at zero thirty"),
    ("at 3:00 pm", "at three p m"),
    ("at 7:01", "at seven oh one"),
    ("at 7:09", "at seven oh nine"),
    ("at 7:10", "at seven ten"),
    ("at 10:30", "at ten thirty"),
    ("at 5 AM", "at five a m"),
    ("at 5 Pm", "at five p m"),
    ("at 09 am", "at nine a m"),
    ("at 10 pm", "at ten p m"),
    ("at 5 a.m. and then", "at five a m and then"),  # the dot ends no sentence here
    ("at 5 a.m. Then we", "at five a m. Then we"),
    ("at 5:30 P.M.", "at five thirty p m."),
    # dates: months 1..12, days 1..31
    ("2024-01-01", "January first, twenty twenty-four"),
    ("2024-12-31", "December thirty-first, twenty twenty-four"),
    ("2024-13-01", "two thousand and twenty-four-thirteen-zero one"),
    ("2024-00-10", "two thousand and twenty-four-zero zero-ten"),
    ("2024-02-00", "two thousand and twenty-four-zero two-zero zero"),
    ("2024-02-32", "two thousand and twenty-four-zero two-thirty-two"),
    ("on 1 March", "on the first of March"),
    ("on 31 March", "on the thirty-first of March"),
    ("on 32 March", "on thirty-two March"),
    ("on 0 March", "on zero March"),
    ("March 1", "March first"),
    ("March 31", "March thirty-first"),
    ("March 32", "March thirty-two"),
    ("March 0", "March zero"),
    ("Sept. 5", "September fifth"),
    ("Jan. 5, 2024", "January fifth, twenty twenty-four"),
    ("in March 2024", "in March twenty twenty-four"),
    ("Sept 1999", "September nineteen ninety-nine"),
    # years and decades
    ("1999-2004", "nineteen ninety-nine to two thousand and four"),
    ("1999\N{EN DASH}2004", "nineteen ninety-nine to two thousand and four"),
    ("from 1999-2004", "from nineteen ninety-nine to two thousand and four"),
    ("in 1999 \N{EN DASH} 2004", "in nineteen ninety-nine to two thousand and four"),
    ("between 1990 and 2000", "between nineteen ninety and two thousand"),
    ("until 2010 through 2012", "until twenty ten through twenty twelve"),
    ("the 80s", "the eighties"),
    ("the '90s", "the nineties"),
    ("the 1920s", "the nineteen twenties"),
    ("the 1900s", "the nineteen hundreds"),
    ("the 2000s", "the two thousands"),
    # numbers: a leading zero or more than 15 digits is read digit by digit
    ("0", "zero"),
    ("00", "zero zero"),
    ("05", "zero five"),
    ("10", "ten"),
    (
        "123456789012345",
        "one hundred and twenty-three trillion four hundred and fifty-six billion seven hundred"
        " and eighty-nine million twelve thousand three hundred and forty-five",
    ),
    (
        "1234567890123456",
        "one two three four five six seven eight nine zero one two three four five six",
    ),
    ("1,000,000", "one million"),
    ("12,345.678", "twelve thousand three hundred and forty-five point six seven eight"),
    ("the 1,234th", "the one thousand two hundred and thirty-fourth"),
    ("the 100th", "the one hundredth"),
    ("1.2.3", "one point two point three"),
    (
        "192.168.0.1",
        "one hundred and ninety-two point one hundred and sixty-eight point zero point one",
    ),
    (".5", "point five"),
    ("costs .75", "costs point seven five"),
    ("\N{MINUS SIGN}7", "minus seven"),
    ("x-7", "x-seven"),  # a hyphen after a word is no minus sign
    # money: cents to two places, more places or no subunit read as a decimal
    ("$1,000", "one thousand dollars"),
    ("$1,000.50", "one thousand dollars, fifty cents"),
    ("$0.5", "fifty cents"),
    ("$1.01", "one dollar, one cent"),
    ("$0.01", "one cent"),
    ("$0", "zero dollars"),
    ("$3.505", "three point five zero five dollars"),
    ("\N{YEN SIGN}500.5", "five hundred point five yen"),
    ("-$5", "minus five dollars"),
    ("5\N{EURO SIGN}", "five euros"),
    ("$1.5m", "one point five million dollars"),
    ("$2bn", "two billion dollars"),
    ("$2 billion", "two billion dollars"),
    ("-5%", "minus five percent"),
    ("3.5%", "three point five percent"),
    ("1.5 km", "one point five kilometers"),
    ("-5 \N{DEGREE SIGN}C", "minus five degrees Celsius"),
    # abbreviations: capitalised like the original, a dot kept only where a sentence ends
    ("E.g. this", "For example this"),
    ("I.e. this", "That is this"),
    ("Vs. that", "Versus that"),
    ("Approx. 5", "Approximately five"),
    ("apples, etc. and pears", "apples, et cetera and pears"),
    ("Jr. is here", "Junior is here"),
    ("Mr Smith", "Mister Smith"),
    ("Dr Smith", "Doctor Smith"),
    ("Ms Jones", "Miz Jones"),
    ("Prof. X", "Professor X"),
    ("Gen. Lee", "General Lee"),
    ("Mt. Fuji", "Mount Fuji"),
    ("Capt. Kirk", "Captain Kirk"),
    ("Rev. Green", "Reverend Green"),
    ("you & me", "you and me"),
    ("No.5", "number five"),
    # words replacing digits glued to letters keep a space from them
    ("a 3D film", "a three D film"),
    ("size A4 paper", "size A four paper"),
    ("4x4", "four x four"),
]


@pytest.mark.parametrize(("raw", "spoken"), NORMALISED_EDGES)
def test_normalize_at_the_edges_of_each_rule(raw: str, spoken: str):
    assert normalize(raw) == spoken


# -- segmentation at its edges: limits, emotive tags at the limit, merging ----------------------


def lengths(segments: list[Segment]) -> list[int]:
    return [len(s.text) for s in segments]


def test_a_mark_other_than_a_dot_ends_a_sentence_even_after_an_abbreviation():
    assert texts(segment("Ask the Dr! Then home.", first_min_words=None)) == [
        "Ask the Dr!",
        " Then home.",
    ]
    assert texts(segment("Dr. Smith is here. Done.", first_min_words=None)) == [
        "Dr. Smith is here.",  # an abbreviation at the very start of the input
        " Done.",
    ]


@pytest.mark.parametrize("dashes", ["--", " --", " -"])
def test_dashes_end_a_clause(dashes: str):
    assert texts(segment(f"One two three four{dashes} five."))[0] == f"One two three four{dashes}"


def test_max_chars_is_at_least_two_emotive_tags_long():
    assert TextSegmenter(max_chars=66).max_chars == 66
    with pytest.raises(ValueError, match="max_chars must be at least 66, not 65"):
        TextSegmenter(max_chars=65)


def test_split_text_keeps_the_max_chars_it_is_given():
    text = "One two three four five six seven. " * 10
    segments = split_text(text, max_chars=100)
    assert_partition(segments, text)
    assert lengths(segments) == [69, 70, 70, 70, 71]  # two sentences each, never three
    long = ("word " * 30 + "end. ") * 2  # sentences of 155 characters: cut at a space
    assert lengths(split_text(long, max_chars=100)) == [99, 55, 100, 56]


def test_nothing_in_gives_no_segment():
    assert TextSegmenter().flush() == [] and segment("") == []


def test_a_one_letter_first_word_is_a_place_to_cut():
    assert lengths(segment("I " + "x" * 150, max_chars=100))[:2] == [1, 100]


@pytest.mark.parametrize(
    ("text", "pieces", "cut"),
    [
        ("x" * 150 + "<laugh> y", None, [100, 59]),  # a tag after the limit does not move it
        ("x" * 70 + "<a>" + "x" * 22 + "<laugh>" + "z" * 10, None, [95, 17]),  # the last tag
        ("x" * 97 + "<a>" + "y" * 10, None, [100, 10]),  # a tag that ends at the limit stays
        ("y" * 95 + "<" + "a" * 40, None, [100, 36]),  # no tag: "<" and 31 letters, no ">"
        ("y" * 95 + "<laugh", None, [100, 1]),  # the input ended: it never became a tag
        ("y" * 95 + "<laugh> more words", "chars", [95, 18]),  # waits for the tag to close
        (
            "Hi there. " + "x" * 105 + "<laugh> end",
            ["Hi there. ", "x" * 105 + "<laugh> end"],
            [9, 100, 17],
        ),
    ],
)
def test_a_hard_cut_at_max_chars_moves_only_before_a_tag_that_spans_it(text, pieces, cut):
    pieces = list(text) if pieces == "chars" else pieces
    segments = segment(text, pieces, max_chars=100)
    assert_partition(segments, text)
    assert lengths(segments) == cut


def test_an_ordinal_of_more_than_15_digits_is_read_digit_by_digit():
    assert normalize("the 123456789012345th").endswith("three hundred and forty-fifth")
    spoken = normalize("the 1234567890123456th")
    assert spoken.startswith("the one two three four five six seven eight nine zero one")
    assert "sixth" not in spoken


def test_a_run_of_spaces_is_no_segment_of_its_own():
    segments = segment("One.  " + "x" * 150, max_chars=100)
    assert_partition(segments, "One.  " + "x" * 150)
    assert lengths(segments) == [4, 100, 52]


def test_a_tag_that_never_closes_is_cut_at_the_limit_once_a_space_shows_it_is_no_tag():
    text = "y" * 95 + "<laugh more words"
    segments = segment(text, list(text), max_chars=100)
    assert_partition(segments, text)
    assert lengths(segments) == [100, 12]


def test_a_hard_cut_comes_out_as_soon_as_the_text_past_the_limit_is_known():
    segmenter = TextSegmenter(max_chars=100)
    assert lengths(segmenter.push("y" * 95 + "<" + "a" * 40 + " more")) == [100]


@pytest.mark.parametrize(
    ("text", "target", "merged"),
    [
        ("One. Two. Three.", 9, ["One. Two.", " Three."]),  # exactly target_chars: merged
        ("One. Two. Three. Four.", 10, ["One. Two.", " Three.", " Four."]),
        ("One. Two three four.", 10, ["One.", " Two three four."]),  # the last one too long
        ("A. Eee ff gg. Eee ff gg. H. A.", 17, ["A. Eee ff gg.", " Eee ff gg. H. A."]),
    ],
)
def test_sentences_merge_while_they_fit_in_target_chars(text, target, merged):
    assert texts(segment(text, first_min_words=None, target_chars=target)) == merged


# --- the whole stage: lexicon, then segments, then normalisation --------------------------------


def test_the_stage_says_the_lexicons_aliases_cuts_then_normalises_each_segment():
    lexicon = Lexicon([LexiconEntry("W3C", "web consortium")])
    text = "The W3C met on 3 May. " * 10 + "It cost $5."
    segments = TextStage(lexicon, max_chars=80).whole(text)
    assert len(segments) > 1 and all(len(s.speech) <= 80 for s in segments)
    # each segment's span is of the input as given (word timing points into it)
    assert "".join(s.text for s in segments) == text
    assert all(text[s.start : s.end] == s.text for s in segments)
    assert "web consortium" in segments[0].speech and "W3C" not in segments[0].speech
    assert segments[0].speech.count("third") == 2  # "3 May", normalised once cut
    assert "five dollars" in segments[-1].speech
    plain = TextStage(lexicon, max_chars=80, normalise=False).whole(text)
    assert "".join(s.speech for s in plain) == lexicon.apply(text)  # cut in what is said
    assert all(len(s.speech) <= 80 for s in plain)
    with pytest.raises(TextTooLong, match=r"says \d+ characters; the limit is 100"):
        TextStage(lexicon).whole("W3C " * 30, limit=100)  # 120 characters, said as 450


def test_streamed_text_counts_what_is_said_before_normalising_and_keeps_input_spans():
    text = "Ask the W3C about 42 rules. Then rest."
    streamed = TextStage(Lexicon([LexiconEntry("W3C", "web consortium")])).streamed()
    segments = [s for piece in text.split(" ") for s in streamed.push(piece + " ")]
    segments += streamed.flush()
    assert "".join(s.text for s in segments).strip() == text  # spans of the input as sent
    said = "Ask the web consortium about 42 rules. Then rest. "
    assert streamed.said == len(said)  # aliases counted, normalisation not
    assert "forty-two" in segments[0].speech or "forty two" in segments[0].speech


@pytest.mark.parametrize(
    "text",
    [
        "$" + "9" * 300,  # a few hundred characters, 1,500 of words
        "Pay " + "$" + "9" * 300 + " now, please.",
        "7" * 1000,  # a long run of digits, read as digits
        " ".join(["12345678901234"] * 20),  # a text of numbers only, at 300 characters
    ],
)
def test_a_segment_that_normalising_makes_too_long_is_cut_again_between_words(text):
    """Normalising can turn a segment of at most ``max_chars`` into many times that (the
    engine's context holds the speech of ``max_chars``): it is cut again, between words; the
    first piece keeps the segment's span, the others follow with empty spans, so segments still
    tile the input. Whole and streamed alike."""
    stage = TextStage(max_chars=300)
    streamed = stage.streamed()
    pieces = streamed.push(text) + streamed.flush()
    for segments in (stage.whole(text), pieces):
        assert all(len(s.speech) <= 300 for s in segments), [len(s.speech) for s in segments]
        said = " ".join(s.speech for s in segments).split()
        expected = " ".join(normalize(s.text) for s in split_text(text, 300)).split()
        assert said == expected  # every word, once, in order
        assert all(text[s.start : s.end] == s.text for s in segments)
        assert "".join(s.text for s in segments) == text


def test_a_word_longer_than_a_segment_is_cut_inside_it():
    assert fit("a " + "b" * 25 + " c", 10) == ["a", "bbbbbbbbbb", "bbbbbbbbbb", "bbbbb c"]
    assert fit("fits as it is", 13) == ["fits as it is"]
