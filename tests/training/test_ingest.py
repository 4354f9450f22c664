"""Ingest's header checks on their own: a WAV's fmt chunk must add up (byte rate = rate x block,
block = channels x bits / 8) before any decoder sees the file; and the upload's probe, which
reads a file's length from its packets, agrees with decoding it."""

import struct
import subprocess
from pathlib import Path

import pytest

from lora_training.ingest import UnsupportedAudio, check_wav_header, decode, probe

pytestmark = pytest.mark.unit


def wav(tag: int, channels: int, rate: int, byte_rate: int, align: int, bits: int) -> bytes:
    """A WAV header with exactly these fmt fields and a 64-byte data chunk."""
    fmt = struct.pack("<HHIIHH", tag, channels, rate, byte_rate, align, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", 64)
    return b"RIFF" + struct.pack("<I", len(body) + 64) + body + bytes(64)


def consistent(channels: int, rate: int, bits: int, tag: int = 1) -> bytes:
    align = channels * bits // 8
    return wav(tag, channels, rate, rate * align, align, bits)


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("bits", [8, 16, 24, 32])
@pytest.mark.parametrize("rate", [8000, 22050, 48000])
def test_a_header_whose_byte_rate_and_block_add_up_passes(channels, bits, rate):
    header = consistent(channels, rate, bits)
    check_wav_header(header, len(header))
    float_header = consistent(channels, rate, 32, tag=3)
    check_wav_header(float_header, len(float_header))


@pytest.mark.parametrize(
    ("channels", "rate", "bits", "byte_rate", "align", "said"),
    [
        (1, 16000, 16, 32001, 2, "16000 Hz x 1 channels x 16 bits but 32001 bytes/s"),
        (1, 16000, 16, 31999, 2, "but 31999 bytes/s"),
        (2, 16000, 16, 32000, 4, "16000 Hz x 2 channels x 16 bits but 32000 bytes/s"),  # mono's
        (2, 16000, 16, 32000, 2, "in blocks of 2"),  # a stereo file posing as mono, block and all
        (1, 44100, 24, 44100 * 4, 4, "in blocks of 4"),  # 24 bits are 3 bytes, not 4
        (1, 16000, 12, 16000 * 2, 2, "x 12 bits"),  # not a sample width
    ],
)
def test_a_byte_rate_or_block_that_does_not_add_up_is_refused(
    channels, rate, bits, byte_rate, align, said
):
    for tag in (1, 3, 0xFFFE):  # PCM, float, extensible: the sizes are the format's own
        header = wav(tag, channels, rate, byte_rate, align, bits)
        with pytest.raises(UnsupportedAudio, match=f"WAV header does not add up: .*{said}"):
            check_wav_header(header, len(header))


def test_a_compressed_wav_is_not_held_to_pcm_sizes():
    """ADPCM (tag 2) and MP3-in-WAV (0x55) state their own byte rates; the decoder checks them."""
    for tag in (2, 0x55):
        header = wav(tag, 1, 16000, 4055, 256, 4)
        check_wav_header(header, len(header))


def encoded(source: Path, target: Path, codec: str, rate: int) -> Path:
    """``source`` (a WAV) re-encoded with ``codec`` at ``rate`` into ``target``'s container."""
    import av

    with av.open(str(source)) as reading, av.open(str(target), "w") as writing:
        stream = writing.add_stream(codec, rate=rate)
        stream.layout = "mono"
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=rate)
        for frame in reading.decode(audio=0):
            for piece in resampler.resample(frame):
                writing.mux(stream.encode(piece))
        writing.mux(stream.encode(None))
    return target


def test_the_probe_reads_each_containers_length_as_decoding_finds_it(tmp_path):
    speech = tmp_path / "speech.wav"
    said = "The probe reads packets, and decodes only the first of them."
    subprocess.run(["espeak-ng", "-w", str(speech), said], check=True)
    files = [speech, tmp_path / "speech.flac", tmp_path / "vorbis.ogg"]
    for target in files[1:]:
        subprocess.run(["sox", str(speech), str(target)], check=True)
    for name, codec, rate in [
        ("opus.ogg", "libopus", 48000),
        ("opus.webm", "libopus", 48000),  # a browser's recording: no length in its header
        ("speech.mp3", "libmp3lame", 24000),
        ("speech.m4a", "aac", 24000),
    ]:
        files.append(encoded(speech, tmp_path / name, codec, rate))
    for path in files:
        decoded = decode(path).size / 24000
        assert decoded > 2.0, path.name
        assert probe(path) == pytest.approx(decoded, abs=0.1), path.name
