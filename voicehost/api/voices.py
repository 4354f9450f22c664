"""Voice management over HTTP: clone from audio (with its consent record), register an
adapter, versions (add, list, promote, delete), publish a held voice, jobs, manifests.

Each change to a voice happens in one handler here: ``create_voice`` and ``add_version`` (both
through ``_upload``), ``promote_version``, ``delete_version``, ``delete_voice``,
``publish_voice``."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError

from lora_training.ingest import AudioTooLong, UnreadableAudio, UnsupportedAudio, measure
from lora_training.recipe import NotEnoughSpeech, VoiceJob, prepare
from lora_training.train import TrainSettings, learning_rate_for
from lora_training.transcripts import MissingTranscripts, read_metadata
from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    ApiError,
    VoiceService,
    load_json,
    read_body,
    record,
    validation_message,
    voice_not_found,
)
from voicehost.api.schemas import (
    CloneJobInfo,
    ConsentRecord,
    PublishRequest,
    VersionInfo,
    VersionList,
    VoiceDetail,
    VoiceInfo,
    VoiceList,
)
from voicehost.cloning import consent
from voicehost.cloning.jobs import FINISHED, CloneJob
from voicehost.ids import (
    JOB_ID_PATTERN,
    VERSION_PATTERN,
    VOICE_ID_PATTERN,
    is_job_id,
    is_version,
    is_voice_id,
)
from voicehost.tenancy.keys import Principal, can_manage, can_see, owner_tenant
from voicehost.voices.validation import (
    MANIFEST,
    PICKLE_SUFFIXES,
    InvalidAdapter,
    assign_tenant,
    read_json_object,
    voice_status,
    voice_tenant,
)
from voicehost.voices.voice import (
    DuplicateVersion,
    HeldVersion,
    LiveVersion,
    NoSuchVersion,
    NotHeld,
    ReadOnlyVoice,
    VoiceDirectory,
    VoiceExists,
    VoiceVersion,
)

CHUNK = 1 << 16
MAX_FIELD_BYTES = 1 << 16  # a form field (voice_id, name) is short; files are streamed to disk
MAX_FILES = 1000  # file parts in one upload
MAX_NAME_CHARS = 100  # of a saved file name
PATH_IDS = {"voice_id": (is_voice_id, VOICE_ID_PATTERN), "job_id": (is_job_id, JOB_ID_PATTERN)}
ADAPTER_PARTS = {
    "adapter_config": "adapter_config.json",
    "adapter_model": "adapter_model.safetensors",
}


def _safe_name(filename: str | None, index: int) -> str:
    """A file name for an uploaded part: the sent name's last component, ASCII letters, digits
    and ``._-`` only, short, never hidden (the sent name never makes a path)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename or "").name)[-MAX_NAME_CHARS:]
    return name if name and not name.startswith(".") else f"audio-{index}"


def _path_version(request: web.Request) -> int:
    """The version number in the route's path: 400 unless it is one (1, 2, ...)."""
    value = request.match_info["version"]
    if not is_version(value):
        raise ApiError(400, "invalid_version", f"version must match {VERSION_PATTERN.pattern}")
    return int(value)


def _path_id(request: web.Request, key: str) -> str:
    """A voice or job id from the route's path (aiohttp has percent-decoded it): 400 unless it
    matches the id pattern whole."""
    value = request.match_info[key]
    valid, pattern = PATH_IDS[key]
    if not valid(value):
        raise ApiError(400, f"invalid_{key}", f"{key} must match {pattern.pattern}")
    return value


@dataclass
class Upload:
    """A multipart upload saved to disk."""

    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, list[Path]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)  # sent file stem -> saved file stem


async def _receive(request: web.Request, folder: Path, max_bytes: int) -> Upload:
    """Stream a multipart upload into ``folder``, under safe file names.

    The size cap is enforced while reading: an oversized upload stops at the cap with 413.
    """
    if not request.content_type.startswith("multipart/"):
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data")
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError) as exc:
        raise ApiError(400, "invalid_multipart", f"the multipart body is malformed: {exc}") from exc
    try:
        return await _read_parts(reader, folder, max_bytes)
    except (ValueError, AssertionError, HttpProcessingError) as exc:  # a truncated or bad body
        raise ApiError(400, "invalid_multipart", f"the multipart body is malformed: {exc}") from exc


async def _read_parts(reader: MultipartReader, folder: Path, max_bytes: int) -> Upload:
    upload = Upload()
    received = 0
    index = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ApiError(400, "invalid_multipart", "nested multipart bodies are not taken")
        if part.filename is None or not part.name:  # a field; a part without a name is dropped
            value = bytearray()  # raw: a Content-Encoding is never inflated
            while chunk := await part.read_chunk(CHUNK):
                value += chunk
                if len(value) > MAX_FIELD_BYTES or received + len(value) > max_bytes:
                    raise ApiError(
                        413, "upload_too_large", f"form field {part.name!r} is too large"
                    )
            received += len(value)
            if part.name:
                upload.fields[part.name] = value.decode("utf-8", errors="replace").strip()
            continue
        index += 1
        if index > MAX_FILES:
            raise ApiError(413, "upload_too_large", f"uploads are limited to {MAX_FILES} files")
        sent = unquote(part.filename)  # some clients percent-encode file names
        target = folder / _safe_name(sent, index)
        while target.exists():
            target = target.with_name(f"{index}-{target.name}"[: 2 * MAX_NAME_CHARS])
        upload.renamed[Path(sent).stem] = target.stem
        with target.open("wb") as sink:
            while chunk := await part.read_chunk(CHUNK):
                received += len(chunk)
                if received > max_bytes:
                    raise ApiError(
                        413, "upload_too_large", f"uploads are limited to {max_bytes} bytes"
                    )
                sink.write(chunk)
        upload.files.setdefault(part.name, []).append(target)
    return upload


async def _voice_id(runtime: VoiceService, fields: dict[str, str]) -> str:
    voice_id = fields.get("voice_id") or re.sub(r"[^a-z0-9]+", "-", fields.get("name", "").lower())
    voice_id = voice_id.strip("-_") or f"voice-{secrets.token_hex(4)}"
    if not is_voice_id(voice_id):
        raise ApiError(400, "invalid_voice_id", f"voice_id must match {VOICE_ID_PATTERN.pattern}")
    await _ensure_free(runtime, voice_id)
    return voice_id


async def _ensure_no_job(runtime: VoiceService, voice_id: str) -> None:
    if await asyncio.to_thread(runtime.jobs.voice_in_progress, voice_id):
        raise ApiError(409, "job_in_progress", f"a version of {voice_id!r} is being trained")


async def _ensure_free(runtime: VoiceService, voice_id: str) -> None:
    if await runtime.voices.exists(voice_id):
        raise ApiError(409, "voice_exists", f"voice {voice_id!r} already exists")
    if await asyncio.to_thread(runtime.jobs.voice_in_progress, voice_id):
        raise ApiError(409, "voice_exists", f"voice {voice_id!r} is being trained")


async def create_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices``: audio files -> a clone job (202); a PEFT adapter -> a voice (201)."""
    return await _upload(request, None)


async def add_version(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/versions``: the voice's next version, cloned from audio (202 and
    a job) or a ready-made adapter (201); live at once if it passes the gate, unless the form
    says ``promote=false``."""
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    await _managed_voice(runtime, voice_id, request_principal(request))
    return await _upload(request, voice_id)


async def _upload(request: web.Request, version_of: str | None) -> web.Response:
    """A new voice (``version_of`` None) or a new version of ``version_of``, from a multipart
    upload: its consent record (required for audio where ``consent_required``), then an
    adapter registered at once or audio queued as a clone job."""
    runtime = request.app[SERVICE]
    settings = runtime.settings
    principal = request_principal(request)
    tenant = owner_tenant(principal)
    if version_of is not None:  # a version is its voice's tenant's, whoever adds it
        tenant = voice_tenant(await runtime.voices.manifest(version_of) or {})
    job_id, inputs = runtime.jobs.new_job_dir()
    job_dir = runtime.jobs.job_dir(job_id)
    promote = True
    try:
        upload = await _receive(request, inputs, int(settings.max_upload_mb * 1e6))
        consent_record, recording = _consent_parts(upload, job_dir)
        if version_of is None:
            voice_id = await _voice_id(runtime, upload.fields)
        else:
            voice_id = version_of
            promote = _form_flag(upload.fields, "promote", True)
            await _ensure_no_job(runtime, voice_id)
        adapter = "adapter_config" in upload.files or "adapter_model" in upload.files
        if adapter and upload.files.get("audio"):
            raise ApiError(
                400, "ambiguous_upload", "send audio files (to clone) or an adapter, not both"
            )
        if recording is not None and consent_record is None:
            raise ApiError(
                400, "consent_required", "a consent recording goes with its 'consent' record"
            )
        if adapter:
            if recording is not None:
                raise ApiError(
                    400, "invalid_consent", "a consent recording is checked against audio to clone"
                )
            response, added = await _register_adapter(
                runtime, voice_id, upload, inputs, tenant, consent_record, version_of, promote
            )
            runtime.jobs.discard(job_id)
            audited = {"tenant": tenant, "voice": voice_id, "version": added.version}
            if version_of is None:
                await record(request, "voice.created", **audited, details=_made(added))
            else:
                details = {"source": "adapter", "checksum": added.checksum, "live": added.live}
                await record(request, "voice.version_added", **audited, details=details)
                if added.live:
                    await record(request, "voice.promoted", **audited)
            if consent_record is not None:
                await record(request, "voice.consent_recorded", **audited)
            return response
        if consent_record is None and settings.consent_required():
            raise ApiError(
                400,
                "consent_required",
                "cloning from audio needs a 'consent' part: the speaker's name, the statement "
                "they agreed to, who collected it, when, and the purpose",
            )
        measured = None
        if recording is not None and upload.files.get("audio"):  # the speaker before the data
            measured = await _check_consent_recording(runtime, recording, upload.files["audio"])
        spec = await _check_audio(runtime, voice_id, upload, inputs, job_id)
        if consent_record is not None:
            await asyncio.to_thread(
                consent.save_for_job, job_dir, consent_record, recording, measured
            )
        if version_of is None:  # again: another upload may have taken it meanwhile
            await _ensure_free(runtime, voice_id)
    except Exception:
        await asyncio.to_thread(runtime.jobs.discard, job_id)
        raise
    except BaseException:  # cancelled: no awaiting
        runtime.jobs.discard(job_id)
        raise
    try:
        job = await runtime.jobs.submit(
            job_id, spec, tenant, new_version=version_of is not None, promote=promote
        )
    except BaseException:  # e.g. the cluster's queue is unreachable: no job left half-made
        await asyncio.shield(asyncio.to_thread(runtime.jobs.discard, job_id))
        raise
    await record(request, "job.created", tenant=tenant, voice=voice_id, job=job.id)
    return web.json_response(
        {"job": _job_info(job).model_dump()},
        status=202,
        headers={"Location": f"/v1/jobs/{job.id}"},
    )


def _form_flag(fields: dict[str, str], name: str, default: bool) -> bool:
    value = fields.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ("true", "false"):
        raise ApiError(400, "invalid_request", f"{name} must be true or false")
    return value == "true"


def _consent_parts(upload: Upload, job_dir: Path) -> tuple[dict | None, Path | None]:
    """The upload's consent record (the ``consent`` field or file, JSON, validated) and
    consent recording, both taken out of the training inputs."""
    text = upload.fields.pop("consent", None)
    for path in upload.files.pop("consent", []):
        text = path.read_text(encoding="utf-8", errors="replace")
        path.unlink()
    recordings = upload.files.pop("consent_recording", [])
    recording = None
    for index, path in enumerate(recordings):
        if index == 0:
            recording = path.replace(job_dir / "consent_upload")
        else:
            path.unlink()
    if len(recordings) > 1:
        raise ApiError(400, "invalid_consent", "send one 'consent_recording' file")
    if text is None:
        return None, recording
    try:
        payload = load_json(text)
    except ValueError as exc:
        raise ApiError(400, "invalid_consent", f"'consent' is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_consent", "'consent' must be a JSON object")
    try:
        record = ConsentRecord.model_validate(payload)
    except ValidationError as exc:
        raise ApiError(400, "invalid_consent", validation_message(exc, "consent")) from exc
    return record.model_dump(mode="json"), recording


async def _check_consent_recording(
    runtime: VoiceService, recording: Path, clips: list[Path]
) -> float:
    """The consent recording's similarity to the training audio's speaker: 422
    ``consent_speaker_mismatch`` below ``VOICEHOST_CONSENT_MIN_SIMILARITY``."""
    settings = runtime.settings
    try:
        encoder = await asyncio.to_thread(consent.shared_encoder, settings.speaker_encoder)
        return await asyncio.to_thread(
            consent.check_recording, encoder, recording, clips, settings.consent_min_similarity
        )
    except consent.ConsentMismatch as exc:
        raise ApiError(422, "consent_speaker_mismatch", str(exc)) from exc
    except AudioTooLong as exc:
        raise ApiError(413, "audio_too_long", f"the consent recording: {exc}") from exc
    except UnreadableAudio as exc:
        raise ApiError(
            415, "not_audio", f"the consent recording is not audio we can read: {exc}"
        ) from exc


def _store_transcripts(upload: Path, target: Path, renamed: dict[str, str]) -> None:
    """Save an uploaded ``metadata.csv`` keyed by the names the audio files were saved under."""
    try:
        texts = read_metadata(upload)
    except (UnicodeDecodeError, ValueError) as exc:
        message = f"transcripts must be UTF-8 lines of file|text: {exc}"
        raise ApiError(400, "invalid_transcripts", message) from exc
    upload.unlink()
    lines = [f"{renamed.get(stem, stem)}|{text}" for stem, text in texts.items()]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


async def _check_audio(
    runtime: VoiceService, voice_id: str, upload: Upload, inputs: Path, job_id: str
) -> VoiceJob:
    settings = runtime.settings
    audio = upload.files.get("audio", [])
    if not audio:
        raise ApiError(400, "no_audio", "send one or more 'audio' files (or an adapter)")
    budget = settings.max_upload_minutes * 60
    for path in audio:  # by content; decoded, counted and dropped: nothing held in memory
        try:
            seconds = await asyncio.to_thread(measure, path, budget)
        except AudioTooLong as exc:
            raise ApiError(413, "audio_too_long", f"{path.name}: {exc}") from exc
        except UnsupportedAudio as exc:
            raise ApiError(415, "unsupported_audio", f"{path.name}: {exc}") from exc
        except UnreadableAudio as exc:
            raise ApiError(
                415, "not_audio", f"{path.name} is not audio we can read: {exc}"
            ) from exc
        budget -= seconds
    for path in upload.files.get("transcripts", []):
        _store_transcripts(path, inputs / "metadata.csv", upload.renamed)
    spec = VoiceJob(
        audio=[inputs],
        voice_id=voice_id,
        name=upload.fields.get("name") or voice_id,
        base_model=settings.served_model(),
        base_model_name=settings.served_base_name(),
        codec=settings.served_codec(),
        adapters_dir=runtime.jobs.output_dir(job_id),
        work_dir=inputs.parent / "work",
        train=TrainSettings(
            epochs=settings.clone_epochs, learning_rate=learning_rate_for(settings.dev)
        ),
        min_speech_seconds=settings.min_speech_seconds,
        replace_existing=False,
        speaker_encoder=settings.speaker_encoder,
        speaker_min_similarity=settings.speaker_min_similarity,
        speaker_min_pitch_shift=settings.speaker_min_pitch_shift,
    )
    try:
        await asyncio.to_thread(prepare, spec, measure=False)  # the worker measures the data
    except (NotEnoughSpeech, MissingTranscripts) as exc:
        raise ApiError(
            400,
            "not_enough_speech" if isinstance(exc, NotEnoughSpeech) else "missing_transcripts",
            str(exc),
        ) from exc
    return spec


async def _register_adapter(
    runtime: VoiceService,
    voice_id: str,
    upload: Upload,
    inputs: Path,
    tenant: str | None,
    consent_record: dict | None,
    version_of: str | None,
    promote: bool,
) -> tuple[web.Response, VersionInfo]:
    """Stage the uploaded adapter (with its consent record, if any) and register it: as a
    new voice (201 and the voice), or as ``version_of``'s next version (201 and the version);
    and the version it is."""
    files, fields = upload.files, upload.fields
    max_bytes = int(runtime.settings.max_adapter_mb * 1e6)
    staging = inputs / voice_id
    staging.mkdir()
    for part, name in ADAPTER_PARTS.items():
        if len(files.get(part, [])) != 1:
            raise ApiError(400, "invalid_adapter", f"send exactly one '{part}' file")
        if files[part][0].suffix.lower() in PICKLE_SUFFIXES:
            message = f"'{part}' is named like a pickle file: safetensors only"
            raise ApiError(400, "invalid_adapter", message)
        if files[part][0].stat().st_size > max_bytes:
            raise ApiError(413, "adapter_too_large", f"adapters are limited to {max_bytes} bytes")
        files[part][0].replace(staging / name)
    manifest_part = files.get("voice", [])
    try:  # the weights are first read by the directory's validation, after the config
        manifest = read_json_object(manifest_part[0]) if manifest_part else {}
    except InvalidAdapter as exc:
        raise ApiError(400, "invalid_adapter", f"'voice': {exc}") from exc
    manifest.pop(consent.CONSENT, None)  # only a validated record is stored as consent
    manifest = {
        "base_model": runtime.settings.served_base_name(),
        "prompt_style": "plain",
        **manifest,
        "voice_id": voice_id,
        "name": fields.get("name") or manifest.get("name") or voice_id,
    }
    if consent_record is not None:
        manifest[consent.CONSENT] = consent_record
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    assign_tenant(staging, tenant)  # the caller's tenant, whatever the uploaded manifest says
    try:
        if version_of is not None:
            added = await runtime.voices.add_version(voice_id, staging, promote)
        else:
            await runtime.voices.add(voice_id, staging)
    except InvalidAdapter as exc:
        raise ApiError(400, "invalid_adapter", str(exc)) from exc
    except VoiceExists as exc:
        raise ApiError(409, "voice_exists", str(exc)) from exc
    except DuplicateVersion as exc:
        raise ApiError(409, "version_exists", str(exc)) from exc
    except NoSuchVersion as exc:  # deleted meanwhile
        raise voice_not_found(voice_id) from exc
    except ReadOnlyVoice as exc:
        raise ApiError(403, "voice_read_only", str(exc)) from exc
    if version_of is not None:
        info = await _version_info(runtime, voice_id, added.version, None)
        response = web.json_response(
            {"version": info.model_dump()},
            status=201,
            headers={"Location": f"/v1/voices/{voice_id}/versions/{added.version}"},
        )
        return response, info
    voice = await _voice_detail(runtime, voice_id, None)
    response = web.json_response(
        {"voice": voice.model_dump()}, status=201, headers={"Location": f"/v1/voices/{voice_id}"}
    )
    return response, await _version_info(runtime, voice_id, 1, None)


def _visible_manifest(manifest: dict, manageable: bool) -> dict:
    """A manifest as a caller sees it: the consent record only for the voice's tenant and
    admins (who may manage it), never for other tenants reading a shared voice."""
    if manageable or consent.CONSENT not in manifest:
        return manifest
    return {k: v for k, v in manifest.items() if k != consent.CONSENT}


async def _managed_voice(
    runtime: VoiceService, voice_id: str, principal: Principal | None
) -> VoiceDetail:
    """The voice ``principal`` may change: 404 for one it cannot see, 403 ``voice_read_only``
    for a built-in voice or a shared one (admins only)."""
    detail = await _voice_detail(runtime, voice_id, principal)
    if detail.kind == "builtin":
        raise ApiError(403, "voice_read_only", f"voice {voice_id!r} is a built-in voice")
    if not can_manage(principal, voice_tenant(detail.manifest)):
        raise ApiError(403, "voice_read_only", f"voice {voice_id!r} is shared: admins only")
    return detail


def _version_of(entry: VoiceVersion, manageable: bool) -> VersionInfo:
    return VersionInfo(
        version=entry.version,
        status=entry.status,
        live=entry.live,
        checksum=entry.checksum,
        manifest=_visible_manifest(entry.manifest, manageable),
        error=entry.error,
    )


async def _version_info(
    runtime: VoiceService, voice_id: str, version: int, principal: Principal | None
) -> VersionInfo:
    entries = await runtime.voices.versions(voice_id) or []
    for entry in entries:
        if entry.version == version:
            tenant = voice_tenant(entry.manifest)
            return _version_of(entry, can_manage(principal, tenant))
    raise ApiError(404, "version_not_found", f"voice {voice_id!r} has no version {version}")


async def list_versions(request: web.Request) -> web.Response:
    """``GET /v1/voices/{id}/versions``: every version, oldest first (held ones only for those
    who may manage the voice)."""
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    principal = request_principal(request)
    detail = await _voice_detail(runtime, voice_id, principal)
    entries = await runtime.voices.versions(voice_id)
    if entries is None:
        raise voice_not_found(voice_id)
    manageable = can_manage(principal, voice_tenant(detail.manifest))
    live = next((e.version for e in entries if e.live), 1)
    listed = [_version_of(e, manageable) for e in entries if e.status != "held" or manageable]
    body = VersionList(voice_id=voice_id, live=live, versions=listed)
    return web.json_response(body.model_dump())


async def promote_version(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/versions/{n}/promote``: version n goes live (forward or back),
    at once for every process; the one it replaces stays servable when pinned."""
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    version = _path_version(request)
    principal = request_principal(request)
    await _managed_voice(runtime, voice_id, principal)
    try:
        await runtime.voices.promote(voice_id, version)
    except NoSuchVersion as exc:
        raise ApiError(404, "version_not_found", str(exc)) from exc
    except HeldVersion as exc:
        raise ApiError(409, "version_held", str(exc)) from exc
    except InvalidAdapter as exc:
        raise ApiError(422, "voice_unusable", f"version {version}: {exc}") from exc
    except ReadOnlyVoice as exc:
        raise ApiError(403, "voice_read_only", str(exc)) from exc
    info = await _version_info(runtime, voice_id, version, principal)
    tenant = voice_tenant(info.manifest)
    await record(request, "voice.promoted", tenant=tenant, voice=voice_id, version=version)
    return web.json_response({"version": info.model_dump()})


async def delete_version(request: web.Request) -> web.Response:
    """``DELETE /v1/voices/{id}/versions/{n}``: remove a version that is not the live one."""
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    version = _path_version(request)
    detail = await _managed_voice(runtime, voice_id, request_principal(request))
    try:
        removed = await runtime.voices.remove_version(voice_id, version)
    except LiveVersion as exc:
        raise ApiError(409, "version_live", str(exc)) from exc
    except NoSuchVersion as exc:
        raise voice_not_found(voice_id) from exc
    except ReadOnlyVoice as exc:
        raise ApiError(403, "voice_read_only", str(exc)) from exc
    if not removed:
        raise ApiError(404, "version_not_found", f"voice {voice_id!r} has no version {version}")
    tenant = voice_tenant(detail.manifest)
    await record(request, "voice.version_deleted", tenant=tenant, voice=voice_id, version=version)
    return web.Response(status=204)


async def _voice_detail(
    runtime: VoiceService, voice_id: str, principal: Principal | None
) -> VoiceDetail:
    manifest = await runtime.voices.manifest(voice_id)
    if manifest is None or not can_see(
        principal, voice_tenant(manifest), held=voice_status(manifest) == "held"
    ):
        raise voice_not_found(voice_id)
    builtin = runtime.voices.builtin.get(voice_id)
    if builtin is not None and not manifest:
        return VoiceDetail(id=voice_id, name=builtin.name, kind="builtin", manifest={})
    name = str(manifest.get("name") or voice_id)
    manageable = can_manage(principal, voice_tenant(manifest))
    visible = _visible_manifest(manifest, manageable)
    return VoiceDetail(id=voice_id, name=name, kind="adapter", manifest=visible)


async def voice_infos(
    directory: VoiceDirectory,
    principal: Principal | None,
    aliases: Mapping[str, str] | None = None,
) -> list[VoiceInfo]:
    """The voices ``principal`` can use: shared ones and its tenant's (all for an admin), held
    ones only to their tenant and admins; unusable adapters only to an admin or in open mode
    (their tenant is unknown). Each lists the ``aliases`` that name it for ``principal``: those
    that are not the id of a voice it can see (which ``find_voice`` would speak instead)."""
    usable, broken = await directory.list_voices()
    usable = [v for v in usable if can_see(principal, v.tenant, held=v.status == "held")]
    if principal is not None and not principal.admin:
        broken = []
    seen = {v.voice_id for v in usable}
    named: dict[str, list[str]] = {}
    for alias, voice_id in (aliases or {}).items():
        if alias not in seen:
            named.setdefault(voice_id, []).append(alias)
    voices = [
        VoiceInfo(
            id=v.voice_id,
            name=v.name,
            kind="builtin" if v.voice_id in directory.builtin else "adapter",
            status=v.status,
            aliases=sorted(named[v.voice_id]) if v.voice_id in named else None,
        )
        for v in usable
    ]
    voices += [
        VoiceInfo(id=b.voice_id, name=b.voice_id, kind="adapter", status="error", error=b.error)
        for b in broken
    ]
    return voices


async def list_voices(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    principal = request_principal(request)
    voices = await voice_infos(service.voices, principal, service.settings.voice_aliases)
    return web.json_response(VoiceList(voices=voices).model_dump(exclude_none=True))


async def get_voice(request: web.Request) -> web.Response:
    runtime = request.app[SERVICE]
    voice = await _voice_detail(runtime, _path_id(request, "voice_id"), request_principal(request))
    return web.json_response({"voice": voice.model_dump()})


async def delete_voice(request: web.Request) -> web.Response:
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    principal = request_principal(request)
    if principal is not None and not principal.admin:  # 404 for another tenant's
        tenant = voice_tenant((await _voice_detail(runtime, voice_id, principal)).manifest)
        if not can_manage(principal, tenant) and voice_id not in runtime.voices.builtin:
            raise ApiError(403, "voice_read_only", f"voice {voice_id!r} is shared: admins only")
    owner = voice_tenant(await runtime.voices.manifest(voice_id) or {})  # for its audit event
    try:
        removed = await runtime.voices.remove(voice_id)
    except ReadOnlyVoice as exc:
        raise ApiError(403, "voice_read_only", str(exc)) from exc
    if not removed:
        raise ApiError(404, "voice_not_found", f"voice {voice_id!r} does not exist")
    await record(request, "voice.deleted", tenant=owner, voice=voice_id)
    return web.Response(status=204)


async def publish_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/publish``: its tenant or an admin makes a held voice ready anyway;
    why, by which key and when go into its ``voice.json`` as ``published``."""
    runtime = request.app[SERVICE]
    voice_id = _path_id(request, "voice_id")
    body = await read_body(request, PublishRequest)
    principal = request_principal(request)
    # 404 for a voice it cannot see; a held voice is seen only by those who may manage it
    await _voice_detail(runtime, voice_id, principal)
    published = {
        "reason": body.reason,
        "by": principal.key_id if principal is not None else None,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        voice = await runtime.voices.publish(voice_id, published, body.version)
    except NotHeld as exc:
        raise ApiError(409, "voice_not_held", str(exc)) from exc
    if voice is None:  # deleted meanwhile
        raise voice_not_found(voice_id)
    detail = await _voice_detail(runtime, voice_id, principal)
    tenant = voice_tenant(detail.manifest)
    await record(
        request,
        "voice.published",
        tenant=tenant,
        voice=voice_id,
        version=voice.version,
        details=published,
    )
    return web.json_response({"voice": detail.model_dump()})


def _made(version: VersionInfo) -> dict[str, object]:
    """What an audit event says of a voice registered from an uploaded adapter."""
    return {"source": "adapter", "name": version.manifest.get("name"), "checksum": version.checksum}


def _job_info(job: CloneJob) -> CloneJobInfo:
    return CloneJobInfo.model_validate(job, from_attributes=True)


def _job(request: web.Request) -> CloneJob:
    """The job the route names: 404 if there is none, or it is another tenant's."""
    job_id = _path_id(request, "job_id")
    job = request.app[SERVICE].jobs.get(job_id)
    if job is None or not can_see(request_principal(request), job.tenant):
        raise ApiError(404, "job_not_found", f"job {job_id!r} does not exist")
    return job


async def get_job(request: web.Request) -> web.Response:
    job = _job(request)
    return web.json_response({"job": _job_info(job).model_dump()})


async def cancel_job(request: web.Request) -> web.Response:
    """``DELETE /v1/jobs/{id}``: cancel a queued or running job; delete a finished one (and its
    stored inputs)."""
    runtime = request.app[SERVICE]
    job = _job(request)
    if job.status in FINISHED:
        if runtime.jobs.is_running(job.id):
            raise ApiError(409, "job_busy", "the job's worker is still stopping; try again")
        await asyncio.to_thread(runtime.jobs.discard, job.id)
        await record(request, "job.deleted", tenant=job.tenant, voice=job.voice_id, job=job.id)
        return web.Response(status=204)
    job = await runtime.jobs.cancel(job.id)
    await record(request, "job.cancelled", tenant=job.tenant, voice=job.voice_id, job=job.id)
    return web.json_response({"job": _job_info(job).model_dump()})


async def retry_job(request: web.Request) -> web.Response:
    runtime = request.app[SERVICE]
    job = _job(request)
    if runtime.jobs.is_running(job.id):
        raise ApiError(409, "job_not_retryable", "the job's worker is still stopping; try again")
    if not job.new_version and await runtime.voices.exists(job.voice_id):
        raise ApiError(409, "voice_exists", f"voice {job.voice_id!r} exists now")
    if job.status not in ("failed", "cancelled"):
        raise ApiError(
            409, "job_not_retryable", f"job is {job.status}; only failed or cancelled jobs retry"
        )
    job = await runtime.jobs.retry(job.id)
    await record(request, "job.retried", tenant=job.tenant, voice=job.voice_id, job=job.id)
    return web.json_response({"job": _job_info(job).model_dump()}, status=202)
