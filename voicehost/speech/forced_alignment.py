"""Word timing by forced alignment: a CTC model (wav2vec2, MMS: ``AutoModelForCTC`` and its
processor, saved by transformers in a local folder; nothing is downloaded) gives each audio
frame's character probabilities, and Viterbi finds the path through the segment's characters
that explains them best. Each word's frames are its timing.

Streaming: as the segment's audio grows (every ``STEP_SECONDS``), the audio so far is aligned
against the text with a free end (the path may stop at any character: the rest is not said
yet); a word whose path ended ``GUARD_SECONDS`` before the audio heard is final. ``finish``
aligns the whole segment to its last character. Audio too short for its characters (or a path
that cannot be found) is placed by the built-in estimate instead.

``load_aligner`` picks the service's aligner from ``VOICEHOST_ALIGNER_MODEL``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.alignment import (
    Aligner,
    EstimatedAligner,
    EstimatedAlignment,
    WordTiming,
    spoken_letters,
    text_words,
)
from voicehost.text.normalize import normalize

STEP_SECONDS = 1.0  # the audio so far is aligned again once this much more has come
GUARD_SECONDS = 0.5  # a word is final once its path ended this long before the audio heard
WORD_DELIMITER = "|"  # wav2vec2's space


class CtcModel:
    """A CTC model and its processor from ``folder``: frame log-probabilities of audio."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForCTC, AutoProcessor

        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no CTC model in {folder} (config.json is missing)")
        self.torch = torch  # its threads are the process's (the codec's setting), left as they are
        self.processor: Any = AutoProcessor.from_pretrained(folder, local_files_only=True)
        self.model: Any = AutoModelForCTC.from_pretrained(folder, local_files_only=True).eval()
        tokenizer = self.processor.tokenizer
        self.vocab: dict[str, int] = tokenizer.get_vocab()
        self.blank = int(tokenizer.pad_token_id)
        self.delimiter = self.vocab.get(getattr(tokenizer, "word_delimiter_token", WORD_DELIMITER))
        self.rate = int(self.processor.feature_extractor.sampling_rate)
        letters = [token for token in self.vocab if len(token) == 1 and token.isalpha()]
        self.upper = bool(letters) and all(token.isupper() for token in letters)

    def tokens(self, word: str) -> list[int]:
        """The vocabulary's ids of what ``word`` is said as (its letters the model knows)."""
        spoken = normalize(word)
        spoken = spoken.upper() if self.upper else spoken.lower()
        return [self.vocab[ch] for ch in spoken if ch in self.vocab and not ch.isspace()]

    def log_probs(self, samples: np.ndarray) -> np.ndarray:
        """Frames x vocabulary log-probabilities of ``samples`` (24 kHz float)."""
        import soxr

        audio = soxr.resample(samples.astype(np.float32), SAMPLE_RATE, self.rate)
        inputs = self.processor.feature_extractor(
            audio, sampling_rate=self.rate, return_tensors="pt"
        )
        torch = self.torch
        with torch.inference_mode():
            logits = self.model(inputs.input_values).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).numpy()


def millis(seconds: float) -> float:
    """``seconds`` floored to the millisecond: a time never after the audio it points into."""
    return math.floor(seconds * 1000) / 1000


def viterbi(
    log_probs: np.ndarray, targets: list[int], blank: int, free_end: bool
) -> list[int] | None:
    """The best CTC path of ``targets`` through ``log_probs``: for each frame, the index of the
    target it emits, or -1 for a blank. ``free_end``: the path may stop at any target (the
    audio so far says only part of them). None when no path fits (too few frames)."""
    frames = log_probs.shape[0]
    states = np.full(2 * len(targets) + 1, blank)
    states[1::2] = targets
    n = states.size
    skip = np.zeros(n, dtype=bool)  # a state reachable from two back: a target unlike the last
    skip[3::2] = states[3::2] != states[1:-2:2]
    emit = log_probs[:, states]
    score = np.full(n, -np.inf)
    score[0] = emit[0, 0]
    if n > 1:
        score[1] = emit[0, 1]
    back = np.zeros((frames, n), dtype=np.int8)
    for t in range(1, frames):
        one = np.concatenate(([-np.inf], score[:-1]))
        two = np.where(skip, np.concatenate(([-np.inf, -np.inf], score[:-2])), -np.inf)
        choices = np.stack([score, one, two])
        step = np.argmax(choices, axis=0)
        score = choices[step, np.arange(n)] + emit[t]
        back[t] = step
    if free_end:
        end = int(np.argmax(score))
    else:
        ends = [n - 1, n - 2] if n > 1 else [0]
        end = max(ends, key=lambda s: score[s])
    if not np.isfinite(score[end]):
        return None
    path = [0] * frames
    state = end
    for t in range(frames - 1, -1, -1):
        path[t] = (state - 1) // 2 if state % 2 else -1
        state -= int(back[t, state])
    return path


class CtcAlignment:
    """One segment, for ``CtcAligner``."""

    def __init__(self, model: CtcModel, text: str, language: str = "en") -> None:
        self.model = model
        self.text = text
        self.language = language
        self.words = text_words(text, spoken_letters, language)
        self.targets: list[int] = []
        self.owner: list[int] = []  # the word of each target (-1: a delimiter)
        for index, word in enumerate(self.words):
            if self.targets and model.delimiter is not None:
                self.targets.append(model.delimiter)
                self.owner.append(-1)
            ids = model.tokens(word.text)
            self.targets += ids
            self.owner += [index] * len(ids)
        self.audio: list[np.ndarray] = []
        self.samples = 0
        self.aligned_at = 0  # samples at the last alignment
        self.given = 0
        self.last_end = 0.0  # of the words given, in seconds

    def feed(self, samples: np.ndarray) -> list[WordTiming]:
        self.audio.append(np.asarray(samples, dtype=np.float32))
        self.samples += samples.size
        if self.samples - self.aligned_at < STEP_SECONDS * SAMPLE_RATE or not self.targets:
            return []
        self.aligned_at = self.samples
        return self._words(self._align(free_end=True), final=False)

    def finish(self, samples: np.ndarray | None = None) -> list[WordTiming]:
        if samples is not None:
            self.audio.append(np.asarray(samples, dtype=np.float32))
            self.samples += samples.size
        spans = self._align(free_end=False) if self.targets else None
        if spans is None:  # no path: the built-in estimate places the words left
            return self._estimated()
        return self._words(spans, final=True)

    def _align(self, free_end: bool) -> list[tuple[float, float] | None] | None:
        """Each word's (start, end) in seconds on the best path (None: not reached yet, or it
        has no letters the model knows); None when no path fits."""
        audio = np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)
        if audio.size == 0:
            return None
        log_probs = self.model.log_probs(audio)
        path = viterbi(log_probs, self.targets, self.model.blank, free_end)
        if path is None:
            return None
        frame = audio.size / SAMPLE_RATE / max(1, log_probs.shape[0])
        spans: list[tuple[float, float] | None] = [None] * len(self.words)
        for t, target in enumerate(path):
            word = self.owner[target] if target >= 0 else -1
            if word >= 0:
                span = spans[word]
                start = t * frame if span is None else span[0]
                spans[word] = (start, (t + 1) * frame)
        return spans

    def _words(
        self, spans: list[tuple[float, float] | None] | None, final: bool
    ) -> list[WordTiming]:
        """The words from the next one not given whose spans are final: all (``final``), else
        those that ended a guard before the audio heard, each starting after the one before."""
        if spans is None:
            return []
        heard = self.samples / SAMPLE_RATE
        out: list[WordTiming] = []
        previous = self.last_end
        for index in range(self.given, len(self.words)):
            span = spans[index]
            if not final and (span is None or span[1] > heard - GUARD_SECONDS):
                break
            start, end = span if span is not None else (previous, previous)
            start = min(max(start, previous), heard)
            end = min(max(end, start), heard)
            word = self.words[index]
            out.append(WordTiming(word.text, word.start, word.end, millis(start), millis(end)))
            previous = end
        self.given += len(out)
        self.last_end = previous
        return out

    def _estimated(self) -> list[WordTiming]:
        """The words not given, placed by the built-in estimate over the whole audio."""
        audio = np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)
        estimate = EstimatedAlignment(self.text, spoken_letters, self.language).finish(audio)
        spans: list[tuple[float, float] | None] = [(w.audio_start, w.audio_end) for w in estimate]
        return self._words(spans, final=True)


class CtcAligner:
    """Forced alignment with the CTC model in ``folder`` (see the module's docstring). Its
    work runs off the event loop (``threaded``)."""

    threaded = True

    def __init__(self, folder: Path) -> None:
        self.model = CtcModel(folder)
        self.name = f"ctc:{folder.name}"

    def begin(self, text: str, language: str = "en") -> CtcAlignment:
        return CtcAlignment(self.model, text, language)


def load_aligner(folder: Path | None) -> Aligner:
    """The service's aligner: forced alignment with the CTC model in ``folder``, or the
    built-in estimate (weighing a client's words as they are said)."""
    if folder is None:
        return EstimatedAligner(spoken_letters)
    return CtcAligner(folder)
