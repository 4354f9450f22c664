"""FormatWriter: every format and rate, encoded in odd chunks, decoded back with PyAV."""

from __future__ import annotations

import io
import itertools
import math
import struct
import wave

import av
import numpy as np
import pytest
import soxr

from voicehost.audio.formats import (
    FORMATS,
    SAMPLE_RATES,
    FormatWriter,
    UnsupportedFormat,
    content_type,
    encoding_rate,
    output_rate,
    to_pcm16,
    wav_header,
)
from voicehost.model.orpheus import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = pytest.mark.unit

SIGNAL_SAMPLES = 60_037  # 2.5 s and a bit: no codec frame size divides it
TONE_HZ = 440.0
TELEPHONE = ("mulaw", "alaw")
LOSSLESS = ("pcm", "wav", "flac")
LOSSY = ("mp3", "opus", "aac")
RAW_DEMUXERS = {"pcm": "s16le", "mulaw": "mulaw", "alaw": "alaw"}
# Neither an mp3 stream without a LAME tag nor ADTS can tell a decoder to trim the encoder's
# priming: it comes back in front (LAME 576 + decoder 529; AAC 1024), and the last frame is
# padded. The other formats decode to exactly the samples sent.
PRIMING = {"mp3": 1105, "aac": 1024}


def codec_frame(fmt: str, rate: int) -> int:
    """Samples per mp3 or AAC frame: MPEG-2 and 2.5 (below 32 kHz) halve the mp3 frame."""
    if fmt == "mp3":
        return 1152 if rate >= 32000 else 576
    return 1024


def tone_and_chirp(samples: int = SIGNAL_SAMPLES) -> np.ndarray:
    """A 440 Hz tone with a quieter 100 Hz -> 3.5 kHz chirp under it, at the model's rate."""
    t = np.arange(samples) / SAMPLE_RATE
    seconds = samples / SAMPLE_RATE
    chirp = np.sin(2 * np.pi * (100 * t + (3500 - 100) / (2 * seconds) * t**2))
    return (0.4 * np.sin(2 * np.pi * TONE_HZ * t) + 0.2 * chirp).astype(np.float32)


def random_chunks(samples: np.ndarray, seed: int) -> list[np.ndarray]:
    """``samples`` cut at random, with empty and 1-sample chunks among them."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 0, 1, 2]
    while sum(sizes) < len(samples):
        sizes.append(int(rng.choice([0, 1, 7, 333, 2048, 4096, 7001])))
    edges = np.cumsum([0, *sizes])
    return [samples[start:end] for start, end in itertools.pairwise(edges)]


def encode_all(writer: FormatWriter, chunks: list[np.ndarray]) -> tuple[list[bytes], bytes]:
    """What each ``encode`` call returned, and what ``finish`` returned."""
    return [writer.encode(chunk) for chunk in chunks], writer.finish()


def decode(fmt: str, data: bytes, rate: int) -> tuple[np.ndarray, int]:
    """Mono float samples and the sample rate PyAV decodes ``data`` to (``rate``: for raw ones)."""
    raw = RAW_DEMUXERS.get(fmt)
    options = {"sample_rate": str(rate)} if raw else {}
    blocks = []
    with av.open(io.BytesIO(data), format=raw, options=options) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.channels == 1
        for frame in container.decode(stream):
            block = frame.to_ndarray()[0]
            blocks.append(block / 32768.0 if block.dtype == np.int16 else block)
            decoded_rate = frame.sample_rate
    return np.concatenate(blocks).astype(np.float32), decoded_rate


def resampled(samples: np.ndarray, rate: int) -> np.ndarray:
    return samples if rate == SAMPLE_RATE else soxr.resample(samples, SAMPLE_RATE, rate)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


VALID = [
    *[(fmt, None) for fmt in FORMATS],
    *[(fmt, rate) for fmt in FORMATS if fmt not in TELEPHONE for rate in SAMPLE_RATES],
    *[(fmt, 8000) for fmt in TELEPHONE],
]


@pytest.mark.parametrize(("fmt", "rate"), VALID)
def test_every_format_decodes_to_its_rate_and_duration(fmt: str, rate: int | None) -> None:
    signal = tone_and_chirp()
    writer = FormatWriter(fmt, rate)
    parts, tail = encode_all(writer, random_chunks(signal, seed=rate or 0))
    decoded, decoded_rate = decode(fmt, b"".join(parts) + tail, writer.sample_rate)

    assert decoded_rate == writer.sample_rate == output_rate(fmt, rate)
    expected = len(signal) * decoded_rate / SAMPLE_RATE
    extra = len(decoded) - expected
    if fmt in PRIMING:
        assert PRIMING[fmt] - 1 <= extra <= PRIMING[fmt] + codec_frame(fmt, decoded_rate)
    else:
        # Exact, to the rounding of one sample at the encoding rate (opus plays 8 kHz as 48 kHz).
        assert abs(extra) <= decoded_rate / encoding_rate(fmt, rate)


@pytest.mark.parametrize("fmt", LOSSLESS)
@pytest.mark.parametrize("rate", [8000, 24000, 44100])
def test_lossless_formats_carry_the_resampled_samples_exactly(fmt: str, rate: int) -> None:
    signal = tone_and_chirp()
    writer = FormatWriter(fmt, rate)
    parts, tail = encode_all(writer, random_chunks(signal, seed=rate))
    decoded, _ = decode(fmt, b"".join(parts) + tail, rate)

    # Streamed in odd chunks, the samples are a one-shot resampling at full scale 32767, to the
    # one step that float -> int16 truncates (no clicks at chunk edges, no wrong gain). The
    # expected values are computed here, not by the conversion under test.
    expected = resampled(signal, rate).astype(np.float64) * 32767
    received = np.round(decoded.astype(np.float64) * 32768)
    assert received.shape == expected.shape
    np.testing.assert_allclose(received, expected, rtol=0, atol=1)


def known_pcm_values() -> np.ndarray:
    """Every 16-bit value but -32768, shuffled: what the model's floats k / 32767 must become."""
    return np.random.default_rng(5).permutation(np.arange(-32767, 32768))


@pytest.mark.unit
@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_formats_at_the_model_rate_carry_known_pcm_values_exactly(fmt: str) -> None:
    values = known_pcm_values()
    over = np.array([1.5, -1.5, 2.0, -2.0, 1.0, -1.0], np.float32)  # clipped to full scale
    signal = np.concatenate([(values / 32767).astype(np.float32), over])
    writer = FormatWriter(fmt)
    parts, tail = encode_all(writer, random_chunks(signal, seed=11))
    decoded, _ = decode(fmt, b"".join(parts) + tail, SAMPLE_RATE)

    received = np.round(decoded.astype(np.float64) * 32768).astype(np.int64)
    expected = [*values, 32767, -32767, 32767, -32767, 32767, -32767]
    np.testing.assert_array_equal(received, expected)


@pytest.mark.unit
def test_pcm16_is_full_scale_at_32767_and_clips_beyond():
    samples = np.array([0, 0.5, -0.5, 1 / 32767, 1, -1, 1.5, -1.5, 2, -2, 1e9], np.float32)
    pcm = np.frombuffer(to_pcm16(samples), "<i2")
    expected = [0, 16383, -16383, 1, 32767, -32767, 32767, -32767, 32767, -32767, 32767]
    assert pcm.tolist() == expected
    assert to_pcm16(np.array([1.0], np.float32)) == b"\xff\x7f"  # little-endian 0x7fff


@pytest.mark.unit
@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_formats_clip_samples_beyond_full_scale(fmt: str) -> None:
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    loud = (3.0 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
    writer = FormatWriter(fmt)
    parts, tail = encode_all(writer, random_chunks(loud, seed=3))
    decoded, _ = decode(fmt, b"".join(parts) + tail, writer.sample_rate)

    # A clipped tone comes back near full scale (AAC overshoots to 1.25), never near 3.
    assert 0.9 < decoded.max() < 1.4
    assert -1.4 < decoded.min() < -0.9


@pytest.mark.unit
@pytest.mark.parametrize(("fmt", "rate"), [("pcm", 16000), ("wav", 44100), ("flac", None)])
def test_samples_of_any_float_type_and_shape_encode_as_the_same_float32_samples(fmt, rate):
    signal = tone_and_chirp(5000)
    reference = FormatWriter(fmt, rate)
    expected = reference.encode(signal) + reference.finish()
    for variant in (signal.astype(np.float64), signal.reshape(-1, 1), signal.reshape(1, -1)):
        writer = FormatWriter(fmt, rate)
        assert writer.encode(variant) + writer.finish() == expected
    writer = FormatWriter(fmt, rate)
    assert writer.encode(signal.tolist()) + writer.finish() == expected  # a plain list too


@pytest.mark.unit
def test_a_writer_says_its_format_and_the_rate_it_sends():
    opus = FormatWriter("opus", 16000)
    assert (opus.fmt, opus.sample_rate) == ("opus", 48000)
    mulaw = FormatWriter("mulaw")
    assert (mulaw.fmt, mulaw.sample_rate) == ("mulaw", 8000)


@pytest.mark.unit
def test_the_streaming_wav_header_describes_mono_pcm16_of_unknown_length():
    header = wav_header(16000)
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt " and header[36:40] == b"data"
    riff, fmt_size = struct.unpack("<I", header[4:8])[0], struct.unpack("<I", header[16:20])[0]
    assert (riff, fmt_size, struct.unpack("<I", header[40:44])[0]) == (2**32 - 1, 16, 2**32 - 1)
    # format 1 (PCM), 1 channel, 16000 Hz, 32000 bytes/s in blocks of 2 bytes, 16 bits
    assert struct.unpack("<HHIIHH", header[20:36]) == (1, 1, 16000, 32000, 2, 16)
    stereo = struct.unpack("<HHIIHH", wav_header(22050, channels=2)[20:36])
    assert stereo == (1, 2, 22050, 88200, 4, 16)


@pytest.mark.unit
def test_a_wav_header_with_a_length_makes_a_file_the_wave_module_reads():
    pcm = to_pcm16(tone_and_chirp(3001))
    data = wav_header(24000, data_size=len(pcm)) + pcm
    assert struct.unpack("<I", data[4:8])[0] == 36 + len(pcm) == len(data) - 8
    with wave.open(io.BytesIO(data)) as reader:
        shape = (reader.getnchannels(), reader.getsampwidth(), reader.getframerate())
        assert shape == (1, 2, 24000)
        assert reader.getnframes() == 3001
        assert reader.readframes(3001) == pcm


@pytest.mark.parametrize("fmt", TELEPHONE)
def test_telephone_formats_are_the_signal_at_8_khz_with_g711_noise(fmt: str) -> None:
    signal = tone_and_chirp()
    writer = FormatWriter(fmt)
    parts, tail = encode_all(writer, random_chunks(signal, seed=8))
    decoded, _ = decode(fmt, b"".join(parts) + tail, 8000)

    reference = resampled(signal, 8000)
    noise = decoded - reference
    snr_db = 10 * math.log10(np.sum(reference**2) / np.sum(noise**2))
    assert snr_db > 35


@pytest.mark.parametrize("fmt", LOSSY)
@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_lossy_formats_keep_the_tone_and_its_loudness(fmt: str, rate: int) -> None:
    tone = (0.5 * np.sin(2 * np.pi * TONE_HZ * np.arange(SAMPLE_RATE) / SAMPLE_RATE)).astype(
        np.float32
    )
    writer = FormatWriter(fmt, rate)
    parts, tail = encode_all(writer, random_chunks(tone, seed=rate))
    decoded, decoded_rate = decode(fmt, b"".join(parts) + tail, rate)

    middle = decoded[decoded_rate // 4 : decoded_rate * 3 // 4]  # clear of priming and fades
    assert dominant_hz(middle, decoded_rate) == pytest.approx(TONE_HZ, abs=2)
    # Opus and AAC keep the level within 1%; LAME's mp3 comes back 5% (0.45 dB) quieter.
    loudness = np.sqrt(np.mean(middle**2)) / (0.5 / math.sqrt(2))
    assert 0.93 < loudness < 1.02


@pytest.mark.parametrize("fmt", FORMATS)
def test_audio_streams_out_before_finish(fmt: str) -> None:
    signal = tone_and_chirp()
    writer = FormatWriter(fmt)
    model_frames = [
        signal[start : start + SAMPLES_PER_FRAME]
        for start in range(0, len(signal), SAMPLES_PER_FRAME)
    ]
    parts, _ = encode_all(writer, model_frames)
    decoded, decoded_rate = decode(fmt, b"".join(parts), writer.sample_rate)

    # All but about one model frame (85 ms) of audio is out before the stream is finished.
    held_back = len(signal) / SAMPLE_RATE - len(decoded) / decoded_rate
    assert held_back < 0.1


CODEC_CASES = [
    *[(fmt, None) for fmt in FORMATS if fmt not in ("pcm", "wav")],  # every format PyAV encodes
    ("mp3", 48000),  # MPEG-1: 1152-sample frames
    ("opus", 48000),  # 960-sample frames
]


@pytest.mark.parametrize(("fmt", "rate"), CODEC_CASES)
def test_a_codec_stream_decodes_to_the_same_audio_however_the_samples_are_chunked(
    fmt: str, rate: int | None
) -> None:
    signal = tone_and_chirp()
    whole = FormatWriter(fmt, rate)
    one_chunk = whole.encode(signal) + whole.finish()
    chunked = FormatWriter(fmt, rate)
    parts, tail = encode_all(chunked, random_chunks(signal, seed=7))
    expected, _ = decode(fmt, one_chunk, whole.sample_rate)
    received, _ = decode(fmt, b"".join(parts) + tail, chunked.sample_rate)

    # Codec frames are cut from the stream, not from each chunk: the same frames and
    # timestamps, no padding at chunk edges, one short frame at the end.
    np.testing.assert_array_equal(received, expected)


@pytest.mark.parametrize(
    ("fmt", "magic"),
    [("wav", b"RIFF"), ("mp3", b"ID3"), ("opus", b"OggS"), ("flac", b"fLaC")],
)
def test_first_encode_returns_the_container_header(fmt: str, magic: bytes) -> None:
    assert FormatWriter(fmt).encode(np.zeros(0, np.float32)).startswith(magic)


@pytest.mark.parametrize("fmt", ["pcm", "aac", "mulaw", "alaw"])
def test_headerless_formats_return_nothing_for_no_audio(fmt: str) -> None:
    assert FormatWriter(fmt).encode(np.zeros(0, np.float32)) == b""


def test_wav_of_no_audio_is_the_bare_header_at_the_output_rate() -> None:
    writer = FormatWriter("wav", 16000)
    data = writer.encode(np.zeros(0, np.float32)) + writer.finish()
    assert len(data) == 44
    assert int.from_bytes(data[24:28], "little") == 16000


def test_pcm_at_the_model_rate_is_the_samples_as_s16le() -> None:
    signal = tone_and_chirp(2400)
    parts, tail = encode_all(FormatWriter("pcm"), random_chunks(signal, seed=0))
    assert b"".join(parts) + tail == to_pcm16(signal)


def test_default_rates_are_the_model_rate_and_8_khz_for_g711() -> None:
    assert {fmt: output_rate(fmt, None) for fmt in FORMATS} == {
        "pcm": 24000,
        "wav": 24000,
        "mp3": 24000,
        "opus": 48000,
        "flac": 24000,
        "aac": 24000,
        "mulaw": 8000,
        "alaw": 8000,
    }


@pytest.mark.parametrize(
    ("rate", "encoded_at"), [(8000, 8000), (16000, 16000), (22050, 24000), (44100, 48000)]
)
def test_opus_encodes_at_the_next_opus_rate_and_plays_at_48_khz(rate: int, encoded_at: int) -> None:
    assert encoding_rate("opus", rate) == encoded_at
    assert output_rate("opus", rate) == 48000


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [("ogg", None), ("MP3", None), ("wav", 12345), ("pcm", 0), ("mulaw", 16000), ("alaw", 24000)],
)
def test_unsupported_formats_and_rates_are_refused(fmt: str, rate: int | None) -> None:
    with pytest.raises(UnsupportedFormat):
        FormatWriter(fmt, rate)


def test_unknown_format_has_no_content_type() -> None:
    with pytest.raises(UnsupportedFormat, match="use one of pcm, wav"):
        content_type("webm")


def test_content_types() -> None:
    assert {fmt: content_type(fmt) for fmt in FORMATS} == {
        "pcm": "audio/pcm",
        "wav": "audio/wav",
        "mp3": "audio/mpeg",
        "opus": "audio/ogg; codecs=opus",
        "flac": "audio/flac",
        "aac": "audio/aac",
        "mulaw": "audio/basic",
        "alaw": "audio/x-alaw-basic",
    }


def test_a_finished_writer_takes_no_more_audio() -> None:
    writer = FormatWriter("mp3")
    writer.finish()
    with pytest.raises(RuntimeError) as after_encode:
        writer.encode(np.zeros(10, np.float32))
    with pytest.raises(RuntimeError) as after_finish:
        writer.finish()
    assert str(after_encode.value) == str(after_finish.value) == "this FormatWriter is finished"


@pytest.mark.unit
def test_refused_rates_say_which_rates_are_taken():
    with pytest.raises(
        UnsupportedFormat,
        match=r"sample_rate 12345 is not supported; use one of 8000, 16000, 22050, 24000, 44100, "
        r"48000$",
    ):
        FormatWriter("wav", 12345)
    with pytest.raises(
        UnsupportedFormat, match=r"alaw is G\.711 telephone audio at 8000 Hz only, not 16000 Hz"
    ):
        FormatWriter("alaw", 16000)
