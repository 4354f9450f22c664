"""Intake: an upload's saved files -> a queued clone job.

The checks a user needs at once run here, cheaply: each file is probed (``ingest.probe``:
its packets are read, not decoded) for what we take and for the upload's minutes, and the
recipe's ``precheck`` judges transcripts and the least speech from the lengths alone; uploaded
transcripts are read and stored under the names the clips were saved as; a consent recording is
heard against the training audio (``consent.check_recording``). Decoding, splitting, trimming
and measuring the speech run where the job trains (``lora_training.recipe.prepare``, in the
training worker), once.

Each check raises the service's own error (``voicehost.errors.ServiceError``): the API layer
answers it from its error table and imports nothing of the training pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lora_training.ingest import UnreadableAudio, probe
from lora_training.recipe import precheck
from lora_training.transcripts import read_metadata
from voicehost.audio.speaker import shared_embedder
from voicehost.cloning import consent
from voicehost.cloning.jobs import CloneJob, CloneJobs
from voicehost.cloning.spec import training_spec
from voicehost.config import Settings
from voicehost.errors import ServiceError

TRANSCRIPTS = "metadata.csv"  # an upload's transcripts, in its inputs folder


class RefusedFile(ServiceError, ValueError):
    """One uploaded file (``what`` names it: its name, or "the consent recording") is not
    audio we take; its code is its ``reason``'s: ``not_audio`` (``UnreadableAudio``),
    ``unsupported_audio`` or ``audio_too_long``."""

    def __init__(self, file: Path, reason: UnreadableAudio, what: str | None = None) -> None:
        what = what or file.name
        if type(reason) is UnreadableAudio:
            message = f"{what} is not audio we can read: {reason}"
        else:
            message = f"{what}: {reason}"
        super().__init__(message, code=reason.code)
        self.file = file
        self.reason = reason


class InvalidTranscripts(ServiceError, ValueError):
    """Uploaded transcripts that are not UTF-8 lines of ``file|text``."""

    code = "invalid_transcripts"


@dataclass(frozen=True)
class CloneRequest:
    """What an upload asks of the cloning service: train ``voice_id`` from the audio in its
    job's inputs folder, as a new voice or (``new_version``) the voice's next version."""

    voice_id: str
    name: str
    tenant: str | None
    new_version: bool = False
    promote: bool = True


def check_audio(files: list[Path], inputs: Path, settings: Settings) -> float:
    """The upload's audio, judged before anything is decoded; its seconds. Raises
    ``RefusedFile`` for a file that is not audio we take or passes the upload's minutes, and
    the recipe's ``MissingTranscripts`` / ``NotEnoughSpeech``."""
    budget = settings.max_upload_minutes * 60
    clips: dict[Path, float] = {}
    for path in files:
        try:
            clips[path] = probe(path, budget)
        except UnreadableAudio as exc:
            raise RefusedFile(path, exc) from exc
        budget -= clips[path]
    transcripts = inputs / TRANSCRIPTS
    precheck(clips, transcripts if transcripts.is_file() else None, settings.min_speech_seconds)
    return sum(clips.values())


def store_transcripts(upload: Path, target: Path, renamed: dict[str, str]) -> None:
    """Save an uploaded ``metadata.csv`` keyed by the names the audio files were saved under
    (``renamed``: uploaded stem -> saved stem)."""
    try:
        texts = read_metadata(upload)
    except (UnicodeDecodeError, ValueError) as exc:
        message = f"transcripts must be UTF-8 lines of file|text: {exc}"
        raise InvalidTranscripts(message) from exc
    upload.unlink()
    lines = [f"{renamed.get(stem, stem)}|{text}" for stem, text in texts.items()]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_consent_recording(settings: Settings, recording: Path, clips: list[Path]) -> float:
    """The consent recording's similarity to the training audio's speaker (blocking: it
    decodes and embeds). Raises ``ConsentMismatch`` below ``consent_min_similarity``, and
    ``RefusedFile`` for a recording that is not audio we take."""
    embedder = shared_embedder(settings.speaker_encoder)
    try:
        return consent.check_recording(embedder, recording, clips, settings.consent_min_similarity)
    except UnreadableAudio as exc:
        raise RefusedFile(recording, exc, "the consent recording") from exc


async def queue_clone(
    jobs: CloneJobs, settings: Settings, job_id: str, request: CloneRequest
) -> CloneJob:
    """Queue ``job_id``, whose inputs are in place, to train ``request``'s voice."""
    inputs = jobs.job_dir(job_id) / "inputs"
    spec = training_spec(
        settings,
        [inputs],
        request.voice_id,
        jobs.output_dir(job_id),
        inputs.parent / "work",
        name=request.name,
        replace_existing=False,
    )
    return await jobs.submit(
        job_id, spec, request.tenant, new_version=request.new_version, promote=request.promote
    )
