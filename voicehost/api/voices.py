"""Voices and their versions over HTTP: list, look up, delete and publish voices; list,
promote and delete versions. What a caller may see of each (a voice's consent record only to
those who may manage it) is decided here. New voices and versions come in through
``voicehost.api.uploads``; clone jobs are ``voicehost.api.jobs``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    VoiceService,
    path_id,
    path_version,
    read_body,
    record,
)
from voicehost.api.openapi import Json, Models, json_body, operation, ref, wrapped
from voicehost.api.schemas import VersionNumber
from voicehost.cloning import consent
from voicehost.ids import now_iso
from voicehost.tenancy.keys import Principal, can_manage, can_see
from voicehost.voices.validation import (
    voice_status,
    voice_tenant,
)
from voicehost.voices.voice import (
    NoSuchVersion,
    ReadOnlyVoice,
    VoiceDirectory,
    VoiceNotFound,
    VoiceVersion,
)

# --- its wire models ---


class VoiceInfo(BaseModel):
    """One entry of ``GET /v1/audio/voices``: ``held`` is a clone that measured below the
    evaluation gate, listed only to its tenant and admins, who may listen and publish it;
    ``aliases`` are the other names that speak with it (OpenAI's ``alloy`` ...)."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    language: str | None = Field(
        None,
        description="The language it speaks (BCP-47); a request's text is read in it (none for "
        "an unusable adapter).",
    )
    status: Literal["ready", "held", "error"] = "ready"
    error: str | None = None
    aliases: list[str] | None = Field(
        None, description="Other names a request may use for this voice (VOICEHOST_VOICE_ALIASES)."
    )


class VoiceList(BaseModel):
    voices: list[VoiceInfo]


class PublishRequest(BaseModel):
    """``POST /v1/voices/{id}/publish``: make a held voice ready anyway, saying why."""

    model_config = ConfigDict(extra="forbid")

    reason: StrictStr = Field(
        min_length=1,
        max_length=500,
        pattern=r"\S",
        description="Why it goes live despite its evaluation (recorded in its voice.json).",
    )
    version: VersionNumber | None = Field(
        None, description="Which held version (default: the live one)."
    )


class VersionInfo(BaseModel):
    """One version of a voice: ``held`` by the gate; else ``ready`` while live, ``retired``
    once replaced, ``candidate`` if it has never been live. Its manifest holds its data report,
    evaluation and consent record (the consent only for the voice's tenant and admins)."""

    version: int
    status: Literal["candidate", "ready", "held", "retired"]
    live: bool
    checksum: str | None = None
    manifest: dict[str, object] = Field(default_factory=dict)
    error: str | None = None


class VersionList(BaseModel):
    """``GET /v1/voices/{id}/versions``: oldest first."""

    voice_id: str
    live: int
    versions: list[VersionInfo]


class VoiceDetail(BaseModel):
    """``GET /v1/voices/{id}``: a voice and its manifest (``voice.json``)."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    language: str = Field(description="The language it speaks (BCP-47).")
    manifest: dict[str, object] = Field(default_factory=dict)


def _visible_manifest(manifest: dict, manageable: bool) -> dict:
    """A manifest as a caller sees it: the consent record only for the voice's tenant and
    admins (who may manage it), never for other tenants reading a shared voice."""
    if manageable or consent.CONSENT not in manifest:
        return manifest
    return {k: v for k, v in manifest.items() if k != consent.CONSENT}


async def managed_voice(
    service: VoiceService, voice_id: str, principal: Principal | None
) -> VoiceDetail:
    """The voice ``principal`` may change: 404 for one it cannot see, 403 ``voice_read_only``
    for a built-in voice or a shared one (admins only)."""
    detail = await voice_detail(service, voice_id, principal)
    if detail.kind == "builtin":
        raise ReadOnlyVoice(f"voice {voice_id!r} is a built-in voice")
    if not can_manage(principal, voice_tenant(detail.manifest)):
        raise ReadOnlyVoice(f"voice {voice_id!r} is shared: admins only")
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


async def version_info(
    service: VoiceService, voice_id: str, version: int, principal: Principal | None
) -> VersionInfo:
    entries = await service.voices.versions(voice_id) or []
    for entry in entries:
        if entry.version == version:
            tenant = voice_tenant(entry.manifest)
            return _version_of(entry, can_manage(principal, tenant))
    raise NoSuchVersion(f"voice {voice_id!r} has no version {version}")


async def list_versions(request: web.Request) -> web.Response:
    """``GET /v1/voices/{id}/versions``: every version, oldest first (held ones only for those
    who may manage the voice)."""
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    principal = request_principal(request)
    detail = await voice_detail(service, voice_id, principal)
    entries = await service.voices.versions(voice_id)
    if entries is None:
        raise VoiceNotFound(voice_id)
    manageable = can_manage(principal, voice_tenant(detail.manifest))
    live = next((e.version for e in entries if e.live), 1)
    listed = [_version_of(e, manageable) for e in entries if e.status != "held" or manageable]
    body = VersionList(voice_id=voice_id, live=live, versions=listed)
    return web.json_response(body.model_dump())


async def promote_version(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/versions/{n}/promote``: version n goes live (forward or back),
    at once for every process; the one it replaces stays servable when pinned."""
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    version = path_version(request)
    principal = request_principal(request)
    await managed_voice(service, voice_id, principal)
    await service.voices.promote(voice_id, version)
    info = await version_info(service, voice_id, version, principal)
    tenant = voice_tenant(info.manifest)
    await record(request, "voice.promoted", tenant=tenant, voice=voice_id, version=version)
    return web.json_response({"version": info.model_dump()})


async def delete_version(request: web.Request) -> web.Response:
    """``DELETE /v1/voices/{id}/versions/{n}``: remove a version that is not the live one."""
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    version = path_version(request)
    detail = await managed_voice(service, voice_id, request_principal(request))
    try:
        removed = await service.voices.remove_version(voice_id, version)
    except NoSuchVersion as exc:  # the voice was deleted meanwhile
        raise VoiceNotFound(voice_id) from exc
    if not removed:
        raise NoSuchVersion(f"voice {voice_id!r} has no version {version}")
    tenant = voice_tenant(detail.manifest)
    await record(request, "voice.version_deleted", tenant=tenant, voice=voice_id, version=version)
    return web.Response(status=204)


async def voice_detail(
    service: VoiceService, voice_id: str, principal: Principal | None
) -> VoiceDetail:
    manifest = await service.voices.manifest(voice_id)
    if manifest is None or not can_see(
        principal, voice_tenant(manifest), held=voice_status(manifest) == "held"
    ):
        raise VoiceNotFound(voice_id)
    builtin = service.voices.builtin.get(voice_id)
    if builtin is not None and not manifest:
        language = builtin.language
        return VoiceDetail(
            id=voice_id, name=builtin.name, kind="builtin", language=language, manifest={}
        )
    name = str(manifest.get("name") or voice_id)
    manageable = can_manage(principal, voice_tenant(manifest))
    visible = _visible_manifest(manifest, manageable)
    language = str(manifest.get("language") or service.voices.models.own.languages[0])
    return VoiceDetail(id=voice_id, name=name, kind="adapter", language=language, manifest=visible)


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
            language=v.language,
            status=v.status,
            aliases=sorted(named[v.voice_id]) if v.voice_id in named else None,
        )
        for v in usable
    ]
    voices += [
        VoiceInfo(
            id=b.voice_id,
            name=b.voice_id,
            kind="adapter",
            language=None,
            status="error",
            error=b.error,
        )
        for b in broken
    ]
    return voices


async def list_voices(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    principal = request_principal(request)
    voices = await voice_infos(service.voices, principal, service.settings.voice_aliases)
    return web.json_response(VoiceList(voices=voices).model_dump(exclude_none=True))


async def get_voice(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    voice = await voice_detail(service, path_id(request, "voice_id"), request_principal(request))
    return web.json_response({"voice": voice.model_dump()})


async def delete_voice(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    principal = request_principal(request)
    if principal is not None and not principal.admin:  # 404 for another tenant's
        tenant = voice_tenant((await voice_detail(service, voice_id, principal)).manifest)
        if not can_manage(principal, tenant) and voice_id not in service.voices.builtin:
            raise ReadOnlyVoice(f"voice {voice_id!r} is shared: admins only")
    owner = voice_tenant(await service.voices.manifest(voice_id) or {})  # for its audit event
    removed = await service.voices.remove(voice_id)
    if not removed:
        raise VoiceNotFound(voice_id)
    await record(request, "voice.deleted", tenant=owner, voice=voice_id)
    return web.Response(status=204)


async def publish_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices/{id}/publish``: its tenant or an admin makes a held voice ready anyway;
    why, by which key and when go into its ``voice.json`` as ``published``."""
    service = request.app[SERVICE]
    voice_id = path_id(request, "voice_id")
    body = await read_body(request, PublishRequest)
    principal = request_principal(request)
    # 404 for a voice it cannot see; a held voice is seen only by those who may manage it
    await voice_detail(service, voice_id, principal)
    published = {
        "reason": body.reason,
        "by": principal.key_id if principal is not None else None,
        "at": now_iso(),
    }
    voice = await service.voices.publish(voice_id, published, body.version)
    if voice is None:  # deleted meanwhile
        raise VoiceNotFound(voice_id)
    detail = await voice_detail(service, voice_id, principal)
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


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operations of the voice and version routes (their error answers: the error
    table's)."""
    listing = operation(
        "The voices that can be spoken, and adapters that failed validation",
        {
            "200": json_body(ref(VoiceList), "Every voice the caller may use."),
        },
        tag="voices",
    )
    versioned = wrapped("version", VersionInfo)
    return {
        "list_audio_voices": listing,
        "list_voices": {**listing, "summary": "The voices (same as GET /v1/audio/voices)"},
        "get_voice": operation(
            "A voice and its manifest",
            {
                "200": json_body(wrapped("voice", VoiceDetail), "The voice."),
            },
            tag="voices",
        ),
        "delete_voice": operation(
            "Remove an adapter voice: every version, and its consent records",
            {
                "204": {"description": "Removed."},
            },
            tag="voices",
        ),
        "publish_voice": operation(
            "Publish a held voice: make it ready anyway",
            {
                "200": json_body(wrapped("voice", VoiceDetail), "The voice, ready now."),
            },
            tag="voices",
            description="A clone that measured below the evaluation gate is held: listed "
            'with `status: "held"` and spoken only for its tenant and admins. Its tenant '
            "or an admin may publish it; the reason, the key and the time are recorded in "
            "its `voice.json` (`published`).",
            body={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": ref(PublishRequest),
                        "example": {"reason": "Listened to it: it sounds like her."},
                    }
                },
            },
        ),
        "list_versions": operation(
            "A voice's versions, oldest first, and which is live",
            {
                "200": json_body(ref(VersionList), "The versions."),
            },
            tag="voices",
        ),
        "promote_version": operation(
            "Make a version the live one (roll forward or back), at once everywhere",
            {
                "200": json_body(versioned, "The version, live now."),
            },
            tag="voices",
            description="The version it replaces stays servable when pinned (`voice@n`); "
            "streams in flight finish on the version they started with.",
        ),
        "delete_version": operation(
            "Remove a version (not the live one)",
            {
                "204": {"description": "Removed."},
            },
            tag="voices",
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = (
    (PublishRequest, "validation"),
    (VersionList, "serialization"),
    (VersionInfo, "serialization"),
    (VoiceList, "serialization"),
    (VoiceDetail, "serialization"),
)
