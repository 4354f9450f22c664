"""A clone's candidate adapter, measured before any caller can name it: the evaluation
sentences spoken through this process's own engine with the adapter loaded from its folder,
measured against the speaker's held-out references (``voicehost.cloning.evaluation.evaluate``), and
the gate's verdict.

The candidate is never in the voice directory while it is measured: its folder is validated as
any adapter is (``validate_adapter``) and the resulting ``Voice`` goes straight to the
synthesizer. The baseline is the closest of the first few built-in voices. ``record_verdict``
writes the verdict into the folder's ``voice.json`` (``status``, ``held_reason``, ``eval``), so
registering the folder afterwards lists the voice ready or held wherever it is registered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lora_training.transcripts import SpeechRecognizer
from voicehost.audio.formats import write_wav
from voicehost.audio.speaker import SpeakerEmbedder
from voicehost.cloning.evaluation import (
    EVAL_SENTENCES,
    EvalReport,
    Sample,
    Thresholds,
    evaluate,
    gate,
)
from voicehost.config import Settings
from voicehost.model.served import adapter_rules, served_languages
from voicehost.speech.synthesis import SpeakOptions, Synthesizer
from voicehost.text.segment import Segment
from voicehost.text.stage import TextStage
from voicehost.voices.validation import (
    MANIFEST,
    STATUS,
    AdapterRules,
    read_json_object,
    validate_adapter,
    write_manifest,
)
from voicehost.voices.versioning import builtin_voices
from voicehost.voices.voice import Voice, VoiceDirectory, VoiceStatus

BASELINES = 3  # built-in voices tried as the baseline: each costs one sentence to rank
HELD_REASON = "held_reason"
EVAL = "eval"


class SpeakingProcess(Protocol):
    """What the evaluation needs of a process that speaks: its voice directory and its
    synthesizer (the serving process is one, a layer above this module)."""

    voices: VoiceDirectory

    def require_synthesizer(self) -> Synthesizer: ...


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        min_similarity=settings.eval_min_similarity,
        min_gain=settings.eval_min_gain,
        max_wer=settings.eval_max_wer,
    )


def report_only(settings: Settings) -> bool:
    """Whether evaluations only report: as configured, else with the dev model (it speaks
    noise, so no clone of it could pass)."""
    return settings.dev if settings.eval_report_only is None else settings.eval_report_only


def decide(report: EvalReport, settings: Settings) -> tuple[VoiceStatus, list[str]]:
    """``("held", reasons)`` when ``report`` falls short of the settings' thresholds and the
    gate holds; otherwise ``("ready", reasons)``, where in report mode ``reasons`` still says
    what would have held it (empty when it passes)."""
    reasons = gate(report, thresholds(settings))
    if reasons and not report_only(settings):
        return "held", reasons
    return "ready", reasons


def record_verdict(
    folder: Path, report: EvalReport, settings: Settings
) -> tuple[VoiceStatus, list[str]]:
    """``decide``, and write the verdict into ``folder``'s ``voice.json`` (atomically):
    ``status``, ``held_reason`` (only when held) and ``eval`` (the report's figures, the
    findings, whether the gate held or only reported, and the samples kept beside it)."""
    status, reasons = decide(report, settings)
    path = folder / MANIFEST
    manifest = read_json_object(path) if path.exists() else {}
    manifest.pop(HELD_REASON, None)
    manifest[STATUS] = status
    if status == "held":
        manifest[HELD_REASON] = "; ".join(reasons)
    samples = sorted(p.relative_to(folder).as_posix() for p in folder.glob("samples/*.wav"))
    manifest[EVAL] = {
        **report.to_json(),
        "findings": reasons,
        "report_only": report_only(settings),
        "samples": samples,
    }
    write_manifest(folder, manifest)
    return status, reasons


async def evaluate_candidate(
    speaker: Synthesizer | SpeakingProcess,
    folder: Path,
    references: Sequence[np.ndarray],
    embedder: SpeakerEmbedder,
    settings: Settings,
    *,
    voice_id: str | None = None,
    baselines: int = BASELINES,
    sentences: Sequence[str] = EVAL_SENTENCES,
    recognizer: SpeechRecognizer | None = None,
    seed: int | None = 0,
    samples_dir: Path | None = None,
    keep_samples: int = 3,
) -> EvalReport:
    """Measure the adapter in ``folder`` against ``references`` (24 kHz float clips of the
    speaker) by speaking ``sentences`` with it in this process's engine.

    ``speaker``: a serving process (its synthesizer, its directory's rules and built-in voices)
    or a bare synthesizer (rules and built-in voices from ``settings``). ``voice_id``: the id the
    voice will be registered as (default: the manifest's ``voice_id``, else the folder's name),
    so the engine's adapter slot is the one the voice keeps. The baseline is the closest of the
    first ``baselines`` built-in voices. Each sentence is spoken with ``seed`` (``None``:
    unseeded), without trimming (the start of speech is measured). The first ``keep_samples``
    of the candidate's samples are written to ``samples_dir`` (``eval-<n>.wav``) if given.
    Raises ``InvalidAdapter`` for a folder the engine must not load, ``NotReady`` while the
    engine warms up."""
    if isinstance(speaker, Synthesizer):
        synthesizer = speaker
        rules = await asyncio.to_thread(adapter_rules, settings)
        builtin = builtin_voices(served_languages(settings).voices)
    else:
        synthesizer = speaker.require_synthesizer()
        rules, builtin = speaker.voices.models.own, dict(speaker.voices.builtin)
    candidate = await asyncio.to_thread(_candidate, folder, rules, voice_id)  # hashes the weights
    options = SpeakOptions(
        seed=seed,
        continuity_frames=settings.continuity_frames,
        prefetch=settings.segment_prefetch,
    )
    kept: list[Sample] = []

    async def speak(name: str, sentence: str) -> Sample:
        voice = candidate if name == candidate.voice_id else builtin[name]
        started = time.monotonic()
        stage = TextStage(max_chars=settings.segment_max_chars, language=voice.language)
        segments = stage.whole(sentence)
        chunks: list[np.ndarray] = []
        async with aclosing(synthesizer.speak_segments(_each(segments), voice, options)) as events:
            async for event in events:
                if isinstance(event, np.ndarray):
                    chunks.append(event)
        if not chunks:
            raise RuntimeError(f"the engine produced no audio for {sentence!r} in {name!r}")
        sample = Sample(name, sentence, np.concatenate(chunks), time.monotonic() - started)
        if voice is candidate and len(kept) < keep_samples:
            kept.append(sample)
        return sample

    report = await evaluate(
        speak,
        candidate.voice_id,
        references,
        embedder,
        sentences,
        [v for v in builtin if v != candidate.voice_id][:baselines],
        recognizer,
    )
    if samples_dir is not None:
        await asyncio.to_thread(save_samples, samples_dir, [s.samples for s in kept])
    return report


def save_samples(samples_dir: Path, samples: Sequence[np.ndarray]) -> None:
    """Write ``samples`` as ``samples_dir/eval-<n>.wav`` (n from 1), for listening."""
    samples_dir.mkdir(parents=True, exist_ok=True)
    for index, pcm in enumerate(samples, 1):
        write_wav(samples_dir / f"eval-{index}.wav", pcm)


def _candidate(folder: Path, rules: AdapterRules, voice_id: str | None) -> Voice:
    """The candidate as a voice the synthesizer takes, after the checks any adapter passes."""
    if voice_id is None:
        path = folder / MANIFEST
        manifest: dict[str, Any] = read_json_object(path) if path.exists() else {}
        named = manifest.get("voice_id")
        voice_id = named if isinstance(named, str) and named else folder.name
    return validate_adapter(folder, rules, voice_id)


async def _each(segments: Sequence[Segment]) -> AsyncIterator[Segment]:
    for segment in segments:
        yield segment
