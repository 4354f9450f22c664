"""PCM samples -> bytes on the wire: s16le and a streaming WAV header."""

from __future__ import annotations

import struct

import numpy as np

from voicehost.orpheus import SAMPLE_RATE

STREAMING_SIZE = 0xFFFFFFFF  # "unknown length": players read until the stream ends


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] -> 16-bit little-endian PCM (clipped)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


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
