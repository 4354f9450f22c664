"""Tokenise: SNAC-encode clips and build Orpheus training sequences as a ``datasets.Dataset``.

The dataset is saved under a fingerprint of its inputs and reused while they do not change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicehost.model import orpheus
from voicehost.model.codec import SnacCodec

IGNORE_INDEX = -100  # labels the loss skips: the text prompt


@dataclass(frozen=True, slots=True)
class Utterance:
    """One training clip: its text and its (trimmed) audio."""

    text: str
    samples: np.ndarray


def drop_repeated_frames(frames: Sequence[orpheus.Frame]) -> list[orpheus.Frame]:
    """Drop each frame whose layer-0 code repeats the previous kept frame's (Orpheus' recipe)."""
    kept: list[orpheus.Frame] = []
    for frame in frames:
        if not kept or frame.l0 != kept[-1].l0:
            kept.append(frame)
    return kept


def example(
    tokenize: Callable[[str], list[int]],
    text: str,
    voice_name: str | None,
    frames: Sequence[orpheus.Frame],
) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` (prompt masked) of one training sequence."""
    text_ids = tokenize(orpheus.prompt_text(text, voice_name))
    input_ids = orpheus.training_sequence(text_ids, frames)
    prompt_length = len(orpheus.build_prompt(text_ids))
    labels = [IGNORE_INDEX] * prompt_length + input_ids[prompt_length:]
    return {"input_ids": input_ids, "labels": labels}


def fingerprint(utterances: Sequence[Utterance], settings: dict[str, object]) -> str:
    """Changes when any clip, text or setting changes."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for utterance in utterances:
        digest.update(utterance.text.encode())
        digest.update(np.ascontiguousarray(utterance.samples, dtype=np.float32).tobytes())
    return digest.hexdigest()[:16]


def build_dataset(
    utterances: Sequence[Utterance],
    codec: SnacCodec,
    tokenize: Callable[[str], list[int]],
    cache_dir: Path,
    *,
    voice_name: str | None = None,
    drop_repeats: bool = False,
    codec_name: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> tuple[object, Path]:
    """The training ``datasets.Dataset`` and where it is saved (reused if already built)."""
    from datasets import Dataset, load_from_disk

    settings = {"voice": voice_name, "drop_repeats": drop_repeats, "codec": codec_name}
    key = fingerprint(utterances, settings)
    path = cache_dir / f"dataset-{key}"
    if (path / "dataset_info.json").exists():
        return load_from_disk(str(path)), path
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    for index, utterance in enumerate(utterances):
        frames = codec.encode(utterance.samples)
        if drop_repeats:
            frames = drop_repeated_frames(frames)
        row = example(tokenize, utterance.text, voice_name, frames)
        rows["input_ids"].append(row["input_ids"])
        rows["labels"].append(row["labels"])
        if progress:
            progress(index + 1, len(utterances))
    dataset = Dataset.from_dict(rows)
    dataset.save_to_disk(str(path))
    return dataset, path
