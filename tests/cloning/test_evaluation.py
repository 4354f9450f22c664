"""Measuring a voice against its speaker: error rates, the gate, and a whole evaluation of real
(espeak-ng) speech with the real speaker embedder; `voicehost eval` against the dev server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from lora_training.ingest import decode
from voicehost.audio.speaker import load_embedder
from voicehost.audio.speech_start import leading_silence_ms
from voicehost.cli import main
from voicehost.cloning.evaluation import (
    SPEECH_THRESHOLD_DB,
    EvalReport,
    Sample,
    Spread,
    Thresholds,
    char_error_rate,
    edit_distance,
    evaluate,
    gate,
    plot,
    word_error_rate,
)
from voicehost.model.orpheus import SAMPLE_RATE

REFERENCE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you have a moment.",
    "The library closes early on Sundays.",
    "Our train was delayed by almost an hour.",
)
SPEAKER = "en-us"  # espeak-ng voices stand in for people
OTHERS = ("en-us+f2", "en-gb-scotland+f4")
LEAD_S = 0.5


def espeak(voice: str, text: str, folder: Path, lead_s: float = LEAD_S) -> np.ndarray:
    """``text`` said by the espeak-ng ``voice`` after ``lead_s`` of silence, 24 kHz float."""
    folder.mkdir(parents=True, exist_ok=True)
    name = abs(hash((voice, text)))  # one file each: evaluate() speaks side by side
    raw, padded = folder / f"raw-{name}.wav", folder / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), str(padded), "pad", f"{lead_s:.3f}", "0"], check=True)
    raw.unlink()  # the folder holds the padded clips alone (a folder of references)
    return decode(padded)


@pytest.mark.unit
def test_error_rates_count_word_and_character_edits_over_the_reference():
    assert edit_distance("kitten", "sitting") == 3
    assert word_error_rate("The cat sat on the mat.", "the cat sat on the mat") == 0.0
    assert word_error_rate("the cat sat on the mat", "the cat sat on mat") == pytest.approx(1 / 6)
    assert word_error_rate("a b", "a x b") == 0.5  # an inserted word
    assert word_error_rate("a b c d", "a q c") == 0.5  # one substituted, one missing
    assert word_error_rate("hello", "") == 1.0
    assert char_error_rate("abcd", "abed") == 0.25


def report(similarity: float, baseline: float | None, wer: float | None) -> EvalReport:
    return EvalReport(
        embedder="test-embedder",
        voice="v",
        sentences=["s"],
        references=3,
        similarity=Spread.of([similarity]),
        baseline_voice=None if baseline is None else "tara",
        baseline=None if baseline is None else Spread.of([baseline]),
        gain=None if baseline is None else similarity - baseline,
        ceiling=None,
        leading_silence_ms={"p50": 0.0, "p95": 0.0},
        real_time_factor={"mean": 0.5, "max": 0.5},
        intelligibility={"measured": False} if wer is None else {"measured": True, "wer": wer},
        seconds=1.0,
    )


@pytest.mark.unit
def test_the_gate_names_every_figure_below_its_threshold_and_passes_one_at_it():
    limits = Thresholds(min_similarity=0.75, min_gain=0.05, max_wer=0.2)
    assert gate(report(0.75, 0.70, 0.2), limits) == []  # each exactly at its bound
    reasons = gate(report(0.60, 0.58, 0.35), limits)
    assert len(reasons) == 3
    assert "0.600" in reasons[0] and "0.750" in reasons[0] and "test-embedder" in reasons[0]
    assert "'tara'" in reasons[1] and "+0.020" in reasons[1]
    assert "0.35" in reasons[2]
    assert gate(report(0.80, None, None), limits) == []  # no baseline, no ASR: not judged
    assert len(gate(report(0.80, 0.79, None), limits)) == 1


@pytest.mark.unit
def test_leading_silence_is_where_the_first_loud_window_starts():
    quiet, loud = np.zeros(SAMPLE_RATE // 4), 0.5 * np.ones(SAMPLE_RATE // 10)
    lead = np.concatenate([quiet, loud])
    assert leading_silence_ms(lead, SPEECH_THRESHOLD_DB) == pytest.approx(250, abs=10)
    assert leading_silence_ms(quiet, SPEECH_THRESHOLD_DB) == pytest.approx(250)  # all of it


@pytest.mark.unit
def test_an_evaluation_of_real_speech_finds_the_speaker_closer_than_other_voices(tmp_path):
    """The speaker's own espeak voice against its references beats two other espeak voices;
    every figure is filled in, and the report and its plot are written."""
    embedder = load_embedder()
    references = [espeak(SPEAKER, text, tmp_path / "refs") for text in REFERENCE_TEXTS]
    sentences = ["Can you tell me the way to the post office?", "Seven people waited outside."]
    spoken: list[tuple[str, str]] = []

    async def speak(voice: str, sentence: str) -> Sample:
        started = time.monotonic()
        samples = await asyncio.to_thread(espeak, voice, sentence, tmp_path / "samples")
        spoken.append((voice, sentence))
        return Sample(voice, sentence, samples, time.monotonic() - started)

    result = asyncio.run(
        evaluate(speak, SPEAKER, references, embedder, sentences, baseline_voices=OTHERS)
    )
    assert result.embedder == embedder.name and result.references == 4
    assert len(result.similarity.values) == 2 and result.baseline_voice in OTHERS
    assert result.gain is not None and result.gain > 0.05, result.to_json()
    assert result.similarity.p10 <= result.similarity.mean
    assert result.ceiling is not None and len(result.ceiling.values) == 4
    # the closest other voice is heard on every sentence, the rest on the first only
    assert spoken.count((result.baseline_voice, sentences[1])) == 1
    assert len(spoken) == 2 + len(OTHERS) + 1
    assert result.leading_silence_ms["p50"] == pytest.approx(LEAD_S * 1000, abs=40)
    assert 0 < result.real_time_factor["mean"] <= result.real_time_factor["max"]
    assert result.intelligibility == {"measured": False, "reason": "no ASR backend is configured"}
    summary = result.summary()
    assert f"{result.similarity.mean:.3f}" in summary and result.baseline_voice in summary
    assert "intelligibility not measured" in summary
    json.dumps(result.to_json())  # JSON-ready as it is
    plot(result, tmp_path / "eval.png")
    assert (tmp_path / "eval.png").stat().st_size > 5000


def test_voicehost_eval_measures_a_builtin_voice_over_the_api(server, tmp_path, capsys):
    references = tmp_path / "refs"
    for text in REFERENCE_TEXTS[:3]:
        espeak(SPEAKER, text, references)
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("Hi there.\nSeven.\n")  # short: the dev model's audio is capped by it
    out, figure = tmp_path / "eval.json", tmp_path / "eval.png"
    command = ["eval", "--voice", "tara", "--url", server.url, "--reference", str(references)]
    command += ["--sentences", str(sentences), "--baseline", "leah"]
    assert main([*command, "--json", str(out), "--plot", str(figure)]) == 0  # in this process
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["voice"] == "tara" and written["baseline_voice"] == "leah"
    assert written["references"] == 3 and len(written["similarity"]["values"]) == 2
    assert written["intelligibility"]["measured"] is False
    assert figure.stat().st_size > 5000
    assert "similarity" in printed and written["encoder"] in printed
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main([*command[:-4], "--sentences", str(empty)]) == 2
    assert "holds no sentence" in capsys.readouterr().err


def over_the_phone(samples: np.ndarray, folder: Path, name: str) -> np.ndarray:
    """``samples`` as a telephone line carries them (8 kHz mu-law, 300-3400 Hz, sox)."""
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    clean, phoned = folder / f"{name}.wav", folder / f"{name}-phone.wav"
    soundfile.write(clean, samples, SAMPLE_RATE)
    line = ["sox", str(clean), "-r", "8000", "-e", "u-law", str(phoned), "sinc", "300-3400"]
    subprocess.run(line, check=True)
    return decode(phoned)


def test_references_from_a_phone_judge_a_full_band_voice_in_the_phones_band(tmp_path):
    """Two of four references came over a telephone line: every reference and every sample is
    compared in the phone's band, so the speaker's own full-band voice scores as it would
    against references all in one channel, the report says the band and how many references
    came in each, and what the channels took from the references' likeness to each other."""
    embedder = load_embedder()
    clean = [espeak(SPEAKER, text, tmp_path / "refs") for text in REFERENCE_TEXTS]
    references = clean[:2] + [
        over_the_phone(r, tmp_path / "phone", str(i)) for i, r in enumerate(clean[2:])
    ]
    sentences = ["Can you tell me the way to the post office?", "Seven people waited outside."]

    async def speak(voice: str, sentence: str) -> Sample:
        samples = await asyncio.to_thread(espeak, voice, sentence, tmp_path / "samples")
        return Sample(voice, sentence, samples, 0.1)

    result = asyncio.run(evaluate(speak, SPEAKER, references, embedder, sentences))
    channel = result.channel
    assert channel is not None and channel["band"] == "300-3400 Hz"
    assert channel["reference_bands"] == {"0-8000 Hz": 2, "300-3400 Hz": 2}
    assert result.ceiling is not None and channel["ceiling_as_uploaded"] is not None
    assert result.ceiling.mean - channel["ceiling_as_uploaded"] > 0.05, result.to_json()
    assert result.similarity.mean > 0.9, result.to_json()  # as uploaded, the clone measured less
    assert "compared in 300-3400 Hz" in result.summary()
    same = asyncio.run(evaluate(speak, SPEAKER, clean, embedder, sentences))
    assert same.channel == {
        "band": "0-8000 Hz",
        "reference_bands": {"0-8000 Hz": 4},
        "ceiling_as_uploaded": same.ceiling.mean,
    }
