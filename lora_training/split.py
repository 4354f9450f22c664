"""Split: recordings longer than 15 s cut into 2-15 s utterances at pauses (silero-vad); a text
*segment* is the text stage's (``voicehost.text.segment``), never audio.

Their text comes from the ASR backend. Without one, a long recording is refused: a transcript is
never guessed apart.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from lora_training.transcripts import SpeechRecognizer
from voicehost.model.orpheus import SAMPLE_RATE

MIN_CLIP_SECONDS = 2.0
MAX_CLIP_SECONDS = 15.0
VAD_RATE = 16000


class NeedsRecognizer(ValueError):
    """A long recording and no ASR backend to transcribe its pieces."""


@cache
def _vad_model():  # noqa: ANN202 - silero's model type
    from silero_vad import load_silero_vad

    return load_silero_vad()


def speech_regions(samples: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) sample indices at 24 kHz of the speech silero-vad finds."""
    import soxr
    import torch
    from silero_vad import get_speech_timestamps

    audio = soxr.resample(samples, SAMPLE_RATE, VAD_RATE).astype(np.float32)
    stamps = get_speech_timestamps(torch.from_numpy(audio), _vad_model(), sampling_rate=VAD_RATE)
    scale = SAMPLE_RATE / VAD_RATE
    return [(int(s["start"] * scale), int(s["end"] * scale)) for s in stamps]


def group_regions(regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Join consecutive speech regions into utterances of at most 15 s; drop those under 2 s.

    A single region longer than 15 s is cut into equal parts of at most 15 s.
    """
    longest = int(MAX_CLIP_SECONDS * SAMPLE_RATE)
    pieces: list[tuple[int, int]] = []
    for start, end in regions:
        parts = -(-(end - start) // longest)
        step = (end - start) / parts
        pieces += [(int(start + i * step), int(start + (i + 1) * step)) for i in range(parts)]
    groups: list[tuple[int, int]] = []
    for start, end in pieces:
        if groups and end - groups[-1][0] <= longest:
            groups[-1] = (groups[-1][0], end)
        else:
            groups.append((start, end))
    return [(s, e) for s, e in groups if e - s >= MIN_CLIP_SECONDS * SAMPLE_RATE]


def split_recording(
    samples: np.ndarray, recognizer: SpeechRecognizer | None
) -> list[tuple[str, np.ndarray]]:
    """(text, samples) utterances of a long recording."""
    if recognizer is None:
        raise NeedsRecognizer(
            f"a {samples.size / SAMPLE_RATE:.0f} s recording needs an ASR model to be split; "
            f"or send clips of at most {MAX_CLIP_SECONDS:.0f} s with their transcripts"
        )
    margin = int(0.1 * SAMPLE_RATE)  # keep the speech's soft edges; trimming comes later
    utterances = []
    for start, end in group_regions(speech_regions(samples)):
        piece = samples[max(0, start - margin) : end + margin]
        text = recognizer.transcribe(piece).strip()
        if text:
            utterances.append((text, piece))
    return utterances
