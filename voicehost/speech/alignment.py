"""Word timing: where each word of a segment's text is in the segment's audio.

An aligner follows one segment at a time (``begin``): its audio is fed as it is generated
(``feed``), each call answering the words whose timing is now final, and ``finish`` answers the
rest once the segment's audio is whole. A word is given once and never revised.

``EstimatedAligner`` (``"estimated"``, built in, no model) places words from what is known: the
text (each word's letters and syllables, and the punctuation after it, where a pause is
likely), the pauses and syllable peaks found in the audio itself (10 ms RMS windows), and the
speaking rate measured on the segment so far:

1. Phrases: the text cut after each word that punctuation follows. A phrase ends at the first
   pause heard after ``EARLIEST`` of the phrase's expected length (its weight at the measured
   rate); the last phrase ends with the segment's speech.
2. Words within a phrase: boundaries where the words' weights put them (letters, and one per
   syllable; a phrase's last word counts half again: speech slows before a pause), each then
   moved to a dip in the level near it, chosen for all boundaries at once (dynamic programming:
   closeness to the expected place against the dip's depth).
3. Streaming: a phrase is final once the pause after it (``LONG_PAUSE_WINDOWS``) has been
   heard. Inside the phrase in progress, a word has ended once the next word's first syllable
   is heard: the syllables' peaks in the level are counted against the text's syllables, and
   the word ends at the lowest level between its last peak and the next word's first (where a
   syllable was missed, once the measured rate puts its end in audio heard before this feed).
   So a word is given in the chunk after the one it ended in, as a rule, and never before its
   audio: a client that has played up to t holds the words that ended by t.
4. Languages: English keeps the figures above; another language is timed by its ``Timing``
   (``TIMINGS``, chosen on espeak-ng's speech): a dip's depth counts up to ``dip_cap_db`` only
   (deeper, it is a stop's closure as often as a word's edge) and no word is placed shorter
   than ``shortest_word`` of its share; some slow less before a pause; where stops close for
   long (Hindi, Korean) a longer pause ends a phrase; a word's last vowel that meets the next
   word's first is one syllable, one peak, in Italian and Spanish (synalepha), and may be in
   Hindi (the measured rate chooses); Mandarin's slow toned syllables have a prior rate of
   their own, and a syllable's peaks are merged from its first.

``scripts/bench_alignment.py`` measures it against espeak-ng's own word positions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from voicehost.audio.speech_start import FLOOR_DB, window_levels_db, window_samples
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.writing_systems import spoken_length, unspaced_words, vowels_meet
from voicehost.text.normalize import normalize

WINDOW_SECONDS = 0.010  # the level's resolution
WINDOW_SAMPLES = window_samples(SAMPLE_RATE)
PAUSE_WINDOWS = 6  # quiet windows in a row that make a pause (60 ms)
LONG_PAUSE_WINDOWS = 7  # while streaming, a pause this long (70 ms) ends a phrase
EARLIEST = 0.4  # of a phrase's expected length: no pause before it ends the phrase
LATEST = 2.0  # of a phrase's expected length: a phrase with no pause by then had none
QUIET_BELOW_LOUD_DB = 30.0  # a window this far below the loud level (95th percentile) is quiet
SYLLABLE_LETTERS = 1.0  # a word's expected length: its letters, and this per syllable
PHRASE_END_WEIGHT = 1.5  # a phrase's last word is longer: speech slows before a pause
PRIOR_LETTERS_PER_SECOND = 16.5  # weight (letters and syllables) per second until measured
DIP_REACH = 0.25  # of a word's average length: how far a boundary may move to a dip
DIP_REWARD = 0.01  # per dB squared of a dip's depth, against the squared distance moved
PEAK_SIDE = 10  # windows either side a syllable's peak stands out from
PEAK_PROMINENCE_DB = 4.0
PEAK_GAP = 8  # windows: two peaks nearer than this are one syllable
SYLLABLE_PEAK_GAP = 0.7  # of a syllable's expected length: a tonal syllable's peaks are one
TONAL = {"zh"}


@dataclass(frozen=True, slots=True)
class Timing:
    """How a language's speech is timed, where it differs from the defaults (English's)."""

    phrase_end: float = PHRASE_END_WEIGHT  # a phrase's last word's weight, times its own
    dip_cap_db: float = math.inf  # a dip deeper than this is no surer a word's edge
    shortest_word: float = 0.0  # of its share of a phrase: no word is placed shorter
    long_pause: int = LONG_PAUSE_WINDOWS  # while streaming, a pause this long ends a phrase
    prior_rate: float = PRIOR_LETTERS_PER_SECOND  # weight per second until measured
    # whether a word's last vowel and the next word's first are said as one syllable (one
    # peak in the level): "never" counted so, "always" (synalepha), or "sometimes" (the
    # measured rate chooses)
    run_on: Literal["never", "always", "sometimes"] = "never"


# espeak-ng's speech in each language (scripts/bench_alignment.py; docs/BENCHMARKS.md, issue 44)
OTHER_TIMING = Timing(dip_cap_db=20.0, shortest_word=0.5)
SLOWING_LESS = replace(OTHER_TIMING, phrase_end=1.25)  # less slowing before a pause
TIMINGS = {
    "en": Timing(),
    "it": replace(OTHER_TIMING, run_on="always"),
    "es": replace(SLOWING_LESS, run_on="always"),
    # stops close for 80 ms: geminate and aspirate ones in Hindi, tense ones in Korean
    "hi": replace(SLOWING_LESS, long_pause=10, run_on="sometimes"),
    "ko": replace(SLOWING_LESS, long_pause=10),
    "zh": replace(SLOWING_LESS, prior_rate=10.0),  # a Han character (weight 4) about 0.4 s
}


def timing(language: str) -> Timing:
    """The ``Timing`` of ``language`` (a primary subtag)."""
    return TIMINGS.get(language, OTHER_TIMING)


WORD = re.compile(r"\S+")
VOWELS = re.compile(r"[aeiouy]+")
# clause and sentence ends, and what closes one: Latin, CJK (fullwidth) and Devanagari (danda)
PAUSING = re.compile(
    r"[,;:.!?\u2026)\]\"\u2014\u2013\u00bb\u3001\u3002\u300d\u300f\uff01\uff09\uff0c"
    r"\uff1a\uff1b\uff1f\u0964\u0965-]+$"
)
HISSING_ES = re.compile(r"(?:[sxz]|[cs]h|[cg])es$")  # boxes, wishes, pages: -es said


def silent_ending(part: str) -> bool:
    """Whether a word's last vowel group is not said: a final e ("time", not "table" or
    "see"), -ed but after t or d ("walked", not "wanted"), -es but after a hiss ("makes",
    not "boxes")."""
    if part.endswith("le") and len(part) > 2 and part[-3] not in "aeiouy":
        return False
    if part.endswith("e"):
        return not part.endswith("ee") and part[-2:-1] not in ("", *"aeiouy")
    if part.endswith("ed"):
        return part[-3:-2] not in ("t", "d")
    if part.endswith("es"):
        return not HISSING_ES.search(part)
    return False


@dataclass(frozen=True, slots=True)
class WordTiming:
    """A word: its span in the segment's text, its start and end in seconds of the segment's
    audio (at the model's clock, before ``speed``)."""

    text: str
    start: int
    end: int
    audio_start: float
    audio_end: float


class SegmentAlignment(Protocol):
    def feed(self, samples: np.ndarray) -> list[WordTiming]:
        """More of the segment's audio (float, 24 kHz); the words now final, in order."""
        ...

    def finish(self, samples: np.ndarray | None = None) -> list[WordTiming]:
        """The last of the segment's audio, if any: it is whole. Every word not given yet."""
        ...


class Aligner(Protocol):
    name: str
    threaded: bool  # its work is slow enough to run off the event loop (a model's)

    def begin(self, text: str, language: str = "en") -> SegmentAlignment:
        """The alignment of one segment whose spoken text is ``text``, in ``language`` (its
        voice's, BCP-47: how its words are cut and weighed)."""
        ...


@dataclass(frozen=True, slots=True)
class TextWord:
    text: str
    start: int
    end: int
    weight: float  # its expected length, in letters (and ``SYLLABLE_LETTERS`` per syllable)
    pause_after: bool  # punctuation follows it
    syllables: int = 1  # of what it is said as
    meets: bool = False  # its first vowel meets the last of the word before (no pause between)


def letters(word: str) -> float:
    """A word's letters and digits: its expected length as written."""
    return float(sum(ch.isalnum() for ch in word))


def spoken_letters(word: str) -> float:
    """The letters of what a word is said as (``$42.50``: forty-two dollars and fifty cents)."""
    return max(letters(word), letters(normalize(word)))


def syllables(word: str) -> int:
    """About how many syllables ``word`` is said in: its vowel groups (a silent final e
    left out), of what it is said as; at least one."""
    spoken = re.sub(r"[^a-z]", " ", re.sub(r"['\u2019]", "", normalize(word).lower()))
    count = 0
    for part in spoken.split():
        groups = len(VOWELS.findall(part))
        if groups > 1 and silent_ending(part):
            groups -= 1
        count += max(1, groups)
    return max(1, count)


def primary_language(language: str) -> str:
    """``fr`` of ``fr-CA``; Mandarin's and Cantonese's own tags are Chinese (``zh``)."""
    primary = language.split("-")[0].split("_")[0].lower()
    return "zh" if primary in ("cmn", "yue") else primary


def text_words(
    text: str, weigh: Callable[[str], float] = letters, language: str = "en"
) -> list[TextWord]:
    """The words of ``text`` (runs of non-space with a letter or digit), each weighted, and
    whether punctuation follows it. English's weight: ``weigh`` and its syllables by English
    rules; another language's: its script's letters and syllables (``writing_systems``), each
    Han or kana character a word of its own, a mark that stands alone after a word (a danda, a
    French guillemet) that word's pause, and whether its first vowel meets the last of the word
    before."""
    language = primary_language(language)
    if language == "en":
        words = []
        for match in WORD.finditer(text):
            word = match.group()
            if any(ch.isalnum() for ch in word):
                pause = bool(PAUSING.search(word))
                said = syllables(word)
                weight = weigh(word) + SYLLABLE_LETTERS * said
                words.append(TextWord(word, match.start(), match.end(), weight, pause, said))
        return words
    words = []
    for match in WORD.finditer(text):
        token = match.group()
        if not any(ch.isalnum() for ch in token):
            if words and PAUSING.search(token):
                words[-1] = replace(words[-1], pause_after=True)
            continue
        for first, last in unspaced_words(token):
            word = token[first:last]
            written, said = spoken_length(word, language)
            weight = written + SYLLABLE_LETTERS * said
            start = match.start() + first
            pause = bool(PAUSING.search(word))
            meets = bool(words) and not words[-1].pause_after and vowels_meet(words[-1].text, word)
            words.append(TextWord(word, start, start + len(word), weight, pause, said, meets))
    return words


def phrases(words: list[TextWord]) -> list[list[int]]:
    """Word indices in phrases, each ending at a word that punctuation follows."""
    groups: list[list[int]] = [[]]
    for index, word in enumerate(words):
        groups[-1].append(index)
        if word.pause_after and index < len(words) - 1:
            groups.append([])
    return [group for group in groups if group]


def quiet_windows(levels: np.ndarray) -> np.ndarray:
    """Windows far below the loud level heard so far, or below ``FLOOR_DB`` whatever it is
    (audio that has been silent so far has no loud level)."""
    if levels.size == 0:
        return np.zeros(0, dtype=bool)
    return (levels < float(np.percentile(levels, 95)) - QUIET_BELOW_LOUD_DB) | (levels < FLOOR_DB)


def pauses_between(quiet: np.ndarray, first: int, last: int) -> list[tuple[int, int]]:
    """(start, end) windows of each run of ``PAUSE_WINDOWS`` or more quiet windows that ends
    (speech resumes) within ``first`` .. ``last``."""
    found, run = [], None
    for index in range(first, last):
        if quiet[index]:
            run = index if run is None else run
        else:
            if run is not None and index - run >= PAUSE_WINDOWS:
                found.append((run, index))
            run = None
    return found


def word_weights(
    words: list[TextWord], indices: list[int], said: Timing = TIMINGS["en"]
) -> list[float]:
    weights = [words[i].weight for i in indices]
    weights[-1] *= said.phrase_end
    return weights


def spread(
    indices: list[int],
    words: list[TextWord],
    start: float,
    end: float,
    levels: np.ndarray,
    said: Timing = TIMINGS["en"],
) -> list[tuple[float, float]]:
    """The words ``indices`` over windows ``start`` .. ``end``: boundaries where their weights
    put them, each moved to a dip in ``levels`` near it (its depth counted up to
    ``said.dip_cap_db``), chosen for all at once, no word shorter than ``said.shortest_word``
    of its share."""
    weights = word_weights(words, indices, said)
    total = sum(weights)
    expected, cumulative = [], 0.0
    for weight in weights[:-1]:
        cumulative += weight
        expected.append(start + (end - start) * cumulative / total)
    if not expected:
        return [(start, end)]
    reach = max(2.0, DIP_REACH * (end - start) / len(weights))
    dips = level_dips(levels, int(start) + 1, int(end) - 1)
    options = [
        [(at, 0.0)]
        + [(float(p), min(d, said.dip_cap_db)) for p, d in dips if abs(p - at) <= 3 * reach]
        for at in expected
    ]
    # the least distance from the boundary before: 1 window, or the word's shortest
    shortest = [max(1.0, said.shortest_word * (end - start) * w / total) for w in weights]
    # cost[k][j]: the best placing of boundaries 0..k with boundary k at options[k][j]
    cost = [[((p - expected[0]) / reach) ** 2 - DIP_REWARD * d * d for p, d in options[0]]]
    back: list[list[int]] = [[-1] * len(options[0])]
    for k in range(1, len(options)):
        row, links = [], []
        for p, d in options[k]:
            here = ((p - expected[k]) / reach) ** 2 - DIP_REWARD * d * d
            choices = [
                (cost[k - 1][i] + here, i)
                for i, (q, _) in enumerate(options[k - 1])
                if q < p - shortest[k]
            ]
            best = min(choices) if choices else (np.inf, 0)
            row.append(best[0])
            links.append(best[1])
        cost.append(row)
        back.append(links)
    j = int(np.argmin(cost[-1]))
    edges = [0.0] * len(options)
    for k in range(len(options) - 1, -1, -1):
        edges[k] = options[k][j][0]
        j = back[k][j]
    edges = [start, *edges, end]
    return [(edges[k], edges[k + 1]) for k in range(len(indices))]


def syllable_peaks(
    levels: np.ndarray, first: int, last: int, gap: int = PEAK_GAP, from_first: bool = False
) -> list[int]:
    """The syllables' peaks in the level (5-window smoothed) within ``first`` .. ``last``: each
    a maximum near the loud level that stands ``PEAK_PROMINENCE_DB`` above the lowest level
    150 ms either side, ``gap`` windows at least from the one before (``from_first``: from
    the first of the peaks merged into it, so that a run of peaks spaced less than ``gap``
    is not one syllable however long). A peak is counted once its falling side has been
    heard."""
    last = min(last, levels.size - PEAK_SIDE // 2)
    if last - first < 3:
        return []
    smooth = np.convolve(levels, np.ones(5) / 5, mode="same")
    loud = float(np.percentile(levels, 95))
    found: list[int] = []
    anchor = 0  # the first peak merged into the last found
    for i in range(max(first, 1), last):
        if smooth[i] < smooth[i - 1] or smooth[i] <= smooth[i + 1] or smooth[i] < loud - 25:
            continue
        left = smooth[max(0, i - PEAK_SIDE) : i].min()
        right = smooth[i + 1 : i + 1 + PEAK_SIDE].min()
        if smooth[i] - max(left, right) < PEAK_PROMINENCE_DB:
            continue
        if found and i - (anchor if from_first else found[-1]) < gap:
            if smooth[i] > smooth[found[-1]]:
                found[-1] = i
            continue
        found.append(i)
        anchor = i
    return found


def level_dips(levels: np.ndarray, first: int, last: int) -> list[tuple[int, float]]:
    """Local minima of the (3-window smoothed) level within ``first`` .. ``last``, each with its
    depth: how far it lies below the lower of the highest levels 80 ms either side."""
    last = min(last, levels.size - 1)
    if last - first < 3:
        return []
    smooth = np.convolve(levels[first : last + 1], np.ones(3) / 3, mode="same")
    dips = []
    for i in range(1, smooth.size - 1):
        if smooth[i] <= smooth[i - 1] and smooth[i] <= smooth[i + 1]:
            left, right = smooth[max(0, i - 8) : i].max(), smooth[i + 1 : i + 9].max()
            dips.append((first + i, float(min(left, right) - smooth[i])))
    return dips


class EstimatedAlignment:
    """One segment, for ``EstimatedAligner``."""

    def __init__(
        self, text: str, weigh: Callable[[str], float] = letters, language: str = "en"
    ) -> None:
        self.language = primary_language(language)
        self.said = timing(self.language)
        self.words = text_words(text, weigh, language)
        self.groups = phrases(self.words)
        self.levels = np.zeros(0)  # of the complete windows fed
        self.tail = np.zeros(0, dtype=np.float32)  # the samples past the last complete window
        self.fed = 0  # samples
        self.placed: list[tuple[float, float]] = []  # windows, of the words given, in order
        self.phrase = 0  # the phrase in progress
        self.phrase_start: float | None = None  # its first window
        self.letters_heard = 0.0  # weight of the phrases done, and their speech (windows)
        self.windows_heard = 0.0
        self.heard_before = 0  # windows heard at the feed before this one
        self.given_end = 0.0  # where the last word given ends (windows)

    def feed(self, samples: np.ndarray) -> list[WordTiming]:
        self._hear(samples)
        return self._advance(final=False)

    def finish(self, samples: np.ndarray | None = None) -> list[WordTiming]:
        if samples is not None:
            self._hear(samples)
        return self._advance(final=True)

    def _hear(self, samples: np.ndarray) -> None:
        """The level of each complete window of ``samples`` (with the tail before them), once:
        a feed costs its own samples, not the segment's."""
        audio = np.concatenate([self.tail, np.asarray(samples, dtype=np.float32)])
        whole = audio.size // WINDOW_SAMPLES * WINDOW_SAMPLES
        if whole:
            self.levels = np.concatenate([self.levels, window_levels_db(audio[:whole])])
        self.tail = audio[whole:]
        self.fed += samples.size

    def _rate(self) -> float:
        """Weight (letters and syllables) per window, as measured on the phrases done (the
        prior before a second)."""
        if self.windows_heard * WINDOW_SECONDS < 1.0:
            return self.said.prior_rate * WINDOW_SECONDS
        return self.letters_heard / self.windows_heard

    def _advance(self, final: bool) -> list[WordTiming]:
        given = len(self.placed)
        if given == len(self.words):
            return []
        levels = self.levels  # and the short last window's, as ``window_levels_db`` has it
        if self.tail.size:
            levels = np.concatenate([levels, window_levels_db(self.tail)])
        quiet = quiet_windows(levels)
        loud = np.flatnonzero(~quiet)
        heard = levels.size
        if loud.size == 0:
            if final:  # no speech at all: every word at the end, of no length
                self.placed += [(float(heard), float(heard))] * (len(self.words) - given)
            return self._timings(given)
        speech_end = int(loud[-1]) + 1
        try:
            return self._place(final, levels, quiet, loud, heard, speech_end, given)
        finally:
            self.heard_before = heard

    def _place(
        self,
        final: bool,
        levels: np.ndarray,
        quiet: np.ndarray,
        loud: np.ndarray,
        heard: int,
        speech_end: int,
        given: int,
    ) -> list[WordTiming]:
        while self.phrase < len(self.groups):
            group = self.groups[self.phrase]
            if self.phrase_start is None:
                after = int(self.placed[-1][1]) if self.placed else 0
                onsets = loud[loud >= after]
                if onsets.size == 0:
                    break
                self.phrase_start = float(onsets[0])
            start = self.phrase_start
            todo = [i for i in group if i >= len(self.placed)]
            weight = sum(word_weights(self.words, group, self.said))
            expected = weight / self._rate()
            last_phrase = self.phrase == len(self.groups) - 1
            if final:  # the speech left is known: the phrases left share it
                self._place_rest(levels, quiet, start, float(max(speech_end, start + 1)))
                break
            # the last phrase ends with the segment (above); another at a pause heard after it
            end = None if last_phrase else self._phrase_end(quiet, start, expected, heard)
            if end is None:  # the phrase goes on: its words that ended a guard ago
                self._give_ended(group, todo, start, expected, levels, heard)
                break
            if todo:  # the words given inside the phrase may reach past the pause's start
                begin = self.placed[-1][1] if len(self.placed) > group[0] else start
                self.placed += spread(
                    todo, self.words, begin, max(end, begin + 1), levels, self.said
                )
            self.letters_heard += weight
            self.windows_heard += end - start
            self.phrase += 1
            self.phrase_start = None
        return self._timings(given)

    def _place_rest(self, levels: np.ndarray, quiet: np.ndarray, start: float, end: float) -> None:
        """The phrases left, over windows ``start`` .. ``end``: each boundary between them at
        the pause nearest where their weights put it (within the shorter neighbour's share),
        else there; then each phrase's words spread over it."""
        given = len(self.placed)  # words of the phrase in progress may have been given
        groups = [
            g for g in ([i for i in g if i >= given] for g in self.groups[self.phrase :]) if g
        ]
        if given:
            start = max(start, self.placed[-1][1])
            end = max(end, start + 1)
        weights = [sum(word_weights(self.words, g, self.said)) for g in groups]
        total = sum(weights)
        found = pauses_between(quiet, int(start) + 1, int(end))
        bounds, at, cumulative = [], start, 0.0
        for k in range(len(groups) - 1):
            cumulative += weights[k]
            expected = start + (end - start) * cumulative / total
            reach = max(20.0, (end - start) * min(weights[k], weights[k + 1]) / total)
            near = [p for p in found if p[0] > at and abs((p[0] + p[1]) / 2 - expected) <= reach]
            if near:
                pause = min(near, key=lambda p: abs((p[0] + p[1]) / 2 - expected))
                bounds.append((at, float(pause[0])))
                at = float(pause[1])
            else:
                bounds.append((at, expected))
                at = expected
        bounds.append((at, end))
        for group, (first, last) in zip(groups, bounds, strict=True):
            begin = max(first, self.placed[-1][1]) if self.placed else first
            self.placed += spread(group, self.words, begin, max(last, begin + 1), levels, self.said)
        self.phrase = len(self.groups)

    def _phrase_end(
        self, quiet: np.ndarray, start: float, expected: float, heard: int
    ) -> float | None:
        """Where the phrase in progress ends: the first long pause (``Timing.long_pause``)
        after ``EARLIEST`` of its expected length; None while it may still come. A phrase that
        has none by ``LATEST`` times its expected length was said without a pause: it is one
        phrase with the next from then on."""
        low, high = start + EARLIEST * expected, start + LATEST * expected
        for a, b in pauses_between(quiet, int(start) + 1, heard):
            if a >= low and b - a >= self.said.long_pause:
                return float(a)
        if heard >= high and self.phrase + 1 < len(self.groups) - 1:
            self.groups[self.phrase] += self.groups.pop(self.phrase + 1)
        return None

    def _give_ended(
        self,
        group: list[int],
        todo: list[int],
        start: float,
        expected: float,
        levels: np.ndarray,
        heard: int,
    ) -> None:
        """Words of the phrase in progress that have ended, found by counting syllables: a
        word has ended once the first syllable of the next has been heard (its peak, and the
        peak's falling side), and its end is the lowest level between its last syllable's
        peak and that one. Where a word's last vowel meets the next's first they are one
        syllable (``Timing.run_on``): "always", counted once, the word ending at its peak;
        "sometimes", counted twice, but a word's end may be as many syllables earlier as
        such meetings before it, wherever the measured rate puts it nearer. So a word is
        given in the chunk after the one it ended in, at the latest. The phrase's last word
        waits for the phrase's end."""
        if len(todo) < 2:
            return
        gap, tonal = PEAK_GAP, self.language in TONAL
        if tonal:  # a syllable's tone may peak twice
            said = sum(self.words[i].syllables for i in group)
            gap = max(PEAK_GAP, round(SYLLABLE_PEAK_GAP * expected / said))
        peaks = syllable_peaks(levels, int(start), heard, gap, from_first=tonal)
        smooth = np.convolve(levels, np.ones(3) / 3, mode="same")
        by_rate = spread(group, self.words, start, start + expected, levels, self.said)

        def between(peak: int) -> float:  # the lowest level between ``peak`` and the one before
            low, high = peaks[peak - 1], peaks[peak]
            return float(low + int(np.argmin(smooth[low : high + 1])))

        count = 0  # syllables (peaks) of the phrase's words so far
        maybe = 0  # of them, the vowels that met (the peaks that may be one fewer)
        for index in group[:-1]:
            meets = self.words[index].meets
            count += self.words[index].syllables - (meets and self.said.run_on == "always")
            maybe += meets and self.said.run_on == "sometimes"
            if index < len(self.placed):
                continue
            shared = self.words[index + 1].meets and self.said.run_on == "always"
            if shared and count <= len(peaks):
                end = float(peaks[count - 1])  # the syllable the two words share
            elif count < len(peaks):
                rated = by_rate[index - group[0]][1]
                end = min(
                    (between(c) for c in range(count, max(1, count - maybe) - 1, -1)),
                    key=lambda at: abs(at - rated),
                )
            elif by_rate[index - group[0]][1] <= self.heard_before:
                end = by_rate[index - group[0]][1]  # a syllable missed: the rate says it ended
            else:
                break  # the next word's first syllable is not heard yet
            begin = self.placed[-1][1] if len(self.placed) > group[0] else start
            self.placed.append((begin, max(begin, end)))

    def _timings(self, given: int) -> list[WordTiming]:
        """The words placed from ``given`` on, in seconds, none past the audio fed (a 10 ms
        window may end after it) and each from the end of the one before."""
        fed = self.fed / SAMPLE_RATE / WINDOW_SECONDS
        previous = self.given_end
        out = []
        for index in range(given, len(self.placed)):
            word, (start, end) = self.words[index], self.placed[index]
            start = min(max(start, previous), fed)
            end = previous = self.given_end = min(max(end, start), fed)
            out.append(
                WordTiming(
                    word.text,
                    word.start,
                    word.end,
                    math.floor(start * WINDOW_SECONDS * 1000) / 1000,
                    math.floor(end * WINDOW_SECONDS * 1000) / 1000,
                )
            )
        return out


class EstimatedAligner:
    """The built-in aligner: no model (see the module's docstring). ``weigh``: a word's
    expected length (its letters; ``spoken_letters`` for a client's text, which the text stage
    rewrites and normalises before it is said), in English; another language's words are
    weighed by their script (``text_words``)."""

    name = "estimated"
    threaded = False

    def __init__(self, weigh: Callable[[str], float] = letters) -> None:
        self.weigh = weigh

    def begin(self, text: str, language: str = "en") -> EstimatedAlignment:
        return EstimatedAlignment(text, self.weigh, language)


def align(
    aligner: Aligner, text: str, samples: np.ndarray, chunk: int = 0, language: str = "en"
) -> list[WordTiming]:
    """Every word of ``text`` (in ``language``) placed in ``samples`` (a whole segment at
    24 kHz): fed in chunks of ``chunk`` samples as a stream is, or (0) at once, as a whole."""
    alignment = aligner.begin(text, language)
    if not chunk:
        return alignment.finish(samples)
    words: list[WordTiming] = []
    for first in range(0, samples.size, chunk):
        words += alignment.feed(samples[first : first + chunk])
    return words + alignment.finish()
