"""Word timing as a stream sends it: each ``SpokenWord`` moved onto the stream's clock (after
``speed``, and after any cancel) and held until the audio that ends it has been sent, so a
client that has played up to t holds every word that ended by t, and no word before its audio.

The realtime session (``word`` events), ``POST /v1/audio/speech``'s SSE (``speech.word``) and
the captioned endpoint (every word at once, with the audio) all keep their words by one
``WordClock``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from voicehost.audio.encoding import FormatStream
from voicehost.speech.synthesis import SpokenWord

RAW_SAMPLE_BYTES = {"pcm": 2, "mulaw": 1, "alaw": 1}  # formats whose bytes count their samples
HELD_SLACK_SECONDS = 1e-3  # a word's end is floored to the millisecond when sent


class WordClock:
    """The audio a stream has sent, in seconds at its clock, and the words waiting for it."""

    def __init__(self, encoder: FormatStream) -> None:
        self.encoder = encoder
        self.sent_seconds = 0.0  # of audio sent, at the stream's clock (after speed)
        self.run_start = 0.0  # where the current speaker's audio starts (after a cancel)
        self.pending: deque[SpokenWord] = deque()

    def sent(self, data: bytes, model_samples: int = 0) -> None:
        """``data`` has been sent: the encoding of ``model_samples``. The clock moves on by its
        samples (exact for the raw formats; a compressed one's by what was encoded)."""
        width = RAW_SAMPLE_BYTES.get(self.encoder.fmt)
        output = len(data) / width if width else self.encoder.output_samples(model_samples)
        self.sent_seconds += output / self.encoder.sample_rate

    def hold(self, word: SpokenWord) -> None:
        """``word`` (the model's clock, from this run's start), until its audio has been sent."""
        speed = self.encoder.speed
        self.pending.append(
            dataclasses.replace(
                word,
                audio_start=self.run_start + word.audio_start / speed,
                audio_end=self.run_start + word.audio_end / speed,
            )
        )

    def ready(self, every: bool = False) -> list[SpokenWord]:
        """The words whose audio has all been sent (``every``: all of them: the stream ended)."""
        out = []
        while self.pending and (
            every or self.pending[0].audio_end <= self.sent_seconds + HELD_SLACK_SECONDS
        ):
            out.append(self.pending.popleft())
        return out

    def restart(self) -> None:
        """A cancel: the words held are dropped; the next run's count from the audio sent."""
        self.pending.clear()
        self.run_start = self.sent_seconds


def word_fields(word: SpokenWord) -> dict[str, object]:
    """A word as the API gives it: its span in the client's text and its audio seconds
    (floored to the millisecond: never after the audio)."""
    return {
        "text": word.text,
        "start": word.start,
        "end": word.end,
        "audio_start": math.floor(word.audio_start * 1000) / 1000,
        "audio_end": math.floor(word.audio_end * 1000) / 1000,
    }
