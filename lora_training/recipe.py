"""The training recipe: audio files in, a servable voice folder out.

Composes the components top to bottom: ingest -> transcripts -> split -> trim -> quality
(the data report; clips of other speakers left out; references held out) -> tokenise -> train ->
export. ``voicehost train`` and the REST clone jobs both run this.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from lora_training import split as splitting
from lora_training.export import Reference, VoiceData, export_voice, manifest
from lora_training.ingest import Rejected, ingest
from lora_training.quality import (
    MIN_PITCH_SHIFT,
    MIN_SIMILARITY,
    DataReport,
    SourceClip,
    assess,
    embedder_with_cache,
)
from lora_training.tokenise import Utterance, build_dataset
from lora_training.train import TrainSettings, train
from lora_training.transcripts import SpeechRecognizer, find_transcripts, require_transcripts
from lora_training.trim import TrimmedClip, TrimSettings, percentiles_ms, trim
from voicehost.errors import ServiceError
from voicehost.model import orpheus
from voicehost.model.orpheus import PAD, SAMPLE_RATE

log = logging.getLogger(__name__)

MIN_SPEECH_SECONDS = 30.0
MIN_REFERENCES = 3  # clips held out of training as the speaker's references...
REFERENCE_SHARE = 0.1  # ... or this share of the clips, if more


class NotEnoughSpeech(ServiceError, ValueError):
    """Less usable speech than a voice needs (``report``: the data report, when measured)."""

    code = "not_enough_speech"

    def __init__(self, message: str, report: DataReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class VoiceJob:
    """Everything one training run needs."""

    audio: list[Path]
    voice_id: str
    base_model: str
    base_model_name: str
    codec: str
    adapters_dir: Path
    work_dir: Path
    name: str | None = None
    transcripts: Path | None = None
    prompt_style: str = "plain"
    language: str = "en"  # the voice's (BCP-47): one the base model speaks, in its manifest
    train: TrainSettings = field(default_factory=TrainSettings)
    trim: TrimSettings = field(default_factory=TrimSettings)
    trim_leading_silence: bool = True  # off only to measure what trimming buys
    drop_repeated_frames: bool = False
    min_speech_seconds: float = MIN_SPEECH_SECONDS
    max_file_seconds: float | None = 3600.0
    replace_existing: bool = True  # a REST job never replaces a voice that appeared meanwhile
    speaker_embedder: str | None = None  # voicehost.audio.speaker.load_embedder's spec
    speaker_min_similarity: float = MIN_SIMILARITY  # clips of a voice less alike are left out
    speaker_min_pitch_shift: float = MIN_PITCH_SHIFT  # semitones; 0: no pitch cue


def job_to_json(job: VoiceJob) -> dict[str, object]:
    """A JSON-ready form of a job (paths as strings), for a job that runs in another process."""
    data = asdict(job)
    data["audio"] = [str(p) for p in job.audio]
    for key in ("adapters_dir", "work_dir", "transcripts"):
        data[key] = None if data[key] is None else str(data[key])
    return data


def job_from_json(data: dict) -> VoiceJob:
    paths = {"adapters_dir", "work_dir", "transcripts"}
    fields = {k: (Path(v) if k in paths and v is not None else v) for k, v in data.items()}
    fields["audio"] = [Path(p) for p in data["audio"]]
    fields["train"] = TrainSettings(**data["train"])
    fields["trim"] = TrimSettings(**data["trim"])
    if "speaker_encoder" in fields:  # a spec written before the embedder's rename
        fields["speaker_embedder"] = fields.pop("speaker_encoder")
    return VoiceJob(**fields)


@dataclass
class PreparedData:
    utterances: list[Utterance]  # what training gets
    rejected: list[Rejected]
    leading_before_ms: list[float]
    leading_after_ms: list[float]
    references: list[Reference] = field(default_factory=list)  # held out of training
    report: DataReport | None = None  # None when prepared without measuring

    @property
    def seconds(self) -> float:
        return sum(u.samples.size for u in self.utterances) / SAMPLE_RATE


def held_out(count: int) -> list[int]:
    """Which of ``count`` clips are kept out of training as references: ``MIN_REFERENCES`` or a
    ``REFERENCE_SHARE``, whichever is more (never half or more), spread evenly over them."""
    wanted = min(max(MIN_REFERENCES, round(REFERENCE_SHARE * count)), (count - 1) // 2)
    return [int((i + 0.5) * count / wanted) for i in range(wanted)] if wanted > 0 else []


def precheck(
    clips: dict[Path, float],
    transcripts: Path | None,
    min_speech_seconds: float,
    recognizer: bool = False,
) -> None:
    """What ``prepare`` would refuse, judged from each clip's length alone (``clips``: file ->
    seconds, from ``ingest.probe``) before anything is decoded: ``MissingTranscripts`` for
    short clips without text (and no ``recognizer``), ``NotEnoughSpeech`` when the clips it
    could use hold less audio than a voice needs. Passing is no promise: ``prepare`` measures
    the speech in them."""
    short = [path for path, seconds in clips.items() if seconds <= splitting.MAX_CLIP_SECONDS]
    if not recognizer:
        require_transcripts(short, find_transcripts(short, transcripts), None)
    usable = {p: s for p, s in clips.items() if recognizer or s <= splitting.MAX_CLIP_SECONDS}
    found = sum(usable.values())
    if found < min_speech_seconds:
        long = len(clips) - len(usable)
        raise NotEnoughSpeech(
            f"found {found:.1f} s of audio in {len(usable)} clips; a voice needs at least "
            f"{min_speech_seconds:.0f} s of speech"
            + (
                f" ({long} recordings over {splitting.MAX_CLIP_SECONDS:.0f} s need an ASR "
                "model to be split)"
                if long
                else ""
            )
        )


def prepare(
    job: VoiceJob, recognizer: SpeechRecognizer | None = None, measure: bool = True
) -> PreparedData:
    """Decode, transcribe, split and trim; measure the data (``measure``: the data report,
    which leaves clips of other speakers out); hold references out; raises when training
    would get too little usable speech."""
    recordings, rejected = ingest(job.audio, job.max_file_seconds)
    texts = find_transcripts([r.source for r in recordings], job.transcripts)
    short = [r for r in recordings if r.seconds <= splitting.MAX_CLIP_SECONDS]
    require_transcripts([r.source for r in short], texts, recognizer)
    texted: list[tuple[str, SourceClip, TrimmedClip | None]] = []
    for recording in recordings:
        name = recording.source.name
        if recording.seconds <= splitting.MAX_CLIP_SECONDS:
            text = texts.get(recording.source) or recognizer.transcribe(recording.samples)
            pieces = [(text, name, recording.samples)]
        else:
            try:
                split = splitting.split_recording(recording.samples, recognizer)
            except splitting.NeedsRecognizer as exc:
                rejected.append(Rejected(recording.source, str(exc)))
                continue
            pieces = [(text, f"{name}#{k + 1}", piece) for k, (text, piece) in enumerate(split)]
        for text, piece_name, samples in pieces:
            trimmed = trim(samples, job.trim)
            speech = None if trimmed is None else trimmed.samples
            clip = SourceClip(piece_name, samples, recording.gain, speech, text)
            texted.append((text, clip, trimmed))
    report = None
    if measure:
        embedder = embedder_with_cache(job.speaker_embedder, job.work_dir / "embeddings")
        clips = [clip for _, clip, _ in texted]
        report = assess(clips, embedder, job.speaker_min_similarity, job.speaker_min_pitch_shift)
        report.rejected = [{"file": r.source.name, "reason": r.reason} for r in rejected]
    usable = [
        i
        for i, (_, _, trimmed) in enumerate(texted)
        if trimmed is not None and (report is None or not report.clips[i].excluded)
    ]
    references = {usable[k] for k in held_out(len(usable))}
    prepared = PreparedData([], rejected, [], [], report=report)
    for i in usable:
        text, clip, trimmed = texted[i]
        assert trimmed is not None
        if i in references:
            prepared.references.append(Reference(clip.name, text, trimmed.samples))
            continue
        kept = trimmed.samples if job.trim_leading_silence else clip.samples
        prepared.utterances.append(Utterance(text, kept))
        prepared.leading_before_ms.append(trimmed.leading_before_ms)
        prepared.leading_after_ms.append(
            trimmed.leading_after_ms if job.trim_leading_silence else trimmed.leading_before_ms
        )
    if prepared.seconds < job.min_speech_seconds:
        skipped = "; ".join(f"{r.source.name}: {r.reason}" for r in rejected[:5])
        left_out = len(report.excluded) if report else 0
        raise NotEnoughSpeech(
            f"found {prepared.seconds:.1f} s of usable speech in {len(prepared.utterances)} clips; "
            f"a voice needs at least {job.min_speech_seconds:.0f} s"
            + (f" ({len(references)} clips held out as references" if references else "")
            + (f", {left_out} left out as another speaker" if left_out else "")
            + (")" if references else "")
            + (f" (skipped {skipped})" if skipped else ""),
            report,
        )
    return prepared


class Report(Protocol):
    """Hears each stage of ``train_voice``: (stage, fraction done, eval losses) and, once
    prepare ends, the data report (``data``, as JSON)."""

    def __call__(
        self,
        stage: str,
        fraction: float,
        eval_loss: list[float],
        data: dict[str, object] | None = None,
    ) -> None: ...


def _ignore(
    stage: str, fraction: float, eval_loss: list[float], data: dict[str, object] | None = None
) -> None:
    return None


def train_voice(
    job: VoiceJob,
    recognizer: SpeechRecognizer | None = None,
    progress: bool = True,
    report: Report | None = None,
) -> Path:
    """Run the whole recipe; returns the exported voice folder.

    ``report`` hears each stage (preparing, training, exporting), the data report as soon as
    prepare ends (before training starts; also when it finds too little speech) and the
    training progress.
    """
    report = report or _ignore
    report("preparing", 0.0, [])
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from voicehost.model.codec import SnacCodec

    try:
        prepared = prepare(job, recognizer)
    except NotEnoughSpeech as exc:
        if exc.report is not None:
            report("preparing", 1.0, [], exc.report.to_json())
        raise
    assert prepared.report is not None
    report("preparing", 1.0, [], prepared.report.to_json())
    for warning in prepared.report.warnings:
        log.warning("%s", warning)
    log.info(
        "%d clips, %.1f s of speech; %d held out as references",
        len(prepared.utterances),
        prepared.seconds,
        len(prepared.references),
    )
    tokenizer = AutoTokenizer.from_pretrained(job.base_model)
    codec = SnacCodec.load(job.codec, device="cpu")
    voice_name = job.voice_id if job.prompt_style == "named" else None
    with tqdm(total=len(prepared.utterances), desc="tokenise", disable=not progress) as bar:
        dataset, dataset_path = build_dataset(
            prepared.utterances,
            codec,
            orpheus.plain_text(tokenizer),
            job.work_dir,
            voice_name=voice_name,
            drop_repeats=job.drop_repeated_frames,
            codec_name=f"{job.codec}|{job.base_model}",
            progress=lambda done, total: bar.update(1),
        )
    codec.close()
    # a checkpoint resumes only the same data, base model and training settings
    run_key = hashlib.sha256(json.dumps([job.base_model, asdict(job.train)]).encode()).hexdigest()
    run_dir = job.work_dir / f"run-{dataset_path.name}-{run_key[:12]}"
    report("training", 0.0, [])
    model, history = train(
        job.base_model,
        list(dataset),
        job.train,
        run_dir,
        PAD,
        progress,
        on_step=lambda h, total: report("training", h.steps / total, h.eval_loss),
    )
    report("exporting", 1.0, history.eval_loss)
    data = VoiceData(
        minutes=prepared.seconds / 60,
        clips=len(prepared.utterances),
        leading_before_ms=percentiles_ms(prepared.leading_before_ms),
        leading_after_ms=percentiles_ms(prepared.leading_after_ms),
        rejected=[{"file": r.source.name, "reason": r.reason} for r in prepared.rejected],
        quality=prepared.report.to_json(),
        references=prepared.references,
    )
    voice_manifest = manifest(
        job.voice_id,
        job.name or job.voice_id,
        job.base_model_name,
        job.prompt_style,
        job.language,
        data,
        history,
        {**asdict(job.train), "drop_repeated_frames": job.drop_repeated_frames},
    )
    out = job.adapters_dir / job.voice_id
    if out.exists() and not job.replace_existing:
        raise FileExistsError(f"voice {job.voice_id!r} was created while this job ran")
    return export_voice(model, out, voice_manifest, history, prepared.references)
