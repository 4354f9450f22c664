"""The channel a clip came through (``voicehost.audio.channel``): its band measured from real
speech (espeak-ng) carried by real channels (sox), and the view the speaker checks hear every
clip through."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from lora_training.ingest import decode
from voicehost.audio.channel import (
    FULL,
    RAW,
    Band,
    Channel,
    ChannelView,
    channel_labels,
    common_band,
    level,
    limit,
    lows_db,
    measure_band,
    measure_channel,
    spectrum_db,
)
from voicehost.tools.devcorpus import speak

pytestmark = pytest.mark.unit

RATE = 24000
TEXT = "Could you pass the salt and pepper, please?"


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> dict[str, np.ndarray]:
    """One sentence by a man's and a woman's espeak-ng voice, each clean, over a telephone
    line (8 kHz mu-law, 300-3400 Hz) and through mp3 at 24 kbit/s (sox), decoded at 24 kHz."""
    folder = tmp_path_factory.mktemp("channel")
    found = {}
    for voice in ("en+m1", "en-us+f2"):
        clean = folder / f"{voice}.wav"
        speak(TEXT, clean, 0.2, "wav", voice=voice)
        phone = folder / f"{voice}-phone.wav"
        line = ["sox", str(clean), "-r", "8000", "-e", "u-law", str(phone), "sinc", "300-3400"]
        subprocess.run(line, check=True)
        found[voice] = decode(clean)
        found[f"{voice} phone"] = decode(phone)
    return found


def test_a_telephone_line_is_measured_as_its_band_and_clean_speech_as_the_whole(speech):
    for voice in ("en+m1", "en-us+f2"):
        assert measure_band(speech[voice]) == FULL
        assert measure_band(speech[f"{voice} phone"]) == Band(300, 3400)


def test_a_low_rate_codecs_top_edge_is_found(tmp_path: Path):
    source = tmp_path / "clean.wav"
    speak(TEXT, source, 0.2, "wav", voice="en+m1")
    coded = tmp_path / "coded.wav"
    # sox cannot write mp3 here: a 6 kHz low-pass of the order a 24 kbit/s mp3 applies
    subprocess.run(["sox", str(source), str(coded), "sinc", "-6000"], check=True)
    assert measure_band(decode(coded)) == Band(0, 6000)


def test_silence_and_a_clip_too_short_to_measure_count_as_the_whole_band():
    assert measure_band(np.zeros(RATE, dtype=np.float32)) == FULL
    assert measure_band(np.ones(100, dtype=np.float32)) == FULL


def test_the_common_band_is_the_narrowest_of_each_edge():
    bands = [FULL, Band(0, 6000), Band(300, 3400)]
    assert common_band(bands) == Band(300, 3400)
    assert common_band([FULL, Band(0, 6000)]) == Band(0, 6000)
    assert common_band([]) == FULL


def test_limiting_to_a_band_removes_what_lies_outside_it_and_keeps_what_is_inside(speech):
    clean = speech["en+m1"]
    narrow = limit(clean, Band(300, 3400))
    assert narrow.shape == clean.shape and narrow.dtype == np.float32
    freqs, before = spectrum_db(clean)
    _, after = spectrum_db(narrow)
    inside = (freqs > 600) & (freqs < 3000)
    above = freqs > 4000
    assert np.max(np.abs(after[inside] - before[inside])) < 1.0  # dB
    assert np.min(before[above] - after[above]) > 40
    assert measure_band(narrow) == Band(300, 3400)
    assert np.array_equal(limit(clean, FULL), clean)


def test_level_brings_every_clip_to_one_rms_and_leaves_silence_alone(speech):
    loud, quiet = speech["en+m1"], speech["en+m1"] * 0.01
    for clip in (loud, quiet):
        rms = float(np.sqrt(np.mean(np.square(level(clip), dtype=np.float64))))
        assert 20 * np.log10(rms) == pytest.approx(-30.0, abs=0.01)
    assert not np.any(level(np.zeros(100, dtype=np.float32)))


def test_a_view_of_clips_hears_each_in_their_common_band(speech):
    view = ChannelView.of([speech["en+m1"], speech["en-us+f2 phone"]])
    assert view.band == Band(300, 3400)
    assert measure_band(view.treat(speech["en+m1"])) == Band(300, 3400)
    assert ChannelView.of([speech["en+m1"], speech["en-us+f2"]]).band == FULL
    assert np.array_equal(RAW.treat(speech["en+m1"]), speech["en+m1"])


@pytest.fixture(scope="module")
def sentences(tmp_path_factory) -> dict[str, list[np.ndarray]]:
    """Eight sentences by one man's voice: dry, under white noise at about 10 dB SNR, and
    through a thin microphone (a 300 Hz high-pass, sox)."""
    from voicehost.tools.devcorpus import SENTENCES

    folder = tmp_path_factory.mktemp("sentences")
    found: dict[str, list[np.ndarray]] = {"dry": [], "noise": [], "thin": []}
    rng = np.random.default_rng(0)
    for index, text in enumerate(SENTENCES[:8]):
        dry = folder / f"{index}.wav"
        speak(text, dry, 0.2, "wav", voice="en+m1")
        thin = folder / f"{index}-thin.wav"
        subprocess.run(["sox", str(dry), str(thin), "highpass", "300", "highpass", "300"])
        samples = decode(dry)
        loud = samples[np.abs(samples) > 0.02 * np.abs(samples).max()]
        noise = rng.standard_normal(samples.size) * np.sqrt(np.mean(loud**2) / 10)
        found["dry"].append(samples)
        found["noise"].append((samples + noise).astype(np.float32))
        found["thin"].append(decode(thin))
    return found


def test_a_noise_floor_is_measured_and_dry_speech_is_dry(sentences):
    assert {measure_channel(s).room for s in sentences["dry"]} == {"dry"}
    assert {measure_channel(s).room for s in sentences["noise"]} <= {"floor", "high floor"}
    assert measure_channel(np.zeros(100, dtype=np.float32)) == Channel(FULL, "dry")


def test_two_microphones_of_one_channel_class_get_two_labels_one_microphone_one(sentences):
    """Eight dry clips and eight through a thin microphone: both ``dry`` by their room, told
    apart by their low end; eight dry clips alone, or five thin ones among them (too few to
    be more than a voice of its own), share one label."""
    labels = channel_labels(sentences["dry"] + sentences["thin"])
    assert len(set(labels[:8])) == 1 and len(set(labels[8:])) == 1
    assert labels[0] != labels[8] and labels[8].endswith("thin")
    assert len(set(channel_labels(sentences["dry"]))) == 1
    assert len(set(channel_labels(sentences["dry"] + sentences["thin"][:5]))) == 1
    assert channel_labels([]) == []
    assert lows_db(sentences["thin"][0]) < lows_db(sentences["dry"][0]) - 10
