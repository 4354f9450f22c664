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
from voicehost.audio.formats import wav_header
from voicehost.speech.synthesis import SpokenWord

# formats whose bytes count their samples: (bytes per sample, header bytes before them)
RAW_SAMPLES = {"pcm": (2, 0), "wav": (2, len(wav_header())), "mulaw": (1, 0), "alaw": (1, 0)}
HELD_SLACK_SECONDS = 1e-3  # a word's end is floored to the millisecond when sent


class WordClock:
    """The audio a stream has sent, in seconds at its clock, and the words waiting for it."""

    def __init__(self, stream: FormatStream) -> None:
        self.stream = stream
        self.width, self.header = RAW_SAMPLES.get(stream.fmt, (0, 0))
        self.sent_bytes = 0
        self.model_samples = 0  # encoded so far (24 kHz, before speed)
        self.run_start = 0.0  # where the current speaker's audio starts (after a cancel)
        self.pending: deque[SpokenWord] = deque()

    def sent(self, data: bytes, model_samples: int = 0) -> None:
        """``data`` has been sent: the encoding of ``model_samples``."""
        self.sent_bytes += len(data)
        self.model_samples += model_samples

    @property
    def samples(self) -> int:
        """The samples sent, at the stream's rate (after speed): exact for the raw formats
        (their bytes), a compressed one's by what was encoded."""
        if self.width:
            return max(0, self.sent_bytes - self.header) // self.width
        return self.stream.output_samples(self.model_samples)

    @property
    def sent_seconds(self) -> float:
        """The audio sent, in seconds of the stream's clock."""
        return self.samples / self.stream.sample_rate

    def hold(self, word: SpokenWord) -> None:
        """``word`` (the model's clock, from this run's start), until its audio has been sent."""
        speed = self.stream.speed
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
    """A word as the API gives it: its span in the client's text, what it was said as, and its
    audio seconds (floored to the millisecond: never after the audio)."""
    return {
        "text": word.text,
        "said": word.said or word.text,
        "start": word.start,
        "end": word.end,
        "audio_start": math.floor(word.audio_start * 1000) / 1000,
        "audio_end": math.floor(word.audio_end * 1000) / 1000,
    }
