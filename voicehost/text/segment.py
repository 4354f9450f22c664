"""Segmentation: raw text -> segments that partition it exactly (see ``voicehost.text``).

``TextSegmenter`` cuts text that arrives in pieces (an LLM's output, word by word), ``split_text``
a complete text. Cuts fall only where whitespace follows, so a number or an emotive tag is never
split across two segments.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from enum import IntEnum

from voicehost.text import CLOSERS, EN_DASH, TAG

DEFAULT_MAX_CHARS = 300
DEFAULT_FIRST_MIN_WORDS = 4

_TAG_PREFIX = re.compile(r"<[A-Za-z][\w-]{0,30}(>)?")
_MAX_TAG_CHARS = 33
MIN_MAX_CHARS = 2 * _MAX_TAG_CHARS  # the least max_chars: two emotive tags

# Words ending in "." after which a sentence does not end (compared lower-case, without the dot).
ABBREVIATIONS = frozenset(
    {
        "dr", "mr", "mrs", "ms", "prof", "st", "mt", "jr", "sr", "gen", "col", "capt", "lt",
        "sgt", "rev", "vs", "etc", "e.g", "i.e", "approx", "cf", "viz",
    }
)  # fmt: skip
# Devanagari's danda and double danda end a sentence as "." does (a space follows them).
_SENTENCE_MARKS = ".!?…\N{DEVANAGARI DANDA}\N{DEVANAGARI DOUBLE DANDA}" + "。！？"
_CLAUSE_MARKS = f",;:\N{EM DASH}{EN_DASH}" + "，、；："
# Chinese and Japanese write no space after a mark: the text may be cut right after these.
_WIDE_SENTENCE_MARKS = "。！？"
_WIDE_CLAUSE_MARKS = "，、；："
_WIDE_CLOSERS = "」』）】》〉〕\N{RIGHT DOUBLE QUOTATION MARK}\N{RIGHT SINGLE QUOTATION MARK}"
_ALL_CLOSERS = CLOSERS + _WIDE_CLOSERS
_NOT_AFTER_A_CUT = _ALL_CLOSERS + _SENTENCE_MARKS + _CLAUSE_MARKS
_WIDE_ENDS = _WIDE_SENTENCE_MARKS + _WIDE_CLAUSE_MARKS + _ALL_CLOSERS  # what may end before a cut
# Within a run of these (a number, a Latin word) a text without spaces is not cut if it can be.
_RUN = re.compile(r"[0-9A-Za-z.,:%]")
_MAX_RUN = 40
_OPENERS = "\"'\N{LEFT DOUBLE QUOTATION MARK}\N{LEFT SINGLE QUOTATION MARK}«([{"
_DAY_COMMA = re.compile(r"(?<![0-9])[0-9]{1,2}(?:st|nd|rd|th)?,\Z")
_INITIALS = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]|[A-Z]")


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of the input: ``text == whole_input[start:end]``; segments tile the input.
    ``spoken``: what is said instead, where a lexicon rewrote the text (``voicehost.text.lexicon``).
    """

    text: str
    start: int
    end: int
    spoken: str | None = None

    @property
    def speech(self) -> str:
        """The text to say (before normalisation)."""
        return self.text if self.spoken is None else self.spoken


class _Cut(IntEnum):
    """How good a place to cut is; a higher value is preferred."""

    SPACE = 1
    CLAUSE = 2
    SENTENCE = 3


def _is_wide(char: str) -> bool:
    """A wide character: Han, kana, Hangul, full-width forms."""
    return unicodedata.east_asian_width(char) in "WF"


def _is_unspaced(char: str) -> bool:
    """A character of a script written without spaces between words (Han, kana): each counts
    as a word. Korean writes spaces between words, so Hangul does not."""
    return _is_wide(char) and not ("\uac00" <= char <= "\ud7a3" or "\u1100" <= char <= "\u11ff")


def _classify(token: str) -> _Cut:
    """The boundary after ``token`` (a run of non-space characters followed by whitespace)."""
    core = token.rstrip(_ALL_CLOSERS)
    if core and core[-1] in _SENTENCE_MARKS:
        if core[-1] != "." or core.endswith(".."):
            return _Cut.SENTENCE
        word = core[:-1].lstrip(_OPENERS)
        if word.lower() in ABBREVIATIONS or _INITIALS.fullmatch(word):
            return _Cut.SPACE
        return _Cut.SENTENCE
    if _DAY_COMMA.search(core):
        return _Cut.SPACE  # the day of "March 5, 2024": the year belongs with it
    if core and (core[-1] in _CLAUSE_MARKS or core == "-" or core.endswith("--")):
        return _Cut.CLAUSE
    return _Cut.SPACE


def _wide_cut(buffer: str, i: int) -> _Cut | None:
    """The boundary before ``buffer[i]`` (not a space) when a full-width mark ends there."""
    if buffer[i - 1] not in _WIDE_ENDS or buffer[i] in _NOT_AFTER_A_CUT:
        return None
    j = i - 1
    while j > 0 and buffer[j] in _ALL_CLOSERS and i - j < 4:
        j -= 1
    if buffer[j] in _WIDE_SENTENCE_MARKS:
        return _Cut.SENTENCE
    if buffer[j] in _WIDE_CLAUSE_MARKS:
        return _Cut.CLAUSE
    return None


def _word_count(text: str) -> int:
    """Words, with each character of a script written without spaces counted as one."""
    return sum(
        max(1, sum(map(_is_unspaced, token))) for token in text.split() if not TAG.fullmatch(token)
    )


class TextSegmenter:
    """Cuts text that arrives in pieces (an LLM's output, word by word) into speakable segments.

    ``push`` returns the segments that are complete so far, ``flush`` the rest of the input. The
    segments, in order, partition the concatenation of all pushed pieces exactly (offsets are into
    it), and the result does not depend on how the input was split into pieces. After ``flush``
    the segmenter starts a new input: offsets restart at 0 and the first-segment rule applies again.

    Rules:
    - A cut needs whitespace after it (or the end of the input at flush), so a word is never cut
      while more text may come. The whitespace starts the next segment.
    - A sentence ends after ``. ! ? …`` and Devanagari's ``। ॥`` (and closing quotes or brackets
      after them), but not after an abbreviation (``ABBREVIATIONS``: Dr. Mr. e.g. etc. ...) or
      an initial (J. R. R., U.S.). Chinese and Japanese marks (``。！？`` end a sentence,
      ``，、；：`` a clause) need no whitespace after them: the cut is right after the mark
      and its closing quotes, once the next character shows it is not another mark.
    - The first segment ends early, at the first clause boundary (``, ; :``, an em or en dash or
      a spaced hyphen; not the comma after a day as in "March 5, 2024") once it holds
      ``first_min_words`` words (emotive tags do not count), so speech can start before the first
      sentence is complete; ``None`` turns this off.
    - Every segment is at most ``max_chars`` characters: a longer one is cut at its last sentence
      end, else its last clause boundary, else its last space before the limit; a single word
      longer than that is cut hard (outside emotive tags, and in text without spaces not inside
      a number or Latin word that follows a Han or Hangul character). Whitespace counts as
      characters.
    - With ``target_chars`` > 0, consecutive sentences are merged into one segment while it stays
      within ``target_chars`` (the first segment is not merged when ``first_min_words`` is set).
      Merging waits for the next sentence, so it adds latency; 0 (the default) emits every
      sentence as soon as it ends.

    A blank segment (whitespace only) comes at flush, from trailing whitespace, and mid-stream only
    from a run of whitespace about as long as ``max_chars``; callers skip blank segments.
    """

    def __init__(
        self,
        max_chars: int = DEFAULT_MAX_CHARS,
        first_min_words: int | None = DEFAULT_FIRST_MIN_WORDS,
        target_chars: int = 0,
    ) -> None:
        if max_chars < MIN_MAX_CHARS:
            raise ValueError(f"max_chars must be at least {MIN_MAX_CHARS}, not {max_chars}")
        if first_min_words is not None and first_min_words < 1:
            raise ValueError(f"first_min_words must be at least 1 or None, not {first_min_words}")
        if not 0 <= target_chars <= max_chars:
            raise ValueError(f"target_chars must be in 0..max_chars, not {target_chars}")
        self.max_chars = max_chars
        self.first_min_words = first_min_words
        self.target_chars = target_chars
        self._reset()

    def _reset(self) -> None:
        self._buffer = ""  # the input from offset self._base on
        self._base = 0
        self._start = 0  # where the next segment begins
        self._scanned = 0  # offsets below this have been judged as places to cut
        self._cuts: list[tuple[int, _Cut]] = []  # places to cut in (start, scanned), in order
        self._emitted = 0

    def push(self, piece: str) -> list[Segment]:
        """Add the next piece of input; return the segments completed by it (often none)."""
        self._buffer += piece
        out: list[Segment] = []
        self._scan(out)
        return out

    def flush(self) -> list[Segment]:
        """End the input: return its remaining segments and start over."""
        out: list[Segment] = []
        self._scan(out)
        end = self._base + len(self._buffer)
        self._enforce_limit(end, out, final=True)
        if end > self._start:
            self._on_cut(end, _Cut.SENTENCE, out)
        if end > self._start:
            self._emit(end, out)
        self._reset()
        return out

    def _scan(self, out: list[Segment]) -> None:
        end = self._base + len(self._buffer)
        for p in range(max(self._scanned, 1), end):
            kind = self._judge(p)
            if kind is not None and p > self._start:
                self._on_cut(p, kind, out)
            self._enforce_limit(p + 1, out, final=False)
        self._scanned = max(self._scanned, end)
        self._buffer = self._buffer[self._start - self._base :]
        self._base = self._start

    def _judge(self, p: int) -> _Cut | None:
        """Whether and how well the input can be cut before offset ``p`` (``p`` is known)."""
        buffer, i = self._buffer, p - self._base
        if i == 0 or buffer[i - 1].isspace():
            return None
        if not buffer[i].isspace():
            return _wide_cut(buffer, i)
        j = i - 1
        while j > 0 and not buffer[j - 1].isspace():
            j -= 1
        return _classify(buffer[j:i])

    def _on_cut(self, p: int, kind: _Cut, out: list[Segment]) -> None:
        length = p - self._start
        early_words = self.first_min_words if self._emitted == 0 else None
        if length > self.max_chars:
            # Only while a hard cut waits for an emotive tag to end; _enforce_limit cuts earlier.
            self._cuts.append((p, kind))
        elif kind is _Cut.SENTENCE:
            if early_words is not None or self.target_chars == 0:
                self._emit(p, out)
            elif length <= self.target_chars:
                self._cuts.append((p, kind))
            else:
                merged = [cut for cut, k in self._cuts if k is _Cut.SENTENCE]
                if merged:
                    self._emit(merged[-1], out)
                if merged and p - self._start <= self.target_chars:
                    self._cuts.append((p, kind))
                else:
                    self._emit(p, out)
        elif (
            kind is _Cut.CLAUSE
            and early_words is not None
            and _word_count(self._text(self._start, p)) >= early_words
        ):
            self._emit(p, out)
        else:
            self._cuts.append((p, kind))

    def _enforce_limit(self, known: int, out: list[Segment], final: bool) -> None:
        """Cut while more than ``max_chars`` characters up to offset ``known`` are pending."""
        while known - self._start > self.max_chars:
            limit = self._start + self.max_chars
            usable = [(kind, cut) for cut, kind in self._cuts if cut <= limit]
            if usable:
                self._emit(max(usable)[1], out)
                continue
            cut = self._hard_cut(limit, known, final)
            if cut is None:
                return
            self._emit(cut, out)

    def _hard_cut(self, limit: int, known: int, final: bool) -> int | None:
        """Where to cut a word at ``limit``: before an emotive tag that spans it; None to wait."""
        lo = max(self._start, limit - _MAX_TAG_CHARS) - self._base
        i = self._buffer.rfind("<", lo, limit - self._base)
        if i < 0:
            return self._outside_run(limit)
        match = _TAG_PREFIX.match(self._buffer, i, known - self._base)
        if match is None:
            return self._outside_run(limit)
        tag_start, tag_end = self._base + i, self._base + match.end()
        if match.group(1) is not None:
            return tag_start if tag_end > limit and tag_start > self._start else limit
        if tag_end == known and not final:
            return None  # the tag may still close past the limit
        return limit

    def _outside_run(self, cut: int) -> int:
        """``cut``, or the start of the number or Latin word it falls in when a character of a
        script without spaces comes before that (``2024年3月`` is not cut inside ``2024``)."""
        buffer, i = self._buffer, cut - self._base
        if i >= len(buffer) or not (_RUN.match(buffer[i - 1]) and _RUN.match(buffer[i])):
            return cut
        j = i - 1
        while j > 0 and _RUN.match(buffer[j - 1]) and i - j < _MAX_RUN:
            j -= 1
        if self._base + j > self._start and _is_wide(buffer[j - 1]):
            return self._base + j
        return cut

    def _text(self, start: int, end: int) -> str:
        return self._buffer[start - self._base : end - self._base]

    def _emit(self, cut: int, out: list[Segment]) -> None:
        out.append(Segment(self._text(self._start, cut), self._start, cut))
        self._start = cut
        self._emitted += 1
        self._cuts = [(p, kind) for p, kind in self._cuts if p > cut]


def split_text(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[Segment]:
    """Cut a complete text into segments of whole sentences, packed up to ``max_chars`` each.

    The segments partition ``text`` exactly. A sentence longer than ``max_chars`` is cut as
    ``TextSegmenter`` cuts it (last clause boundary, else last space, else hard).
    """
    segmenter = TextSegmenter(max_chars=max_chars, first_min_words=None, target_chars=max_chars)
    return segmenter.push(text) + segmenter.flush()


def fit(spoken: str, max_chars: int) -> list[str]:
    """``spoken`` (a segment's words as normalised: a number can become many words) in pieces
    of at most ``max_chars`` characters, cut between words; a word longer than that is cut
    inside it. One piece, itself, when it fits (the engine's context is sized for a segment
    of ``max_chars``: see ``Settings``)."""
    if len(spoken) <= max_chars:
        return [spoken]
    pieces: list[str] = []
    current = ""
    for word in spoken.split():
        while len(word) > max_chars:  # no space to cut at
            if current:
                pieces.append(current)
                current = ""
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if current and len(current) + 1 + len(word) > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current} {word}" if current else word
    if current:
        pieces.append(current)
    return pieces
