"""Ingest: audio files or folders -> 24 kHz mono float clips, loudness-normalised.

Every file is treated as hostile. Its container is recognised by its first bytes (never by its
name or a content type) and opened with that container's FFmpeg demuxer only, so nothing else
(playlists, images, other protocols) is ever probed; the codec, sample rate and channel count
must be on an allowlist, in the header and in every decoded frame; a header claiming more than
the duration cap is refused before decoding, and decoding stops once the decoded audio passes
the cap (a header's duration is never trusted to be small). A file that cannot be decoded is
skipped and reported; it never fails the whole job.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from voicehost.errors import ServiceError
from voicehost.model.orpheus import SAMPLE_RATE

if TYPE_CHECKING:
    import av

log = logging.getLogger(__name__)

TARGET_LUFS = -20.0
MAX_GAIN_DB = 30.0  # never blow noise up into "speech"


class UnreadableAudio(ServiceError, ValueError):
    """A file that is not audio we can decode."""

    code = "not_audio"


class UnsupportedAudio(UnreadableAudio):
    """Audio in a container or codec, or at a sample rate or channel count, that is not taken."""

    code = "unsupported_audio"


class AudioTooLong(UnreadableAudio):
    """Audio that decodes past (or whose header claims more than) the duration cap."""

    code = "audio_too_long"


SAMPLE_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
MAX_CHANNELS = 2
DECODERS = ("pcm_", "flac", "mp3", "aac", "vorbis", "libvorbis", "opus", "libopus", "alac")
SNIFF_BYTES = 1 << 16  # enough for a WAV's chunks before "fmt "
CONTAINERS = "wav, flac, ogg (vorbis, opus), mp3, aac, m4a/mp4, webm/mkv"


@dataclass(frozen=True, slots=True)
class Recording:
    """One decoded source file."""

    source: Path
    samples: np.ndarray  # float32, mono, 24 kHz, loudness-normalised
    gain: float = 1.0  # what normalising multiplied the decoded samples by

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


def sniff(head: bytes) -> str | None:
    """The FFmpeg demuxer for a file that starts with ``head``, or ``None`` if it is not an
    audio container we take (a zip, a pickle, text, an image, a playlist...)."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3":
        return "mp3"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: webm, mkv
        return "matroska"
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:  # no MPEG frame sync
        return None
    if (head[1] >> 1) & 3 == 0:  # layer 0: an ADTS AAC frame
        return "aac" if head[1] & 0xF0 == 0xF0 else None
    reserved = head[1] & 0x18 == 0x08 or head[2] >> 4 == 15 or (head[2] >> 2) & 3 == 3
    return None if reserved else "mp3"


def check_wav_header(head: bytes, file_size: int) -> None:
    """Refuse a WAV whose ``fmt `` chunk is inconsistent (a forged sample rate or channel count
    shows as a byte rate or block size that does not add up) or off the allowlists, or whose
    data chunk claims more bytes than the file holds (unknown sizes, 0 or 0xFFFFFFFF, pass)."""
    offset, fmt_seen = 12, False
    while offset + 8 <= len(head):
        chunk, size = head[offset : offset + 4], struct.unpack_from("<I", head, offset + 4)[0]
        if chunk == b"fmt ":
            if size < 16 or offset + 24 > len(head):
                raise UnreadableAudio("WAV fmt chunk is truncated")
            tag, channels, rate, byte_rate, align, bits = struct.unpack_from(
                "<HHIIHH", head, offset + 8
            )
            _check_rate_and_channels(rate, channels)
            if tag in (1, 3, 0xFFFE) and (
                bits not in (8, 16, 24, 32, 64)
                or align != channels * bits // 8
                or byte_rate != rate * align
            ):
                raise UnsupportedAudio(
                    f"WAV header does not add up: {rate} Hz x {channels} channels x {bits} bits "
                    f"but {byte_rate} bytes/s in blocks of {align}"
                )
            fmt_seen = True
        elif chunk == b"data":
            if size not in (0, 0xFFFFFFFF) and offset + 8 + size > file_size:
                message = f"WAV data chunk claims {size} bytes; the file holds {file_size}"
                raise UnreadableAudio(message)
            break
        offset += 8 + size + (size & 1)
    if not fmt_seen:
        raise UnreadableAudio("WAV has no fmt chunk before its data")


def _check_rate_and_channels(rate: int, channels: int) -> None:
    if rate not in SAMPLE_RATES:
        rates = ", ".join(str(r) for r in sorted(SAMPLE_RATES))
        raise UnsupportedAudio(f"sample rate {rate} Hz is not one of {rates}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise UnsupportedAudio(f"{channels} channels (mono or stereo only)")


@contextmanager
def _opened(
    path: Path, max_seconds: float | None
) -> Iterator[tuple[av.container.InputContainer, av.audio.stream.AudioStream]]:
    """An untrusted file opened with the demuxer its first bytes name, and its checked audio
    stream; FFmpeg's errors in the body come out as ``UnreadableAudio``."""
    import av

    with path.open("rb") as source:
        head = source.read(SNIFF_BYTES)
    demuxer = sniff(head)
    if demuxer is None:
        raise UnreadableAudio(f"not a recognised audio file (by its content: {CONTAINERS})")
    if demuxer == "wav":
        check_wav_header(head, path.stat().st_size)
    try:
        with av.open(str(path), format=demuxer) as container:
            yield container, _audio_stream(container, max_seconds)
    except UnreadableAudio:
        raise
    except (av.FFmpegError, ValueError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        raise UnreadableAudio(f"not decodable audio ({reason})") from exc


def _check_frame(frame: av.AudioFrame, rate: int, channels: int) -> None:
    if frame.sample_rate != rate or frame.layout.nb_channels != channels:
        raise UnsupportedAudio(
            f"the audio changes from {rate} Hz x {channels} to "
            f"{frame.sample_rate} Hz x {frame.layout.nb_channels} channels midway"
        )


def _too_long(seconds: float, max_seconds: float | None) -> None:
    if max_seconds is not None and seconds > max_seconds:
        raise AudioTooLong(f"longer than the {max_seconds:.0f} s limit")


def _frames(path: Path, max_seconds: float | None) -> Iterator[av.AudioFrame]:
    """The checked audio frames of an untrusted file, as they decode."""
    with _opened(path, max_seconds) as (container, stream):
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
        decoded = 0.0
        for frame in container.decode(stream):
            _check_frame(frame, rate, channels)
            decoded += frame.samples / rate
            _too_long(decoded, max_seconds)
            yield frame


def _audio_stream(
    container: av.container.InputContainer, max_seconds: float | None
) -> av.audio.stream.AudioStream:
    """The first audio stream, once its codec, rate, channels and claimed duration pass."""
    import av

    if not container.streams.audio:
        raise UnreadableAudio("no audio stream")
    stream = container.streams.audio[0]
    context = stream.codec_context
    if context is None or not context.name.startswith(DECODERS):
        name = context.name if context is not None else "unknown"
        raise UnsupportedAudio(f"audio codec {name!r} is not taken")
    _check_rate_and_channels(context.sample_rate, context.channels)
    claimed = 0.0  # the header's duration: only ever used to refuse early
    if stream.duration and stream.time_base:
        claimed = float(stream.duration * stream.time_base)
    elif container.duration:
        claimed = container.duration / av.time_base
    if max_seconds is not None and claimed > max_seconds:
        raise AudioTooLong(f"its header claims {claimed:.0f} s, over the {max_seconds:.0f} s limit")
    return stream


def probe(path: Path, max_seconds: float | None = None) -> float:
    """Seconds of audio in an untrusted file, from its packets' durations: the file is demuxed,
    and decoded only until its first frame (which proves its codec's data), so that checking an
    upload costs neither memory nor a decode. ``decode`` caps what it decodes whatever the
    packets said. Raises ``UnreadableAudio`` (or its ``UnsupportedAudio`` / ``AudioTooLong``)."""
    seconds, heard = 0.0, False
    with _opened(path, max_seconds) as (container, stream):
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
        for packet in container.demux(stream):
            if not packet.size:  # the demuxer's flush packet
                continue
            if not heard:
                for frame in packet.decode():
                    _check_frame(frame, rate, channels)
                    heard = True
            if packet.duration and packet.time_base:
                seconds += float(packet.duration * packet.time_base)
            _too_long(seconds, max_seconds)
    if not heard or seconds == 0:
        raise UnreadableAudio("no audio samples")
    return seconds


def decode(path: Path, max_seconds: float | None = None) -> np.ndarray:
    """Decode an untrusted audio file into 24 kHz mono float32 (at most ``max_seconds``: the
    decoded samples, and so the bytes kept, are capped while decoding); raises
    ``UnreadableAudio`` (or its ``UnsupportedAudio`` / ``AudioTooLong``)."""
    import av

    chunks: list[np.ndarray] = []
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    try:
        for frame in _frames(path, max_seconds):
            chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
        chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    except av.FFmpegError as exc:  # resampling (the frames are checked already)
        raise UnreadableAudio(f"not resamplable audio ({exc.strerror})") from exc
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise UnreadableAudio("no audio samples")
    if not np.isfinite(samples).all():
        raise UnreadableAudio("audio holds NaN or infinite samples")
    return samples


def loudness_gain(samples: np.ndarray, target_lufs: float = TARGET_LUFS) -> float:
    """The factor that brings ``samples`` to ``target_lufs`` integrated loudness (ITU-R BS.1770)
    without clipping: 1 for a clip too short to measure, or digital silence."""
    import pyloudnorm

    meter = pyloudnorm.Meter(SAMPLE_RATE)
    if samples.size < SAMPLE_RATE // 2:  # the meter needs 400 ms blocks
        return 1.0
    loudness = meter.integrated_loudness(samples.astype(np.float64))
    if not np.isfinite(loudness):  # digital silence
        return 1.0
    gain = 10 ** (min(target_lufs - loudness, MAX_GAIN_DB) / 20)
    peak = float(np.abs(samples).max()) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return float(gain)


def normalise_loudness(samples: np.ndarray, target_lufs: float = TARGET_LUFS) -> np.ndarray:
    """Scale to ``target_lufs`` integrated loudness (ITU-R BS.1770), without clipping."""
    gain = loudness_gain(samples, target_lufs)
    return samples if gain == 1.0 else (samples * gain).astype(np.float32)


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
        gain = loudness_gain(samples)
        recordings.append(Recording(path, (samples * gain).astype(np.float32), gain))
    return recordings, rejected
