"""The verdict on a clone's candidate: held only when its evaluation falls short and the gate is
not in report mode (the dev model's default), the reasons kept either way, and the verdict
written into its voice.json so the directory lists it held. Speaking the candidate through the
engine (``evaluate_candidate``) needs a serving process: the clone-job test exercises it."""

from __future__ import annotations

import json
import shutil
import wave

import numpy as np
import pytest

from voicehost.cloning.candidate import decide, record_verdict, report_only, save_samples
from voicehost.cloning.evaluation import EvalReport, Spread
from voicehost.config import Settings
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.voices.validation import MANIFEST, AdapterRules, validate_adapter

pytestmark = pytest.mark.unit


def report(similarity: float, baseline: float | None = 0.5, wer: float | None = None):
    measured = {"measured": False, "reason": "no ASR backend is configured"}
    if wer is not None:
        measured = {"measured": True, "asr": "Test", "wer": wer, "cer": wer / 2, "heard": []}
    return EvalReport(
        embedder="resemblyzer",
        voice="candidate",
        sentences=["One.", "Two."],
        references=3,
        similarity=Spread.of([similarity, similarity]),
        baseline_voice=None if baseline is None else "tara",
        baseline=None if baseline is None else Spread.of([baseline, baseline]),
        gain=None if baseline is None else similarity - baseline,
        ceiling=Spread.of([0.9, 0.92, 0.88]),
        leading_silence_ms={"p50": 120.0, "p95": 300.0},
        real_time_factor={"mean": 0.5, "max": 0.7},
        intelligibility=measured,
        seconds=4.2,
    )


GATED = {"dev": False, "model": "somewhere/orpheus", "eval_report_only": False}


def test_report_mode_follows_the_dev_model_unless_it_is_set():
    assert report_only(Settings(dev=True))
    assert not report_only(Settings(dev=False, model="m"))
    assert report_only(Settings(dev=False, model="m", eval_report_only=True))
    assert not report_only(Settings(dev=True, eval_report_only=False))


def test_a_candidate_below_any_threshold_is_held_with_each_reason():
    settings = Settings(**GATED, eval_min_similarity=0.75, eval_min_gain=0.02, eval_max_wer=0.3)
    assert decide(report(0.85, baseline=0.6), settings) == ("ready", [])
    status, reasons = decide(report(0.6, baseline=0.3), settings)
    assert status == "held" and len(reasons) == 1 and "similarity 0.600" in reasons[0]
    status, reasons = decide(report(0.8, baseline=0.79), settings)
    assert status == "held" and len(reasons) == 1 and "'tara'" in reasons[0]
    status, reasons = decide(report(0.8, baseline=0.5, wer=0.5), settings)
    assert status == "held" and len(reasons) == 1 and "word error rate 0.50" in reasons[0]
    assert decide(report(0.8, baseline=None, wer=0.1), settings) == ("ready", [])
    status, reasons = decide(report(0.1, baseline=0.5, wer=0.9), settings)
    assert status == "held" and len(reasons) == 3


def test_report_mode_never_holds_but_says_what_would_have():
    for settings in (Settings(dev=True), Settings(**{**GATED, "eval_report_only": True})):
        status, reasons = decide(report(0.1), settings)
        assert status == "ready" and reasons, settings


def test_the_verdict_is_written_into_voice_json_and_the_folder_validates_as_held(
    dev_model, tmp_path
):
    folder = tmp_path / "candidate"
    shutil.copytree(dev_model.adapters / "dev-a", folder)
    save_samples(folder / "samples", [np.zeros(SAMPLE_RATE, np.float32), np.ones(480) * 0.5])
    assert record_verdict(folder, report(0.2), Settings(**GATED))[0] == "held"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "held" and "similarity 0.200" in manifest["held_reason"]
    assert manifest["eval"]["similarity"]["mean"] == pytest.approx(0.2)
    assert manifest["eval"]["report_only"] is False and manifest["eval"]["findings"]
    assert manifest["eval"]["samples"] == ["samples/eval-1.wav", "samples/eval-2.wav"]
    assert manifest["name"] == "Dev voice A"  # the rest of the manifest is kept
    with wave.open(str(folder / "samples" / "eval-2.wav")) as sample:
        assert (sample.getframerate(), sample.getnframes()) == (SAMPLE_RATE, 480)
    assert validate_adapter(folder, AdapterRules("voicehost-dev", 16)).status == "held"

    assert record_verdict(folder, report(0.2), Settings(dev=True))[0] == "ready"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "ready" and "held_reason" not in manifest
    assert manifest["eval"]["report_only"] is True and manifest["eval"]["findings"]
