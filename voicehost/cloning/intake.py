"""Intake: an upload's saved files -> a queued clone job.

The upload handler receives and stores an upload (its clips in the job's inputs folder, a
consent recording beside them as ``UPLOADED_RECORDING``) and asks ``Intake.check`` once, before
it queues the job; the checks a user needs at once run here: a consent recording is heard
against the training audio (``consent.check_recording``: it decodes and embeds up to 8 clips, so
that a mismatch is refused at once, 422), each file is probed (``ingest.probe``: its packets are
read, not decoded) for what we take and for the upload's minutes, and the recipe's ``precheck``
judges transcripts and the least speech from the lengths alone. Decoding, splitting, trimming
and measuring the speech run where the job trains (``lora_training.recipe.prepare``, in the
training worker), once.

``LocalIntake`` runs the checks in this process, on threads of its own, off the event loop and
off the loop's default executor (``voicehost serve``, a cluster worker); a gateway decodes no
audio and asks a worker to run them (``voicehost.cluster.intake``), with the same answers.

Each check raises the service's own error (``voicehost.errors.ServiceError``): the API layer
answers it from its error table and imports nothing of the training pipeline.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lora_training.ingest import UnreadableAudio, probe
from lora_training.recipe import precheck
from lora_training.transcripts import read_metadata
from voicehost.audio.speaker import shared_embedder
from voicehost.cloning import consent
from voicehost.cloning.jobs import CloneJob, CloneJobs
from voicehost.cloning.spec import training_spec
from voicehost.config import Settings
from voicehost.errors import ServiceError
from voicehost.ids import child
from voicehost.metrics import SpeechMetrics

TRANSCRIPTS = "metadata.csv"  # an upload's transcripts, in its inputs folder
UPLOADED_RECORDING = "consent_upload"  # in a job's folder: the consent recording, until checked
# Checks at once in one process: each holds a thread for seconds (decoding, the embedder), on a
# pool of its own so that a burst of uploads never takes the threads the loop's other file work
# (and a clone job's lease renewals) run on.
INTAKE_THREADS = 2


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
    language: str = "en"  # one the base model speaks (the upload's ``language``, else its first)
    base_model: str = ""  # the name of the model that speaks it ("": the served one)


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
    embedder = shared_embedder(settings.speaker_embedder)
    try:
        return consent.check_recording(embedder, recording, clips, settings.consent_min_similarity)
    except UnreadableAudio as exc:
        raise RefusedFile(recording, exc, "the consent recording") from exc


@dataclass(frozen=True)
class StoredUpload:
    """What intake checks: job ``job_id``'s stored upload, its ``clips`` (the names its audio
    files were saved under, in the job's inputs folder) and, if ``consent_recording``, the
    speaker's recording of the consent statement (``UPLOADED_RECORDING`` in the job's folder).
    Names, not paths: a worker finds the same job in the shared store."""

    job_id: str
    clips: tuple[str, ...]
    consent_recording: bool = False


class Intake(Protocol):
    """The cloning service's checks of a stored upload, asked once before its job is queued:
    ``LocalIntake`` here, a gateway's ``voicehost.cluster.intake.WorkerIntake`` on a worker."""

    async def check(self, upload: StoredUpload) -> float | None:
        """The consent recording's similarity to the training audio's speaker (None without
        a recording), once every check has passed; else the first check's ``ServiceError``
        (``ConsentMismatch``, ``RefusedFile``, the recipe's ``MissingTranscripts`` and
        ``NotEnoughSpeech``)."""
        ...


class LocalIntake:
    """Intake in this process: the consent recording heard against the training audio (the
    speaker before the data), then the files probed and prechecked, on ``INTAKE_THREADS``
    threads of its own (the speaker embedder is loaded once per process, and torch and the
    decoders release the GIL for most of the work). Each check is counted in
    ``voicehost_intake_checks_total{outcome}``: ``passed``, or the code it was refused with."""

    def __init__(self, settings: Settings, jobs: CloneJobs, metrics: SpeechMetrics) -> None:
        self.settings = settings
        self.jobs = jobs
        self.metrics = metrics
        self._threads = ThreadPoolExecutor(INTAKE_THREADS, thread_name_prefix="voicehost-intake")

    async def check(self, upload: StoredUpload) -> float | None:
        loop = asyncio.get_running_loop()
        try:
            measured = await loop.run_in_executor(self._threads, self._check, upload)
        except ServiceError as exc:
            self.metrics.intake_checks.labels(exc.code).inc()
            raise
        except Exception:
            self.metrics.intake_checks.labels("internal").inc()
            raise
        self.metrics.intake_checks.labels("passed").inc()
        return measured

    def _check(self, upload: StoredUpload) -> float | None:
        folder = self.jobs.job_dir(upload.job_id)
        inputs = folder / "inputs"
        clips = [child(inputs, name) for name in upload.clips]
        measured = None
        if upload.consent_recording:
            recording = folder / UPLOADED_RECORDING
            measured = check_consent_recording(self.settings, recording, clips)
        check_audio(clips, inputs, self.settings)
        return measured

    def close(self) -> None:
        """Stop taking checks; one under way ends on its thread."""
        self._threads.shutdown(wait=False, cancel_futures=True)


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
        language=request.language,
        replace_existing=False,
        **({"base_model_name": request.base_model} if request.base_model else {}),
    )
    return await jobs.submit(
        job_id, spec, request.tenant, new_version=request.new_version, promote=request.promote
    )
