"""Uploads over HTTP: ``POST /v1/voices`` and ``POST /v1/voices/{id}/versions``.

The handler receives the multipart form (streamed to disk under safe names, capped while read),
stores it (the clips and transcripts in a new job's inputs folder, the consent recording beside
them), validates its consent record, and then either registers an uploaded adapter at once
(201) or asks the cloning service's intake to check the audio (``voicehost.cloning.intake``: the
consent recording heard against the training audio, so that a mismatch is refused at once with
422, and each file probed) and queues the job (202). Nothing here decodes audio, builds a
training spec or prepares the training audio: intake runs in this process off its loop, or,
behind a gateway, on a worker; the worker that trains prepares the audio."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    VoiceService,
    path_id,
    record,
)
from voicehost.api.errors import ApiError
from voicehost.api.jobs import CloneJobInfo, job_info
from voicehost.api.openapi import Json, Models, json_body, operation, wrapped
from voicehost.api.voices import VersionInfo, VoiceDetail, managed_voice, version_info, voice_detail
from voicehost.cloning import consent
from voicehost.cloning.intake import (
    TRANSCRIPTS,
    UPLOADED_RECORDING,
    CloneRequest,
    StoredUpload,
    queue_clone,
    store_transcripts,
)
from voicehost.cloning.jobs import JobInProgress
from voicehost.ids import checked_voice_id
from voicehost.model.languages import check_language
from voicehost.tenancy.keys import owner_tenant
from voicehost.voices.validation import (
    MANIFEST,
    PICKLE_SUFFIXES,
    InvalidAdapter,
    assign_tenant,
    declared_bases,
    read_json_object,
    voice_tenant,
)
from voicehost.voices.voice import (
    NoSuchVersion,
    VoiceExists,
    VoiceNotFound,
)

CHUNK = 1 << 16
MAX_FIELD_BYTES = 1 << 16  # a form field (voice_id, name) is short; files are streamed to disk
MAX_FILES = 1000  # file parts in one upload
MAX_NAME_CHARS = 100  # of a saved file name
ADAPTER_PARTS = {
    "adapter_config": "adapter_config.json",
    "adapter_model": "adapter_model.safetensors",
}


def _safe_name(filename: str | None, index: int) -> str:
    """A file name for an uploaded part: the sent name's last component, ASCII letters, digits
    and ``._-`` only, short, never hidden (the sent name never makes a path)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename or "").name)[-MAX_NAME_CHARS:]
    return name if name and not name.startswith(".") else f"audio-{index}"


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
        raise ApiError("unsupported_media_type", "send multipart/form-data")
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError) as exc:
        raise ApiError("invalid_multipart", f"the multipart body is malformed: {exc}") from exc
    try:
        return await _read_parts(reader, folder, max_bytes)
    except (ValueError, AssertionError, HttpProcessingError) as exc:  # a truncated or bad body
        raise ApiError("invalid_multipart", f"the multipart body is malformed: {exc}") from exc


async def _read_parts(reader: MultipartReader, folder: Path, max_bytes: int) -> Upload:
    upload = Upload()
    received = 0
    index = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ApiError("invalid_multipart", "nested multipart bodies are not taken")
        if part.filename is None or not part.name:  # a field; a part without a name is dropped
            value = bytearray()  # raw: a Content-Encoding is never inflated
            while chunk := await part.read_chunk(CHUNK):
                value += chunk
                if len(value) > MAX_FIELD_BYTES or received + len(value) > max_bytes:
                    raise ApiError("upload_too_large", f"form field {part.name!r} is too large")
            received += len(value)
            if part.name:
                upload.fields[part.name] = value.decode("utf-8", errors="replace").strip()
            continue
        index += 1
        if index > MAX_FILES:
            raise ApiError("upload_too_large", f"uploads are limited to {MAX_FILES} files")
        sent = unquote(part.filename)  # some clients percent-encode file names
        target = folder / _safe_name(sent, index)
        while target.exists():
            target = target.with_name(f"{index}-{target.name}"[: 2 * MAX_NAME_CHARS])
        upload.renamed[Path(sent).stem] = target.stem
        with target.open("wb") as sink:
            while chunk := await part.read_chunk(CHUNK):
                received += len(chunk)
                if received > max_bytes:
                    raise ApiError("upload_too_large", f"uploads are limited to {max_bytes} bytes")
                sink.write(chunk)
        upload.files.setdefault(part.name, []).append(target)
    return upload


async def _voice_id(service: VoiceService, fields: dict[str, str]) -> str:
    voice_id = fields.get("voice_id") or re.sub(r"[^a-z0-9]+", "-", fields.get("name", "").lower())
    voice_id = voice_id.strip("-_") or f"voice-{secrets.token_hex(4)}"
    await _ensure_free(service, checked_voice_id(voice_id))
    return voice_id


async def _ensure_no_job(service: VoiceService, voice_id: str) -> None:
    if await asyncio.to_thread(service.jobs.voice_in_progress, voice_id):
        raise JobInProgress(f"a version of {voice_id!r} is being trained")


async def _ensure_free(service: VoiceService, voice_id: str) -> None:
    if await service.voices.exists(voice_id):
        raise VoiceExists(f"voice {voice_id!r} already exists")
    if await asyncio.to_thread(service.jobs.voice_in_progress, voice_id):
        raise VoiceExists(f"voice {voice_id!r} is being trained")


async def create_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices``: audio files -> a clone job (202); a PEFT adapter -> a voice (201)."""
    return await _upload(request, None)


async def add_version(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/versions``: the voice's next version, cloned from audio (202 and
    a job) or a ready-made adapter (201); live at once if it passes the gate, unless the form
    says ``promote=false``."""
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    await managed_voice(service, voice_id, request_principal(request))
    return await _upload(request, voice_id)


async def _upload(request: web.Request, version_of: str | None) -> web.Response:
    """A new voice (``version_of`` None) or a new version of ``version_of``, from a multipart
    upload: its consent record (required for audio where ``consent_required``), then an
    adapter registered at once or audio queued as a clone job."""
    service = request.app[SERVICE]
    settings = service.settings
    principal = request_principal(request)
    tenant = owner_tenant(principal)
    if version_of is not None:  # a version is its voice's tenant's, whoever adds it
        tenant = voice_tenant(await service.voices.manifest(version_of) or {})
    job_id, inputs = service.jobs.new_job_dir()
    job_dir = service.jobs.job_dir(job_id)
    promote = True
    try:
        upload = await _receive(request, inputs, int(settings.max_upload_mb * 1e6))
        consent_record, recording = _consent_parts(upload, job_dir)
        if version_of is None:
            voice_id = await _voice_id(service, upload.fields)
        else:
            voice_id = version_of
            promote = _form_flag(upload.fields, "promote", True)
            await _ensure_no_job(service, voice_id)
        language, base_model = await _language(service, upload.fields, version_of)
        adapter = "adapter_config" in upload.files or "adapter_model" in upload.files
        if adapter and upload.files.get("audio"):
            raise ApiError(
                "ambiguous_upload", "send audio files (to clone) or an adapter, not both"
            )
        consent.check_parts(consent_record, recording, not adapter, settings.consent_required())
        if adapter:
            response, added = await _register_adapter(
                service, voice_id, upload, inputs, tenant, consent_record, version_of, promote
            )
            service.jobs.discard(job_id)
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
        measured = await _check(service, job_id, upload, inputs, recording is not None)
        if consent_record is not None:
            await asyncio.to_thread(
                consent.save_for_job, job_dir, consent_record, recording, measured
            )
        if version_of is None:  # again: another upload may have taken it meanwhile
            await _ensure_free(service, voice_id)
    except Exception:
        await asyncio.to_thread(service.jobs.discard, job_id)
        raise
    except BaseException:  # cancelled: no awaiting
        service.jobs.discard(job_id)
        raise
    name = upload.fields.get("name") or voice_id
    clone = CloneRequest(
        voice_id,
        name,
        tenant,
        new_version=version_of is not None,
        promote=promote,
        language=language,
        base_model=base_model,
    )
    try:
        job = await queue_clone(service.jobs, settings, job_id, clone)
    except BaseException:  # e.g. the cluster's queue is unreachable: no job left half-made
        await asyncio.shield(asyncio.to_thread(service.jobs.discard, job_id))
        raise
    await record(request, "job.created", tenant=tenant, voice=voice_id, job=job.id)
    return web.json_response(
        {"job": job_info(job).model_dump()},
        status=202,
        headers={"Location": f"/v1/jobs/{job.id}"},
    )


async def _language(
    service: VoiceService, fields: dict[str, str], version_of: str | None
) -> tuple[str, str]:
    """The language a clone is trained in and the base model that speaks it: the form's
    ``language`` (one a served model speaks: in a cluster, any of its workers' models), else a
    new version's voice's, else the served model's first."""
    models = service.voices.models
    language = models.own.languages[0]
    if "language" in fields:
        language = check_language(fields["language"], models.languages())
    elif version_of is not None:
        manifest = await service.voices.manifest(version_of) or {}
        if isinstance(manifest.get("language"), str):
            language = manifest["language"]
    rules = models.for_language(language) or models.own
    return language, rules.base_model


def _form_flag(fields: dict[str, str], name: str, default: bool) -> bool:
    value = fields.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ("true", "false"):
        raise ApiError("invalid_request", f"{name} must be true or false")
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
            recording = path.replace(job_dir / UPLOADED_RECORDING)
        else:
            path.unlink()
    if len(recordings) > 1:
        raise consent.InvalidConsent("send one 'consent_recording' file")
    return (None if text is None else consent.read_record(text)), recording


async def _check(
    service: VoiceService, job_id: str, upload: Upload, inputs: Path, recording: bool
) -> float | None:
    """The stored upload, as the cloning service's intake judges it (``service.intake``): 422
    ``consent_speaker_mismatch`` for a consent recording of another speaker than the audio's,
    413 or 415 naming a file that is not audio we take, 400 for clips without transcripts or
    too little audio; the recording's similarity if there is one."""
    audio = upload.files.get("audio", [])
    if not audio:
        raise ApiError("no_audio", "send one or more 'audio' files (or an adapter)")
    for path in upload.files.get("transcripts", []):  # stored under the clips' saved names
        await asyncio.to_thread(store_transcripts, path, inputs / TRANSCRIPTS, upload.renamed)
    stored = StoredUpload(job_id, tuple(path.name for path in audio), recording)
    return await service.intake.check(stored)


async def _register_adapter(
    service: VoiceService,
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
    max_bytes = int(service.settings.max_adapter_mb * 1e6)
    staging = inputs / voice_id
    staging.mkdir()
    for part, name in ADAPTER_PARTS.items():
        if len(files.get(part, [])) != 1:
            raise InvalidAdapter(f"send exactly one '{part}' file")
        if files[part][0].suffix.lower() in PICKLE_SUFFIXES:
            message = f"'{part}' is named like a pickle file: safetensors only"
            raise InvalidAdapter(message)
        if files[part][0].stat().st_size > max_bytes:
            message = f"adapters are limited to {max_bytes} bytes"
            raise InvalidAdapter(message, code="adapter_too_large")
        files[part][0].replace(staging / name)
    manifest_part = files.get("voice", [])
    try:  # the weights are first read by the directory's validation, after the config
        manifest = read_json_object(manifest_part[0]) if manifest_part else {}
    except InvalidAdapter as exc:  # the message names the part
        raise InvalidAdapter(f"'voice': {exc}") from exc
    manifest.pop(consent.CONSENT, None)  # only a validated record is stored as consent
    declared = declared_bases(staging)  # the config's: in a cluster, maybe another model
    manifest = {
        "base_model": declared[0] if declared else service.settings.served_base_name(),
        "prompt_style": "plain",
        **manifest,
        "voice_id": voice_id,
        "name": fields.get("name") or manifest.get("name") or voice_id,
    }
    if "language" in fields:  # checked; else the uploaded voice.json's, else the model's first
        manifest["language"] = fields["language"]
    if consent_record is not None:
        manifest[consent.CONSENT] = consent_record
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    assign_tenant(staging, tenant)  # the caller's tenant, whatever the uploaded manifest says
    try:  # the directory's own errors (invalid_adapter, voice_exists, ...) are the answer
        if version_of is not None:
            added = await service.voices.add_version(voice_id, staging, promote)
        else:
            await service.voices.add(voice_id, staging)
    except NoSuchVersion as exc:  # the voice was deleted meanwhile
        raise VoiceNotFound(voice_id) from exc
    if version_of is not None:
        info = await version_info(service, voice_id, added.version, None)
        response = web.json_response(
            {"version": info.model_dump()},
            status=201,
            headers={"Location": f"/v1/voices/{voice_id}/versions/{added.version}"},
        )
        return response, info
    voice = await voice_detail(service, voice_id, None)
    response = web.json_response(
        {"voice": voice.model_dump()}, status=201, headers={"Location": f"/v1/voices/{voice_id}"}
    )
    return response, await version_info(service, voice_id, 1, None)


def _made(version: VersionInfo) -> dict[str, object]:
    """What an audit event says of a voice registered from an uploaded adapter."""
    return {"source": "adapter", "name": version.manifest.get("name"), "checksum": version.checksum}


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operations of the uploads: a new voice, a new version (their error answers:
    the error table's)."""
    file = {"type": "string", "format": "binary"}
    naming = {
        "name": {"type": "string"},
        "voice_id": {"type": "string", "description": "Default: the name, slugged."},
        "language": {
            "type": "string",
            "description": "The language the voice speaks (BCP-47), one the base model speaks "
            "(`GET /v1/models`; else 400 `unsupported_language`). Default: a new version's "
            "voice's, else the model's first.",
        },
    }
    consenting = {
        "consent": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The consent record, a JSON `ConsentRecord` (a field or a file): "
            "required to clone from audio where `VOICEHOST_REQUIRE_CONSENT` is on (400 "
            "`consent_required`).",
        },
        "consent_recording": {
            **file,
            "description": "The speaker reading the statement: must be the training audio's "
            "speaker (422 `consent_speaker_mismatch`).",
        },
    }
    upload = {
        "description": "Audio to clone, or a ready-made adapter: one or the other, not both "
        "(400 `ambiguous_upload`).",
        "oneOf": [
            {
                "title": "Clone from audio",
                "type": "object",
                "properties": {
                    "audio": {
                        "type": "array",
                        "items": file,
                        "minItems": 1,
                        "description": "Recordings.",
                    },
                    "transcripts": {**file, "description": "metadata.csv: `file|text` per line."},
                    **naming,
                    **consenting,
                },
                "required": ["audio"],
                "not": {
                    "anyOf": [{"required": ["adapter_config"]}, {"required": ["adapter_model"]}]
                },
            },
            {
                "title": "Register an adapter",
                "type": "object",
                "properties": {
                    "adapter_config": {**file, "description": "A PEFT adapter_config.json."},
                    "adapter_model": {**file, "description": "Its adapter_model.safetensors."},
                    "voice": {**file, "description": "An optional voice.json."},
                    "consent": consenting["consent"],
                    **naming,
                },
                "required": ["adapter_config", "adapter_model"],
                "not": {"required": ["audio"]},
            },
        ],
    }
    location = {"description": "The new resource's URL.", "schema": {"type": "string"}}
    job = wrapped("job", CloneJobInfo)
    create = operation(
        "Clone a voice from audio (a job) or register a ready-made adapter",
        {
            "201": json_body(
                wrapped("voice", VoiceDetail), "The adapter is registered.", {"Location": location}
            ),
            "202": json_body(job, "A clone job is queued.", {"Location": location}),
        },
        tag="voices",
        body={"required": True, "content": {"multipart/form-data": {"schema": upload}}},
    )
    version_upload = copy.deepcopy(upload)
    for shape in version_upload["oneOf"]:
        shape["properties"].pop("voice_id")
        shape["properties"]["promote"] = {
            "type": "string",
            "enum": ["true", "false"],
            "description": "`false`: keep the live version (default `true`: a version that "
            "passes the gate goes live).",
        }
    versioned = wrapped("version", VersionInfo)
    add_version = operation(
        "Add a version: clone it from audio (a job) or register a ready-made adapter",
        {
            "201": json_body(
                versioned, "The adapter is the voice's next version.", {"Location": location}
            ),
            "202": json_body(
                job, "A clone job for the next version is queued.", {"Location": location}
            ),
        },
        tag="voices",
        description="A version is immutable: one adapter (by checksum) with its own manifest, "
        "data report, evaluation and consent record. Cloned from audio, it needs a consent "
        "record as a new voice does.",
        body={"required": True, "content": {"multipart/form-data": {"schema": version_upload}}},
    )
    return {
        "create_voice": create,
        "add_version": add_version,
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ((consent.ConsentRecord, "validation"),)
