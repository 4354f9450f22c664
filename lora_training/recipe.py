"""The training recipe: audio files in, a servable voice folder out.

Composes the components top to bottom: ingest -> transcripts -> segment -> trim -> tokenise ->
train -> export. ``voicehost train`` and the REST clone jobs both run this.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lora_training import segment as segmenting
from lora_training.export import VoiceData, export_voice, manifest
from lora_training.ingest import Rejected, ingest
from lora_training.tokenise import Utterance, build_dataset
from lora_training.train import TrainSettings, train
from lora_training.transcripts import SpeechRecognizer, find_transcripts, require_transcripts
from lora_training.trim import TrimSettings, percentiles_ms, trim
from voicehost import orpheus
from voicehost.orpheus import PAD, SAMPLE_RATE

log = logging.getLogger(__name__)

MIN_SPEECH_SECONDS = 30.0


class NotEnoughSpeech(ValueError):
    """Less usable speech than a voice needs."""


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
    train: TrainSettings = field(default_factory=TrainSettings)
    trim: TrimSettings = field(default_factory=TrimSettings)
    trim_leading_silence: bool = True  # off only to measure what trimming buys
    drop_repeated_frames: bool = False
    min_speech_seconds: float = MIN_SPEECH_SECONDS
    max_file_seconds: float | None = 3600.0
    replace_existing: bool = True  # a REST job never replaces a voice that appeared meanwhile


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
    return VoiceJob(**fields)


@dataclass
class PreparedData:
    utterances: list[Utterance]
    rejected: list[Rejected]
    leading_before_ms: list[float]
    leading_after_ms: list[float]

    @property
    def seconds(self) -> float:
        return sum(u.samples.size for u in self.utterances) / SAMPLE_RATE


def prepare(job: VoiceJob, recognizer: SpeechRecognizer | None = None) -> PreparedData:
    """Decode, transcribe, segment and trim; raises when there is not enough usable speech."""
    recordings, rejected = ingest(job.audio, job.max_file_seconds)
    texts = find_transcripts([r.source for r in recordings], job.transcripts)
    short = [r for r in recordings if r.seconds <= segmenting.MAX_CLIP_SECONDS]
    require_transcripts([r.source for r in short], texts, recognizer)
    clips: list[tuple[str, object]] = []
    for recording in recordings:
        if recording.seconds <= segmenting.MAX_CLIP_SECONDS:
            text = texts.get(recording.source) or recognizer.transcribe(recording.samples)
            clips.append((text, recording.samples))
            continue
        try:
            clips += segmenting.split_recording(recording.samples, recognizer)
        except segmenting.NeedsRecognizer as exc:
            rejected.append(Rejected(recording.source, str(exc)))
    prepared = PreparedData([], rejected, [], [])
    for text, samples in clips:
        trimmed = trim(samples, job.trim)
        if trimmed is None:
            continue
        kept = trimmed if job.trim_leading_silence else None
        prepared.utterances.append(Utterance(text, kept.samples if kept else samples))
        prepared.leading_before_ms.append(trimmed.leading_before_ms)
        prepared.leading_after_ms.append(
            kept.leading_after_ms if kept else trimmed.leading_before_ms
        )
    if prepared.seconds < job.min_speech_seconds:
        skipped = "; ".join(f"{r.source.name}: {r.reason}" for r in rejected[:5])
        raise NotEnoughSpeech(
            f"found {prepared.seconds:.1f} s of usable speech in {len(prepared.utterances)} clips; "
            f"a voice needs at least {job.min_speech_seconds:.0f} s"
            + (f" (skipped {skipped})" if skipped else "")
        )
    return prepared


Report = Callable[[str, float, list[float]], None]  # (stage, fraction done, eval losses)


def train_voice(
    job: VoiceJob,
    recognizer: SpeechRecognizer | None = None,
    progress: bool = True,
    report: Report | None = None,
) -> Path:
    """Run the whole recipe; returns the exported voice folder.

    ``report`` hears each stage (preparing, training, exporting) and the training progress.
    """
    report = report or (lambda stage, fraction, losses: None)
    report("preparing", 0.0, [])
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from voicehost.codec import SnacCodec

    prepared = prepare(job, recognizer)
    log.info("%d clips, %.1f s of speech", len(prepared.utterances), prepared.seconds)
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
    )
    voice_manifest = manifest(
        job.voice_id,
        job.name or job.voice_id,
        job.base_model_name,
        job.prompt_style,
        data,
        history,
        {**asdict(job.train), "drop_repeated_frames": job.drop_repeated_frames},
    )
    out = job.adapters_dir / job.voice_id
    if out.exists() and not job.replace_existing:
        raise FileExistsError(f"voice {job.voice_id!r} was created while this job ran")
    return export_voice(model, out, voice_manifest, history)
