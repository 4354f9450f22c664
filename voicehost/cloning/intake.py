"""Intake: an upload's saved files -> a queued clone job.

The checks a user needs at once run here, cheaply: each file is probed (``ingest.probe``:
its packets are read, not decoded) for what we take and for the upload's minutes, and the
recipe's ``precheck`` judges transcripts and the least speech from the lengths alone. Decoding,
splitting, trimming and measuring the speech run where the job trains
(``lora_training.recipe.prepare``, in the training worker), once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lora_training.ingest import UnreadableAudio, probe
from lora_training.recipe import precheck
from voicehost.cloning.jobs import CloneJob, CloneJobs
from voicehost.cloning.spec import training_spec
from voicehost.config import Settings

TRANSCRIPTS = "metadata.csv"  # an upload's transcripts, in its inputs folder


class RefusedFile(ValueError):
    """One uploaded file is not audio we take (``reason``: ``UnreadableAudio`` or its
    ``UnsupportedAudio`` / ``AudioTooLong``)."""

    def __init__(self, file: Path, reason: UnreadableAudio) -> None:
        super().__init__(f"{file.name}: {reason}")
        self.file = file
        self.reason = reason


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
