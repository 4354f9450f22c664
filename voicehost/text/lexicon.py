"""Pronunciation lexicons: words and phrases said as something else (see ``voicehost.text``).

A lexicon maps a grapheme (a word or phrase as written) to an alias (what to say instead). It is
applied to the raw text, before segmentation and normalisation, with these rules:

- Whole words only: a match starts where no word character (``\\w``) comes before it and ends
  where none comes after it, so ``SQL`` is not found in ``MySQL`` nor in ``SQLite``.
- Case: an entry matches as written (``case_sensitive``) or in any case; for a grapheme spelt the
  same in both, the case-sensitive entry wins.
- Longest match first: at each place, the longest grapheme that matches is replaced; the scan
  goes on after it (an alias is never rewritten again).
- A space in a grapheme matches any one whitespace character.
- Emotive tags (``<laugh>``) are never looked into, so no entry rewrites one.
- Several lexicons are merged in order: for the same grapheme, the first lexicon's entry wins
  (as Amazon Polly applies a request's lexicons).

``Rewriter`` applies a lexicon to text that arrives in pieces: it holds back only a tail that an
entry might still match, and maps each offset of what it said back into the text it was given.
``SpokenSegmenter`` cuts the rewritten text as ``TextSegmenter`` does, while each segment keeps
its span of the original text (what the realtime socket reports) and carries what is said.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from voicehost.text import TAG
from voicehost.text.segment import DEFAULT_MAX_CHARS, Segment, TextSegmenter

_OPEN_TAG = re.compile(r"<(?:[A-Za-z][\w-]{0,30})?")  # a tag that may still close
_END = ""  # the key of a trie node's alias: no character is the empty string
_UNDECIDED = (-1, "")  # the text so far cannot tell whether (or how far) an entry matches here
_Trie = dict[str, "_Trie | str"]


@dataclass(frozen=True, slots=True)
class LexiconEntry:
    """Say ``alias`` where ``grapheme`` is written."""

    grapheme: str
    alias: str
    case_sensitive: bool = False


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"  # what ``\w`` matches in a str pattern


def _key(char: str, fold: bool) -> str:
    if char.isspace():
        return " "
    return char.lower() if fold else char


class Lexicon:
    """Entries ready to apply: a trie per case rule, and where a match may start."""

    def __init__(self, entries: Iterable[LexiconEntry] = ()) -> None:
        self._tries: tuple[_Trie, _Trie] = ({}, {})  # case-sensitive, then any case
        self._size = 0
        firsts: tuple[set[str], set[str]] = (set(), set())
        for entry in entries:
            fold = not entry.case_sensitive
            node = self._tries[fold]
            for char in entry.grapheme:
                node = node.setdefault(_key(char, fold), {})  # type: ignore[assignment]
            if _END not in node:  # the first entry for a grapheme wins
                node[_END] = entry.alias
                self._size += 1
                firsts[fold].add(_key(entry.grapheme[0], fold))
        starts = ["<"]
        if firsts[0]:
            starts.append(r"(?<!\w)[" + "".join(map(re.escape, sorted(firsts[0]))) + "]")
        if firsts[1]:
            starts.append(r"(?<!\w)(?i:[" + "".join(map(re.escape, sorted(firsts[1]))) + "])")
        self._starts = re.compile("|".join(starts))

    @classmethod
    def merged(cls, lexicons: Sequence[Sequence[LexiconEntry]]) -> Lexicon:
        """One lexicon of several, in order: the first one's entry wins for a grapheme."""
        return cls(entry for entries in lexicons for entry in entries)

    def __len__(self) -> int:
        return self._size

    def apply(self, text: str) -> str:
        """``text`` with every match replaced by its alias."""
        if not self._size:
            return text
        rewriter = Rewriter(self)
        return rewriter.push(text) + rewriter.flush()

    def _longest(self, text: str, start: int, final: bool) -> tuple[int, str] | None:
        """The end and alias of the longest entry matching ``text`` at ``start`` (a word
        start), ``None`` if none does, ``_UNDECIDED`` if more text could change the answer."""
        best: tuple[int, str] | None = None
        for fold, trie in enumerate(self._tries):
            node: _Trie = trie
            at = start
            while True:
                alias = node.get(_END)
                if isinstance(alias, str):
                    if at == len(text) and not final:
                        return _UNDECIDED  # the next character decides whether the word ends
                    ends = at == len(text) or not _is_word(text[at])
                    if ends and (best is None or at > best[0]):
                        best = (at, alias)
                if at == len(text):
                    if not final and len(node) > isinstance(alias, str):
                        return _UNDECIDED  # a longer grapheme may still follow
                    break
                child = node.get(_key(text[at], bool(fold)))
                if not isinstance(child, dict):
                    break
                node, at = child, at + 1
        return best


class Rewriter:
    """Applies a lexicon to text that arrives in pieces, keeping the offset map.

    ``push`` returns the rewritten text decided so far: a tail that an entry (or an emotive tag)
    may still match is held back until more text comes or ``flush``. The concatenated output
    does not depend on how the input was cut into pieces. ``source_offset`` maps an offset into
    the output back into the input: one inside an alias maps to the end of the words it
    replaced.
    """

    def __init__(self, lexicon: Lexicon) -> None:
        self.lexicon = lexicon
        self._pending = ""  # input not yet decided
        self._before = ""  # the input character before it (for the word-start rule)
        self._source = 0  # input characters decided
        self._said = 0  # output characters produced
        self._out_starts: list[int] = []
        self._changes: list[tuple[int, int, int, int]] = []  # out start, out end, in start, end

    def push(self, piece: str) -> str:
        self._pending += piece
        return self._rewrite(final=False)

    def flush(self) -> str:
        """The rest of the output: the input has ended."""
        return self._rewrite(final=True)

    def _rewrite(self, final: bool) -> str:
        text = self._before + self._pending
        base = len(self._before)
        out: list[str] = []
        said = self._said  # output characters, with those in out
        done = position = base  # text[base:done] is in out
        stop = len(text)
        while (found := self.lexicon._starts.search(text, position)) is not None:
            at = found.start()
            if text[at] == "<" and (tag := TAG.match(text, at)) is not None:
                position = tag.end()
                continue
            if text[at] == "<" and not final and _OPEN_TAG.fullmatch(text, at):
                stop = at
                break
            match = self.lexicon._longest(text, at, final)
            if match is _UNDECIDED:
                stop = at
                break
            if match is None:
                position = at + 1
                continue
            end, alias = match
            out += (text[done:at], alias)
            said += at - done
            source = self._source + at - base
            self._out_starts.append(said)
            self._changes.append((said, said + len(alias), source, source + end - at))
            said += len(alias)
            done = position = end
        out.append(text[done:stop])
        self._source += stop - base
        self._said = said + stop - done
        self._pending = text[stop:]
        self._before = text[stop - 1] if stop > 0 else self._before
        return "".join(out)

    def source_offset(self, said: int) -> int:
        """Where offset ``said`` of the output falls in the input."""
        index = bisect_right(self._out_starts, said) - 1
        if index < 0:
            return said
        out_start, out_end, in_start, in_end = self._changes[index]
        if said == out_start:
            return in_start
        if said < out_end:
            return in_end
        return in_end + said - out_end


class SpokenSegmenter:
    """``TextSegmenter`` over the lexicon's rewrite of the input, with the input's spans.

    Segments are cut in the text that is said (so ``max_chars`` bounds what the engine gets),
    and each keeps its span of the input as given: ``text`` and ``start``/``end`` are the
    input's, ``spoken`` what is said. Spans tile the input as ``TextSegmenter``'s do; a segment
    cut inside an alias has the replaced words in the span before it.
    """

    def __init__(
        self, lexicon: Lexicon, max_chars: int = DEFAULT_MAX_CHARS, whole: bool = False
    ) -> None:
        """``whole``: the input is complete (``split_text``'s cuts: whole sentences packed up
        to ``max_chars``, no early first segment)."""
        self.lexicon = lexicon
        self.max_chars = max_chars
        self.whole = whole
        self._start()

    def _start(self) -> None:
        self._rewriter = Rewriter(self.lexicon)
        self._segmenter = (
            TextSegmenter(self.max_chars, first_min_words=None, target_chars=self.max_chars)
            if self.whole
            else TextSegmenter(max_chars=self.max_chars)
        )
        self._input = ""  # the input from offset self._input_base on
        self._input_base = 0

    def push(self, piece: str) -> list[Segment]:
        self._input += piece
        return self._spans(self._segmenter.push(self._rewriter.push(piece)))

    def flush(self) -> list[Segment]:
        """End the input: its remaining segments; offsets then start from 0 again."""
        rest = self._segmenter.push(self._rewriter.flush()) + self._segmenter.flush()
        segments = self._spans(rest)
        self._start()
        return segments

    def _spans(self, segments: list[Segment]) -> list[Segment]:
        spans = []
        for segment in segments:
            start = self._rewriter.source_offset(segment.start)
            end = self._rewriter.source_offset(segment.end)
            text = self._input[start - self._input_base : end - self._input_base]
            spans.append(Segment(text, start, end, spoken=segment.text))
            self._input = self._input[end - self._input_base :]
            self._input_base = end
        return spans
