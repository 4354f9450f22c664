"""Consent records: who agreed to have their voice cloned, to what statement, collected by
whom, when and for what; optionally the speaker's own recording of that statement, checked
against the training audio with the speaker embedder (``voicehost.audio.speaker``).

A record is stored with each version cloned from audio: under ``consent`` in its
``voice.json`` (with the recording's file name, SHA-256 and similarity to the training audio)
and the recording itself beside it, so deleting the voice deletes them. While the clone job
runs they wait in the job's folder (never among its training inputs).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictStr, ValidationError

from voicehost.audio.channel import ChannelView
from voicehost.audio.speaker import SpeakerEmbedder, centroid, similarity
from voicehost.errors import ServiceError, validation_message
from voicehost.voices.validation import MANIFEST, read_json_object, write_manifest

CONSENT = "consent"  # the manifest key of a version's consent record
RECORD_FILE = "consent.json"  # in a job's folder, until its voice is registered
RECORDING = "consent_recording"  # the recording's file name (no suffix: it is sniffed as audio)
MAX_RECORDING_SECONDS = 120.0
MAX_CLIPS = 8  # training clips the recording is compared with (their speaker's centroid)
MAX_CLIP_SECONDS = 30.0


class ConsentRecord(BaseModel):
    """The ``consent`` part of a clone from audio: who agreed to have their voice cloned, to
    which statement, who collected that and when, and for what purpose."""

    model_config = ConfigDict(extra="forbid")

    speaker_name: StrictStr = Field(min_length=1, max_length=200, pattern=r"\S")
    statement: StrictStr = Field(
        min_length=1,
        max_length=4000,
        pattern=r"\S",
        description="What the speaker agreed to, word for word (what a consent recording says).",
    )
    collected_by: StrictStr = Field(min_length=1, max_length=200, pattern=r"\S")
    collected_at: AwareDatetime = Field(description="When, with its time zone (ISO 8601).")
    purpose: StrictStr = Field(min_length=1, max_length=1000, pattern=r"\S")


class InvalidConsent(ServiceError, ValueError):
    """A consent part that is not a ``ConsentRecord`` (or a second consent recording)."""

    code = "invalid_consent"


class ConsentRequired(ServiceError, ValueError):
    """A clone from audio without its consent record where the service requires one, or a
    consent recording sent without the record it goes with."""

    code = "consent_required"


def check_parts(
    record: dict | None, recording: Path | None, from_audio: bool, required: bool
) -> None:
    """What a clone's consent parts must be: a recording goes with its record and is checked
    against audio to clone (an adapter has none); cloning from audio needs a record where the
    service requires one (``VOICEHOST_CONSENT_REQUIRED``)."""
    if recording is not None and record is None:
        raise ConsentRequired("a consent recording goes with its 'consent' record")
    if recording is not None and not from_audio:
        raise InvalidConsent("a consent recording is checked against audio to clone")
    if from_audio and record is None and required:
        raise ConsentRequired(
            "cloning from audio needs a 'consent' part: the speaker's name, the statement "
            "they agreed to, who collected it, when, and the purpose"
        )


def read_record(text: str) -> dict:
    """The ``consent`` part's JSON, validated: the record as it is stored."""
    try:
        record = ConsentRecord.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidConsent(validation_message(exc, "consent")) from exc
    return record.model_dump(mode="json")


class ConsentMismatch(ServiceError, ValueError):
    """The consent recording's speaker is not the training audio's."""

    code = "consent_speaker_mismatch"

    def __init__(self, measured: float, threshold: float) -> None:
        super().__init__(
            f"the consent recording's speaker is not the training audio's (similarity "
            f"{measured:.3f}, at least {threshold:.2f} is the same speaker)"
        )
        self.measured = measured


def recording_similarity(embedder: SpeakerEmbedder, recording: Path, clips: list[Path]) -> float:
    """How alike the speaker of ``recording`` is to that of ``clips`` (the centroid of the
    first ``MAX_CLIPS`` that hold speech): the cosine of their embeddings, each clip heard
    through the channel they all share (``ChannelView``: a consent read into a phone is
    compared with training audio limited to the phone's band). Raises ``UnreadableAudio`` for
    a recording that is not audio."""
    from lora_training.ingest import UnreadableAudio, decode

    samples = decode(recording, MAX_RECORDING_SECONDS)
    if not np.any(samples):
        raise UnreadableAudio("the recording holds no speech: it is silent")
    heard: list[np.ndarray] = []
    for clip in clips:
        if len(heard) == MAX_CLIPS:
            break
        try:
            decoded = decode(clip, MAX_CLIP_SECONDS)
        except UnreadableAudio:  # the data report says so
            continue
        if np.any(decoded):
            heard.append(decoded)
    if not heard:
        raise UnreadableAudio("no training clip holds speech to compare the recording with")
    view = ChannelView.of([samples, *heard])
    try:
        spoken = embedder.embed(view.treat(samples))
    except ValueError as exc:  # nothing to embed
        raise UnreadableAudio(f"the recording holds no speech: {exc}") from exc
    embeddings: list[np.ndarray] = []
    for clip in heard:
        try:
            embeddings.append(embedder.embed(view.treat(clip)))
        except ValueError:  # silent once treated: the data report says so
            continue
    if not embeddings:
        raise UnreadableAudio("no training clip holds speech to compare the recording with")
    return similarity(spoken, centroid(embeddings))


def check_recording(
    embedder: SpeakerEmbedder, recording: Path, clips: list[Path], threshold: float
) -> float:
    """``recording_similarity``, or ``ConsentMismatch`` below ``threshold``."""
    measured = recording_similarity(embedder, recording, clips)
    if measured < threshold:
        raise ConsentMismatch(measured, threshold)
    return measured


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while block := data.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def save_for_job(
    job_dir: Path, record: dict, recording: Path | None, measured: float | None
) -> None:
    """Keep a validated consent record (and its recording) in a job's folder until the job's
    voice is registered (``attach``)."""
    record = dict(record)
    if recording is not None:
        shutil.move(recording, job_dir / RECORDING)
        record["recording"] = {
            "file": RECORDING,
            "sha256": file_sha256(job_dir / RECORDING),
            "speaker_similarity": None if measured is None else round(measured, 4),
        }
    (job_dir / RECORD_FILE).write_text(_dump(record))


def attach(source: Path, version_folder: Path) -> None:
    """Store the consent record kept in ``source`` (a job's folder, or an upload's) with a
    voice version: into its ``voice.json`` and, if there is one, the recording beside it.
    Nothing to do without a record."""
    path = source / RECORD_FILE
    if not path.is_file():
        return
    record = read_json_object(path)
    if (source / RECORDING).is_file():
        shutil.copy2(source / RECORDING, version_folder / RECORDING)
    manifest_path = version_folder / MANIFEST
    manifest = read_json_object(manifest_path) if manifest_path.exists() else {}
    write_manifest(version_folder, {**manifest, CONSENT: record})


def _dump(record: dict) -> str:
    import json

    return json.dumps(record, indent=2)
