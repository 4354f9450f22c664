"""The text stage, whole and in one place: what a caller sent -> the segments the engine says.

Three steps, in this order: a lexicon's aliases (``lexicon``: what is said for a word), cutting
into segments (``segment``: sentences packed up to ``max_chars`` of what is said), and
normalising each segment for the model (``normalize``: numbers, dates, units ... as words, by
the rules of the stage's ``language``).
A request's whole input goes through ``TextStage.whole``; a socket's text, arriving in pieces,
through ``TextStage.streamed``. Each segment keeps its span of the input (``text``, ``start``,
``end``); ``speech`` is what the engine is prompted with. Nothing after this stage rewrites text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

from voicehost.errors import ServiceError
from voicehost.text.lexicon import Lexicon, SpokenSegmenter
from voicehost.text.normalize import normalize
from voicehost.text.segment import (
    DEFAULT_MAX_CHARS,
    MIN_MAX_CHARS,
    Segment,
    TextSegmenter,
    fit,
    split_text,
)


class TextTooLong(ServiceError, ValueError):
    """Input longer than the limit, as sent or as its lexicons' aliases make it say."""

    code = "input_too_long"

    def __init__(self, said: int, limit: int, *, lexicons: bool = True) -> None:
        says = "with its lexicons the input says" if lexicons else "input has"
        super().__init__(f"{says} {said} characters; the limit is {limit}")
        self.said = said
        self.limit = limit


class NothingToSay(ServiceError, ValueError):
    """Input with no letter or digit in it: nothing a voice could say."""

    code = "empty_input"


def has_speech(text: str) -> bool:
    """Whether ``text`` has something a voice could say (a letter or digit)."""
    return any(ch.isalnum() for ch in text)


def check_input(text: str, max_chars: int) -> None:
    """``NothingToSay`` for input without a letter or digit, ``TextTooLong`` past
    ``max_chars`` (as sent, before lexicons)."""
    if not has_speech(text):
        raise NothingToSay("input is empty or has nothing to say")
    if len(text) > max_chars:
        raise TextTooLong(len(text), max_chars, lexicons=False)


# How much longer a character of these languages takes to say than a Latin letter: a Han
# character is a syllable (about three letters of English), a Hangul block about two letters.
# A segment of them holds that many times fewer characters, so its speech fits as English does.
CHARACTER_WEIGHTS = {"zh": 3, "ja": 3, "yue": 3, "ko": 2}


def primary_language(tag: str) -> str:
    """A BCP-47 tag's language: ``"zh-Hans-CN"`` -> ``"zh"``."""
    return tag.replace("_", "-").partition("-")[0].lower()


def speech_length(text: str) -> int:
    """``text``'s length in Latin letters of speech, by each character's script (a Han
    character three, a Hangul block two, anything else one): what the engine's audio budget
    counts for a segment, whatever language its voice speaks."""
    if text.isascii():
        return len(text)
    total = 0
    for ch in text:
        code = ord(ch)
        if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
            total += 3
        elif 0xAC00 <= code <= 0xD7A3:
            total += 2
        else:
            total += 1
    return total


@dataclass(frozen=True)
class TextStage:
    """How one request's or socket's text becomes segments: its lexicon (``None``: words are
    said as written), the longest segment (in Latin letters: ``speech_length``), whether numbers
    and the like are normalised, and the language (a BCP-47 tag) whose rules do that. A
    language without rules (``normalize.normalizer``) is said as written."""

    lexicon: Lexicon | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    normalise: bool = True
    language: str = "en"

    @property
    def segment_chars(self) -> int:
        """The longest segment in characters of its language (at least the segmenter's least)."""
        weight = CHARACTER_WEIGHTS.get(primary_language(self.language), 1)
        return self.max_chars if weight == 1 else max(MIN_MAX_CHARS, self.max_chars // weight)

    def whole(self, text: str, limit: int | None = None) -> list[Segment]:
        """A complete input's segments; ``TextTooLong`` where the lexicon makes it say more
        than ``limit`` characters."""
        said = self.lexicon.apply(text) if self.lexicon else text
        if limit is not None and len(said) > limit:
            raise TextTooLong(len(said), limit)
        if self.lexicon:  # cut in what is said; each segment keeps its span of the input
            cutter = SpokenSegmenter(self.lexicon, self.segment_chars, whole=True)
            segments = cutter.push(text) + cutter.flush()
        else:
            segments = split_text(text, self.segment_chars)
        return [piece for segment in segments for piece in self.finish(segment)]

    def say(self, text: str) -> str:
        """What the engine is given for ``text``: the lexicon's aliases, then normalised by the
        stage's language (each word of a segment is said as its part of this)."""
        said = self.lexicon.apply(text) if self.lexicon else text
        return normalize(said, self.language) if self.normalise else said

    def streamed(self) -> StreamedText:
        """A segmenter for text that arrives in pieces (the first segment cut early)."""
        return StreamedText(self)

    def finish(self, segment: Segment) -> list[Segment]:
        """The last step: ``segment`` with its speech normalised; cut again, between words,
        where normalising made it longer than ``max_chars`` (``$`` and 300 nines is 1,500
        characters of words: more speech than the engine's context holds for one segment).
        The first piece keeps the segment's span of the input, the others follow it with an
        empty span at its end, so segments still tile the input (and usage counts each
        character once)."""
        if not self.normalise:
            return [segment]
        first, *rest = fit(normalize(segment.speech, self.language), self.segment_chars)
        after = dataclasses.replace(segment, text="", start=segment.end)
        return [
            dataclasses.replace(segment, spoken=first),
            *(dataclasses.replace(after, spoken=piece) for piece in rest),
        ]


class StreamedText:
    """``TextStage`` over text that arrives in pieces: ``push`` each, ``flush`` at a flush or
    the end (offsets then count from 0 again). ``said`` counts the characters said so far, with
    the lexicon's aliases in place of its words (before normalisation), for a socket's cap."""

    def __init__(self, stage: TextStage) -> None:
        self.stage = stage
        self.said = 0
        self._cutter: TextSegmenter | SpokenSegmenter = (
            SpokenSegmenter(stage.lexicon, stage.segment_chars)
            if stage.lexicon
            else TextSegmenter(max_chars=stage.segment_chars)
        )

    def push(self, piece: str) -> list[Segment]:
        return self._finished(self._cutter.push(piece))

    def flush(self) -> list[Segment]:
        return self._finished(self._cutter.flush())

    def _finished(self, segments: list[Segment]) -> list[Segment]:
        self.said += sum(len(segment.speech) for segment in segments)
        return [piece for segment in segments for piece in self.stage.finish(segment)]


# a word: a run of letters and marks between spaces, or one character of a script written
# without them (Han, kana, full-width forms), as word timing counts them
UNSPACED = "\u3000-\u9fff\uf900-\ufaff\uff00-\uffef"
TIMED_WORDS = re.compile(f"[{UNSPACED}]|[^\\s{UNSPACED}]+")


class SaidWords:
    """What each word of one segment's ``text`` is said as (a timed word's ``said``), by
    ``say`` (``TextStage.say``): the part of ``say(text)`` that the word's span adds.

    A word is measured between boundaries where what is said for the text before them does
    not change later (``say(text[:b])`` is a prefix of ``say(text)``): ``42,50 €`` is said as
    one, "quarante-deux euros cinquante", and both its words carry it. Each prefix is said
    once; a segment whose text is said as written costs nothing."""

    def __init__(self, say: Callable[[str], str], text: str) -> None:
        self.say = say
        self.text = text
        self.whole = say(text)
        self.plain = self.whole == text  # said as written: a word is said as itself
        self.boundaries = [0, *(m.end() for m in TIMED_WORDS.finditer(text))]
        self._prefixes: dict[int, str | None] = {0: "", len(text): self.whole}

    def _stable(self, boundary: int) -> str | None:
        """What is said for ``text[:boundary]`` if it stays said so, else ``None``."""
        if boundary not in self._prefixes:
            said = self.say(self.text[:boundary]).rstrip()
            self._prefixes[boundary] = said if self.whole.startswith(said) else None
        return self._prefixes[boundary]

    def of(self, start: int, end: int) -> str:
        """What ``text[start:end]`` (a word's span) is said as."""
        if self.plain:
            return self.text[start:end]
        before = [b for b in self.boundaries if b <= start]
        after = [b for b in self.boundaries if b >= end] or [len(self.text)]
        head = next(p for b in reversed(before) if (p := self._stable(b)) is not None)
        tail = next(p for b in after if (p := self._stable(b)) is not None)
        return self.whole[len(head) : len(tail)].strip()
