"""Pronunciation lexicons over HTTP: a tenant's named lexicons (``PUT``/``GET``/``DELETE
/v1/lexicons/{name}``, ``GET /v1/lexicons``), and the lexicon a speech request is spoken with.

Every front end answers the routes over its ``LexiconStore`` (a gateway over the cluster's);
the process that speaks applies the lexicon (a worker, never a gateway), before it cuts the text
into segments, so HTTP, the realtime socket and a gateway say the same.
"""

from __future__ import annotations

import functools
import logging

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    VoiceService,
    json_object,
    validated,
)
from voicehost.api.openapi import Json, Models, json_body, operation, ref, wrapped
from voicehost.model.languages import DEFAULT_LANGUAGE, same_language
from voicehost.tenancy.keys import Principal, owner_tenant
from voicehost.tenancy.lexicons import (
    LexiconError,
    LexiconNotFound,
    LexiconTooLarge,
    StoredLexicon,
    checked_entries,
    checked_language,
    checked_name,
    is_lexicon_name,
    parse_pls,
    pls_language,
)
from voicehost.text.lexicon import Lexicon, LexiconEntry
from voicehost.voices.voice import Voice

# --- its wire models ---


class PronunciationEntry(BaseModel):
    """Say ``alias`` where ``grapheme`` is written: whole words only, longest match first."""

    model_config = ConfigDict(extra="forbid")

    grapheme: StrictStr = Field(min_length=1, description="A word or phrase, as written.")
    alias: StrictStr = Field(min_length=1, description="What to say instead.")
    case_sensitive: StrictBool = Field(
        False, description="Match it only as written (else in any case)."
    )


class LexiconUpload(BaseModel):
    """``PUT /v1/lexicons/{name}`` as JSON (a W3C PLS document is the other way to send it)."""

    model_config = ConfigDict(extra="ignore")

    language: StrictStr = Field(
        DEFAULT_LANGUAGE,
        description="The language of the voices it applies to (BCP-47; a PLS document's "
        "`xml:lang`).",
    )
    entries: list[PronunciationEntry]


class LexiconInfo(BaseModel):
    name: str
    language: str = Field(description="The language of the voices it applies to (BCP-47).")
    entries: int = Field(description="How many entries it holds.")
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")


class LexiconSaved(BaseModel):
    """What a put stored: the lexicon, and the PLS lexemes left out (a ``<phoneme>`` but no
    ``<alias>``: this model reads text)."""

    lexicon: LexiconInfo
    skipped: int = 0


class LexiconList(BaseModel):
    lexicons: list[LexiconInfo]


class LexiconDetail(BaseModel):
    name: str
    language: str = Field(description="The language of the voices it applies to (BCP-47).")
    entries: list[PronunciationEntry]
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")


log = logging.getLogger(__name__)

PLS_TYPES = frozenset({"application/pls+xml", "application/xml", "text/xml"})
MANIFEST_KEY = "lexicon"  # a voice's default lexicon, named in its voice.json


def _name(request: web.Request) -> str:
    return checked_name(request.match_info["name"])


def _info(lexicon: StoredLexicon) -> LexiconInfo:
    return LexiconInfo(
        name=lexicon.name,
        language=lexicon.language,
        entries=len(lexicon.entries),
        updated=lexicon.updated,
    )


def _entries(
    service: VoiceService, request: web.Request, body: bytes
) -> tuple[list[LexiconEntry], int, str]:
    """The uploaded entries, checked, the PLS lexemes left out, and the language of the voices
    they apply to (``language``; a PLS document's ``xml:lang``; else English): PLS by its
    content type (or, with none of them, a body that starts with ``<``), JSON otherwise."""
    limits = service.lexicons.limits
    pls = request.content_type in PLS_TYPES or (
        request.content_type != "application/json" and body.lstrip()[:1] == b"<"
    )
    if pls:
        entries, skipped = parse_pls(body, limits)
        return entries, skipped, checked_language(pls_language(body) or DEFAULT_LANGUAGE)
    payload = json_object(body)
    entries = payload.get("entries")
    if isinstance(entries, list) and len(entries) > limits.max_entries:  # before reading each
        raise LexiconTooLarge(f"a lexicon holds at most {limits.max_entries} entries")
    upload = validated(LexiconUpload, payload)
    found = (LexiconEntry(e.grapheme, e.alias, e.case_sensitive) for e in upload.entries)
    return checked_entries(found, limits), 0, checked_language(upload.language)


async def put_lexicon(request: web.Request) -> web.Response:
    """``PUT /v1/lexicons/{name}``: store the caller's lexicon (201 new, 200 replaced)."""
    service = request.app[SERVICE]
    name = _name(request)
    entries, skipped, language = _entries(service, request, await request.read())
    tenant = owner_tenant(request_principal(request))
    new = await service.lexicons.put(tenant, name, entries, language)
    stored = await service.lexicons.get(tenant, name)
    if stored is None:  # deleted meanwhile
        raise LexiconNotFound(name)
    saved = LexiconSaved(lexicon=_info(stored), skipped=skipped)
    headers = {"Location": f"/v1/lexicons/{name}"} if new else None
    return web.json_response(saved.model_dump(), status=201 if new else 200, headers=headers)


async def get_lexicon(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = _name(request)
    stored = await service.lexicons.get(owner_tenant(request_principal(request)), name)
    if stored is None:
        raise LexiconNotFound(name)
    entries = [
        PronunciationEntry(grapheme=e.grapheme, alias=e.alias, case_sensitive=e.case_sensitive)
        for e in stored.entries
    ]
    detail = LexiconDetail(
        name=stored.name, language=stored.language, entries=entries, updated=stored.updated
    )
    return web.json_response({"lexicon": detail.model_dump()})


async def delete_lexicon(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = _name(request)
    if not await service.lexicons.delete(owner_tenant(request_principal(request)), name):
        raise LexiconNotFound(name)
    return web.Response(status=204)


async def list_lexicons(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    found = await service.lexicons.list(owner_tenant(request_principal(request)))
    return web.json_response(LexiconList(lexicons=[_info(x) for x in found]).model_dump())


# --- the lexicon a request is spoken with ------------------------------------------------------


_missing_defaults: set[tuple[str, str]] = set()  # (voice, lexicon) already logged


async def speech_lexicon(
    service: VoiceService, names: list[str], voice: Voice, principal: Principal | None
) -> Lexicon:
    """The caller's ``names``, in order, then the voice's default (``"lexicon"`` in its
    ``voice.json``, one of the voice's tenant's; a shared voice's: a shared one), merged: 404
    ``lexicon_not_found`` for a named one that does not exist, 400
    ``lexicon_language_mismatch`` for one of another language than the voice's. A default that
    does not exist or is of another language is left out (logged once): the voice still
    speaks."""
    tenant = owner_tenant(principal)
    found: list[StoredLexicon] = []
    for name in dict.fromkeys(names):
        stored = await service.lexicons.get(tenant, name)
        if stored is None:
            raise LexiconNotFound(name)
        if not same_language(stored.language, voice.language):
            message = (
                f"lexicon {name!r} is for {stored.language} voices; {voice.voice_id!r} "
                f"speaks {voice.language}"
            )
            raise LexiconError(message, code="lexicon_language_mismatch")
        found.append(stored)
    manifest = await service.voices.manifest(voice.voice_id) or {}
    default = manifest.get(MANIFEST_KEY)
    if is_lexicon_name(default):
        stored = await service.lexicons.get(voice.tenant, default)
        if stored is not None and same_language(stored.language, voice.language):
            found.append(stored)
        elif (voice.voice_id, default) not in _missing_defaults:
            _missing_defaults.add((voice.voice_id, default))
            why = "does not exist" if stored is None else f"is for {stored.language} voices"
            log.warning("voice %s names lexicon %r, which %s", voice.voice_id, default, why)
    return _merged(tuple(found))


@functools.lru_cache(maxsize=64)
def _merged(lexicons: tuple[StoredLexicon, ...]) -> Lexicon:
    return Lexicon.merged([lexicon.entries for lexicon in lexicons])


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    saved = json_body(ref(LexiconSaved), "Stored.")
    upload = {
        "required": True,
        "content": {
            "application/json": {
                "schema": ref(LexiconUpload),
                "example": {"entries": [{"grapheme": "Kubernetes", "alias": "koo ber net ees"}]},
            },
            "application/pls+xml": {
                "schema": {
                    "type": "string",
                    "description": "A W3C PLS 1.0 document: each `<lexeme>`'s `<grapheme>`s "
                    "say its first `<alias>` (matched as written); lexemes with only "
                    "`<phoneme>`s are skipped. No DTD, entities or external references.",
                }
            },
        },
    }
    location = {"Location": {"description": "The lexicon's URL.", "schema": {"type": "string"}}}
    return {
        "list_lexicons": operation(
            "The caller's tenant's pronunciation lexicons",
            {
                "200": json_body(ref(LexiconList), "Each lexicon."),
            },
            tag="lexicons",
        ),
        "put_lexicon": operation(
            "Store a pronunciation lexicon (JSON or W3C PLS), replacing one of that name",
            {
                "200": saved,
                "201": {**json_body(ref(LexiconSaved), "Stored, new."), "headers": location},
            },
            tag="lexicons",
            body=upload,
        ),
        "get_lexicon": operation(
            "A lexicon and its entries",
            {
                "200": json_body(wrapped("lexicon", LexiconDetail), "The lexicon."),
            },
            tag="lexicons",
        ),
        "delete_lexicon": operation(
            "Delete a lexicon",
            {
                "204": {"description": "Deleted."},
            },
            tag="lexicons",
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = (
    (LexiconUpload, "validation"),
    (LexiconSaved, "serialization"),
    (LexiconList, "serialization"),
    (LexiconDetail, "serialization"),
)
