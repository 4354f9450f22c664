"""PCM samples -> bytes on the wire, in every response format, encoded as the audio arrives.

The model speaks float32 mono at 24 kHz. ``FormatWriter`` resamples that to the format's output
rate with soxr (one stream per response, so chunk edges do not click) and encodes it:

    format  bytes                    content type             sample rate the client gets
    pcm     raw s16le                audio/pcm                ``sample_rate``, default 24000
    wav     streaming WAV, s16le     audio/wav                ``sample_rate``, default 24000
    mp3     MPEG audio (LAME)        audio/mpeg               ``sample_rate``, default 24000
    opus    Opus in Ogg              audio/ogg; codecs=opus   48000 always (see below)
    flac    FLAC                     audio/flac               ``sample_rate``, default 24000
    aac     AAC-LC in ADTS           audio/aac                ``sample_rate``, default 24000
    mulaw   raw G.711 mu-law         audio/basic              8000 only
    alaw    raw G.711 A-law          audio/x-alaw-basic       8000 only

Opus encodes at 8, 12, 16, 24 or 48 kHz, and Ogg Opus plays back at 48 kHz (RFC 7845; FFmpeg,
opusfile and browsers all decode to 48 kHz), so an opus stream is 48 kHz whatever was asked.
``sample_rate`` still picks the Opus encoder's rate, i.e. the audio bandwidth: 22050 and 44100,
which Opus lacks, encode at the next Opus rate up (24000, 48000).

With a ``speed`` other than 1.0 the 24 kHz PCM goes through a ``voicehost.audio.tempo.TimeStretch``
(FFmpeg's atempo: faster or slower, same pitch) before it is resampled and encoded, so every
format and transport gets it from this one place.

pcm and wav (at speed 1.0) never touch PyAV. Decoded durations: pcm, wav, flac,
mulaw, alaw and opus give back exactly the samples sent (opus trims its priming and padding in
the Ogg granule positions); mp3 and ADTS cannot say how much to trim, so a decoder returns
codec priming (mp3 1105 samples, aac 1024) in front and up to one codec frame of silence behind.

Where the encoding runs (off the event loop: threads, or processes of their own) is
``voicehost.audio.encoding``'s.
"""

from __future__ import annotations

import struct
import wave
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import soxr

from voicehost.audio.tempo import TimeStretch, atempo_steps
from voicehost.errors import ServiceError
from voicehost.model.orpheus import SAMPLE_RATE

STREAMING_SIZE = 0xFFFFFFFF  # "unknown length": players read until the stream ends

FORMATS: tuple[str, ...] = ("pcm", "wav", "mp3", "opus", "flac", "aac", "mulaw", "alaw")
SAMPLE_RATES: tuple[int, ...] = (8000, 16000, 22050, 24000, 44100, 48000)
TELEPHONE_RATE = 8000  # G.711 (mulaw, alaw) is defined at 8 kHz only
TELEPHONE_FORMATS = ("mulaw", "alaw")
OPUS_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)
OPUS_PLAYBACK_RATE = 48000

CONTENT_TYPES: dict[str, str] = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac",
    "aac": "audio/aac",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
}


@dataclass(frozen=True, slots=True)
class _PyAVFormat:
    """How PyAV writes one format: muxer, PyAV's encoder, the sample format the encoder takes."""

    muxer: str
    encoder: str
    sample_format: str  # "s16" (packed int16) or "flt"/"fltp" (float32; mono, so same layout)
    muxer_options: dict[str, str] = field(default_factory=dict)
    bit_rate: int | None = None  # None: the encoder's default
    codec_options: dict[str, str] = field(default_factory=dict)  # the encoder's own settings


_PYAV_FORMATS: dict[str, _PyAVFormat] = {
    # LAME's default scales with the rate, down to 8 kbit/s at 8 kHz: too thin for speech.
    # LAME's quality 7 (its -q; the library's default is 3): about 8.4 ms of CPU per audio
    # second instead of 15 (5: 13), the same 64 kbit/s, no noise shaping; the speaker's
    # embedding and the spectrum as close to the source as at 3 or 5
    # (scripts/bench_mp3_levels.py, docs/BENCHMARKS.md, issue 30).
    "mp3": _PyAVFormat(
        "mp3", "libmp3lame", "fltp", bit_rate=64000, codec_options={"compression_level": "7"}
    ),
    # One 20 ms packet per Ogg page: the default 1 s pages would hold audio back for a second.
    "opus": _PyAVFormat("ogg", "libopus", "flt", {"page_duration": "20000"}),
    # No 8 KiB PADDING block: it is for taggers rewriting files in place, not for streams.
    "flac": _PyAVFormat("flac", "flac", "s16", {"metadata_header_padding": "0"}),
    "aac": _PyAVFormat("adts", "aac", "fltp"),
    "mulaw": _PyAVFormat("mulaw", "pcm_mulaw", "s16"),
    "alaw": _PyAVFormat("alaw", "pcm_alaw", "s16"),
}


class UnsupportedFormat(ServiceError, ValueError):
    """A format, or a format and sample rate, that this server cannot produce."""

    code = "unsupported_format"


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] -> 16-bit little-endian PCM (clipped)."""
    return _pcm16(samples).tobytes()


def _pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def write_wav(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Float samples (full scale 1.0) as a 16-bit mono WAV file at ``rate``."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(to_pcm16(samples))


def wav_header(
    sample_rate: int = SAMPLE_RATE, channels: int = 1, data_size: int | None = None
) -> bytes:
    """A 44-byte PCM16 WAV header; without ``data_size`` the sizes say "unknown" for streaming."""
    block_align = channels * 2
    data = STREAMING_SIZE if data_size is None else data_size
    riff = STREAMING_SIZE if data_size is None else 36 + data_size
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack(
            "<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, 16
        )
        + b"data"
        + struct.pack("<I", data)
    )


def content_type(fmt: str) -> str:
    """The Content-Type of a ``fmt`` stream; raises ``UnsupportedFormat`` for an unknown format."""
    _check_format(fmt)
    return CONTENT_TYPES[fmt]


def encoding_rate(fmt: str, sample_rate: int | None) -> int:
    """The rate ``fmt`` is encoded at when ``sample_rate`` is asked for (``None``: the default).

    Equal to ``output_rate`` except for opus, which encodes at the asked rate, or the next Opus
    rate up, and is played back at 48 kHz. Raises ``UnsupportedFormat``.
    """
    _check_format(fmt)
    telephone = fmt in TELEPHONE_FORMATS
    if sample_rate is None:
        return TELEPHONE_RATE if telephone else SAMPLE_RATE
    if sample_rate not in SAMPLE_RATES:
        rates = ", ".join(map(str, SAMPLE_RATES))
        raise UnsupportedFormat(f"sample_rate {sample_rate} is not supported; use one of {rates}")
    if telephone and sample_rate != TELEPHONE_RATE:
        raise UnsupportedFormat(
            f"{fmt} is G.711 telephone audio at {TELEPHONE_RATE} Hz only, not {sample_rate} Hz"
        )
    if fmt == "opus":
        return min(rate for rate in OPUS_RATES if rate >= sample_rate)
    return sample_rate


def output_rate(fmt: str, sample_rate: int | None) -> int:
    """The sample rate a client decodes a ``fmt`` stream at, for the asked ``sample_rate``.

    ``None`` asks for the default: 24000 (the model's rate), 8000 for mulaw and alaw. Opus is
    always 48000 (see the module docstring). Raises ``UnsupportedFormat`` for an unknown format,
    a rate outside ``SAMPLE_RATES``, or mulaw/alaw at anything but 8000.
    """
    rate = encoding_rate(fmt, sample_rate)
    return OPUS_PLAYBACK_RATE if fmt == "opus" else rate


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UnsupportedFormat(f"unknown audio format {fmt!r}; use one of {', '.join(FORMATS)}")


class _ByteSink:
    """A write-only, non-seekable file for PyAV: muxers stream instead of seeking back."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


class _Muxer:
    """A PyAV encoder and muxer writing to memory, fed one frame per chunk.

    PyAV's encoder cuts each frame into codec frames in C (its resampler, with the codec's frame
    size), so the Python work is per chunk, not per codec frame, and the last frame is short.
    """

    def __init__(self, pyav: _PyAVFormat, rate: int) -> None:
        self._pyav = pyav
        self._rate = rate
        self._sink = _ByteSink()
        self._container = av.open(
            self._sink, "w", format=pyav.muxer, container_options=pyav.muxer_options
        )
        self._stream = self._container.add_stream(pyav.encoder, rate=rate, layout="mono")
        self._stream.codec_context.format = pyav.sample_format
        if pyav.bit_rate is not None:
            self._stream.codec_context.bit_rate = pyav.bit_rate
        if pyav.codec_options:
            self._stream.codec_context.options = dict(pyav.codec_options)
        # Opens the encoder and writes the container header right away.
        self._container.start_encoding()
        self._pts = 0

    def push(self, samples: np.ndarray, last: bool) -> bytes:
        """Encode ``samples`` (and flush everything if ``last``); returns the bytes out."""
        if len(samples):
            self._container.mux(self._stream.encode(self._frame(samples)))
        if last:
            # Flushes the codec frame left over as a short last frame, then the encoder.
            self._container.mux(self._stream.encode(None))
            self._container.close()
        return self._sink.drain()

    def _frame(self, block: np.ndarray) -> av.AudioFrame:
        data = _pcm16(block) if self._pyav.sample_format == "s16" else np.clip(block, -1.0, 1.0)
        frame = av.AudioFrame.from_ndarray(
            data[np.newaxis, :], format=self._pyav.sample_format, layout="mono"
        )
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += len(block)
        return frame


class FormatWriter:
    """One response's audio: model samples in, bytes of ``fmt`` out, as they become ready.

    Call ``encode`` for every chunk of float32 mono samples at 24 kHz in [-1, 1] (any length,
    0 included), then ``finish`` once; the concatenation of what they return is one complete
    stream of ``fmt`` at ``sample_rate`` (``output_rate``), played ``speed`` times as fast
    (0.25 to 4.0, pitch kept). Raises ``UnsupportedFormat`` on construction for what
    ``output_rate`` refuses, ``ValueError`` for a speed out of range. Not thread-safe; cheap to
    abandon mid-stream.
    """

    def __init__(self, fmt: str, sample_rate: int | None = None, speed: float = 1.0) -> None:
        self.fmt = fmt
        self.sample_rate = output_rate(fmt, sample_rate)
        self.speed = speed
        self._stretch = TimeStretch(speed) if speed != 1.0 else None
        self._rate = encoding_rate(fmt, sample_rate)
        self._resampler = (
            None
            if self._rate == SAMPLE_RATE
            else soxr.ResampleStream(SAMPLE_RATE, self._rate, 1, dtype="float32")
        )
        self._finished = False
        self._header = wav_header(self._rate) if fmt == "wav" else b""
        self._muxer = _Muxer(_PYAV_FORMATS[fmt], self._rate) if fmt in _PYAV_FORMATS else None

    def encode(self, samples: np.ndarray) -> bytes:
        """Encode ``samples``; returns the bytes ready now (the header first), possibly b""."""
        return self._push(samples, last=False)

    def finish(self) -> bytes:
        """Flush the resampler and PyAV's encoder; the rest of the stream, trailer included."""
        return self._push(np.zeros(0, np.float32), last=True)

    def output_samples(self, model_samples: int) -> int:
        """How many samples of this stream ``model_samples`` of the model's audio become: at
        the output rate, after the speed change (what ``segment.done`` and SSE's ``done`` say)."""
        return output_samples(model_samples, self.sample_rate, self.speed)

    def _push(self, samples: np.ndarray, last: bool) -> bytes:
        if self._finished:
            raise RuntimeError("this FormatWriter is finished")
        self._finished = last
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._stretch is not None:
            stretched = self._stretch.push(samples)
            samples = np.concatenate((stretched, self._stretch.finish())) if last else stretched
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        header, self._header = self._header, b""
        if self._muxer is None:
            return header + to_pcm16(samples)
        return self._muxer.push(samples, last)


def check_stream(fmt: str, sample_rate: int | None, speed: float) -> int:
    """What ``FormatWriter(fmt, sample_rate, speed)`` would refuse, refused without building
    one (``UnsupportedFormat``, ``ValueError``); the stream's ``output_rate``."""
    if speed != 1.0:
        atempo_steps(speed)
    return output_rate(fmt, sample_rate)


def costly(fmt: str, sample_rate: int | None, speed: float) -> bool:
    """Whether encoding a ``fmt`` stream costs more than a hop off the event loop: a codec, a
    resampler or a time stretch (pcm and wav at the model's rate and speed are a conversion)."""
    return fmt in _PYAV_FORMATS or encoding_rate(fmt, sample_rate) != SAMPLE_RATE or speed != 1.0


def output_samples(model_samples: int, sample_rate: int, speed: float) -> int:
    """How many samples at ``sample_rate``, played ``speed`` times as fast, ``model_samples`` of
    the model's audio become."""
    return round(model_samples * sample_rate / SAMPLE_RATE / speed)
