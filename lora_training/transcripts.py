"""Transcripts: LJSpeech ``metadata.csv``, sidecar ``.txt``/``.lab`` files, or an ASR backend."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from voicehost.errors import ServiceError

SIDECAR_SUFFIXES = (".txt", ".lab")


class MissingTranscripts(ServiceError, ValueError):
    """Clips without text, and no way to get it."""

    code = "missing_transcripts"


class SpeechRecognizer(Protocol):
    """A pluggable ASR backend: 24 kHz mono float samples -> text."""

    def transcribe(self, samples: np.ndarray) -> str: ...


class FasterWhisper:
    """ASR with faster-whisper from a local model folder (install ``faster-whisper`` yourself)."""

    def __init__(self, model_path: Path, device: str = "auto") -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(model_path), device=device)

    def transcribe(self, samples: np.ndarray) -> str:
        import soxr

        audio_16k = soxr.resample(samples, 24000, 16000)
        segments, _ = self.model.transcribe(audio_16k, beam_size=5)
        return " ".join(segment.text.strip() for segment in segments).strip()


def read_metadata(path: Path) -> dict[str, str]:
    """``file|text`` lines (LJSpeech ``id|text|normalised`` too) -> {file stem: text}."""
    texts: dict[str, str] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle, delimiter="|", quoting=csv.QUOTE_NONE):
            if len(row) < 2 or not row[0].strip():
                continue
            text = (row[2] if len(row) > 2 and row[2].strip() else row[1]).strip()
            if text:
                texts[Path(row[0].strip()).stem] = text
    return texts


def find_transcripts(files: Sequence[Path], metadata: Path | None = None) -> dict[Path, str]:
    """The text of each file that has one: from ``metadata`` (or a ``metadata.csv`` beside the
    files), else from a sidecar ``<stem>.txt`` or ``<stem>.lab``."""
    found: dict[Path, str] = {}
    tables: dict[Path, dict[str, str]] = {}
    for file in files:
        table_path = metadata or file.parent / "metadata.csv"
        if table_path not in tables:
            tables[table_path] = read_metadata(table_path) if table_path.is_file() else {}
        text = tables[table_path].get(file.stem)
        for suffix in SIDECAR_SUFFIXES:
            sidecar = file.with_suffix(suffix)
            if text is None and sidecar.is_file() and sidecar != file:
                text = sidecar.read_text(encoding="utf-8").strip() or None
        if text:
            found[file] = text
    return found


def require_transcripts(
    files: Sequence[Path], found: dict[Path, str], recognizer: SpeechRecognizer | None
) -> None:
    """Raise ``MissingTranscripts`` naming what to provide, if some files have no text."""
    missing = [f for f in files if f not in found]
    if missing and recognizer is None:
        names = ", ".join(f.name for f in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise MissingTranscripts(
            f"{len(missing)} of {len(files)} files have no transcript ({names}): provide a "
            "metadata.csv (file|text), a .txt or .lab file beside each clip, or an ASR model"
        )
