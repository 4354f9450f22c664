"""Ingest: audio files or folders -> 24 kHz mono float clips, loudness-normalised.

Files are recognised by their content (FFmpeg's probe through PyAV), never by their name. A file
that cannot be decoded is skipped and reported; it never fails the whole job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicehost.orpheus import SAMPLE_RATE

log = logging.getLogger(__name__)

TARGET_LUFS = -20.0
MAX_GAIN_DB = 30.0  # never blow noise up into "speech"


class UnreadableAudio(ValueError):
    """A file that is not audio we can decode."""


class AudioTooLong(UnreadableAudio):
    """Audio that decodes past the duration cap."""


@dataclass(frozen=True, slots=True)
class Recording:
    """One decoded source file."""

    source: Path
    samples: np.ndarray  # float32, mono, 24 kHz

    @property
    def seconds(self) -> float:
        return self.samples.size / SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class Rejected:
    """A file that was skipped, and why."""

    source: Path
    reason: str


TEXT_SUFFIXES = (".csv", ".txt", ".lab", ".json")  # transcripts that live beside the audio


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files, and the files inside folders (recursively, sorted), less hidden and transcript
    files there; a file named explicitly is always tried."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not p.name.startswith(".")
                and p.suffix.lower() not in TEXT_SUFFIXES
            )
        else:
            files.append(path)
    return files


def decode(path: Path, max_seconds: float | None = None) -> np.ndarray:
    """Decode any format FFmpeg knows into 24 kHz mono float32; raises ``UnreadableAudio``.

    Stops with an error once more than ``max_seconds`` have been decoded: the duration in a
    file's header is never trusted.
    """
    import av

    limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    decoded = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise UnreadableAudio("no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    chunks.append(chunk)
                    decoded += chunk.size
                if limit is not None and decoded > limit:
                    raise AudioTooLong(f"longer than the {max_seconds:.0f} s limit")
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as exc:
        raise UnreadableAudio(
            f"not decodable audio ({exc.strerror or type(exc).__name__})"
        ) from exc
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise UnreadableAudio("no audio samples")
    if not np.isfinite(samples).all():
        raise UnreadableAudio("audio holds NaN or infinite samples")
    return samples


def normalise_loudness(samples: np.ndarray, target_lufs: float = TARGET_LUFS) -> np.ndarray:
    """Scale to ``target_lufs`` integrated loudness (ITU-R BS.1770), without clipping."""
    import pyloudnorm

    meter = pyloudnorm.Meter(SAMPLE_RATE)
    if samples.size < SAMPLE_RATE // 2:  # the meter needs 400 ms blocks
        return samples
    loudness = meter.integrated_loudness(samples.astype(np.float64))
    if not np.isfinite(loudness):  # digital silence
        return samples
    gain = 10 ** (min(target_lufs - loudness, MAX_GAIN_DB) / 20)
    peak = float(np.abs(samples).max()) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return (samples * gain).astype(np.float32)


def ingest(
    paths: Iterable[Path], max_seconds: float | None = None
) -> tuple[list[Recording], list[Rejected]]:
    """Decode and normalise every file; returns the recordings and the rejected files."""
    recordings: list[Recording] = []
    rejected: list[Rejected] = []
    for path in expand(paths):
        try:
            samples = decode(path, max_seconds)
        except (UnreadableAudio, OSError) as exc:
            log.warning("skipping %s: %s", path, exc)
            rejected.append(Rejected(path, str(exc)))
            continue
        recordings.append(Recording(path, normalise_loudness(samples)))
    return recordings, rejected
