"""``GET /v1/audit`` and ``GET /v1/usage``: the audit trail and the usage figures over HTTP, the
same on one server and at a gateway (each reads its service's trail and ledger). An admin (or a
server without keys) reads every tenant's; any other key only its own tenant's."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from voicehost.api.auth import request_principal
from voicehost.api.edge import SERVICE, query_value
from voicehost.api.errors import ApiError
from voicehost.api.openapi import Json, Models, json_body, operation, query_param, ref
from voicehost.ids import VOICE_ID_PATTERN, checked_voice_id, parse_iso
from voicehost.tenancy.audit import AuditQuery
from voicehost.tenancy.keys import Principal

# --- its wire models ---


class AuditActor(BaseModel):
    """Who made a change: an API key (``key``, with its tenant), the operator (the CLI, adapter
    folders), the service (a clone job's runner), or a caller of a server without keys."""

    kind: Literal["key", "operator", "service", "open"]
    key_id: str | None = None
    tenant: str | None = None
    runner: str | None = None


class AuditEvent(BaseModel):
    """One line of the audit log, as written (``voicehost.tenancy.audit``): ``prev`` is the SHA-256
    of the line before (the event before, as canonical JSON)."""

    seq: int = Field(ge=1)
    prev: str = Field(pattern=r"^[0-9a-f]{64}$")
    time: str = Field(description="UTC, ISO 8601.")
    action: str = Field(description="voice.created, voice.deleted, job.done, ...")
    actor: AuditActor
    request_id: str | None = None
    tenant: str | None = Field(None, description="Whose voice or job it is (none: shared).")
    voice: str | None = None
    version: int | None = None
    job: str | None = None
    details: dict[str, object] = Field(default_factory=dict, description="What changed.")


class AuditHead(BaseModel):
    """The log's last event: its seq and the SHA-256 of its line."""

    seq: int = Field(ge=0)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class AuditPage(BaseModel):
    """``GET /v1/audit``: events in order; ``next_after`` is set when more match (ask again
    with ``after`` = it). ``head`` (admins) is where the whole log ends."""

    events: list[AuditEvent]
    next_after: int | None = None
    head: AuditHead | None = None


class UsageRow(BaseModel):
    """What one API key spoke with one voice (key and tenant are null on a server without
    keys)."""

    key_id: str | None
    tenant: str | None
    voice: str
    characters: int = Field(ge=0)
    audio_seconds: float = Field(ge=0)


class UsageTotal(BaseModel):
    characters: int = Field(ge=0)
    audio_seconds: float = Field(ge=0)


class UsageReport(BaseModel):
    """``GET /v1/usage``: speech sent since ``since`` (to the minute), per key, tenant and
    voice, and in all."""

    since: str = Field(description="UTC, ISO 8601: the start of the first minute counted.")
    usage: list[UsageRow]
    total: UsageTotal


MAX_LIMIT = 1000


def parse_time(value: str, name: str = "since") -> datetime:
    """A time given as ISO 8601 (UTC when it names no zone) or as Unix seconds; 400 otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds) and 0 <= seconds < 1e11:
            return datetime.fromtimestamp(seconds, UTC)
        raise ApiError("invalid_request", f"{name}: Unix seconds out of range")
    try:
        return parse_iso(value)
    except ValueError:
        raise ApiError(
            "invalid_request", f"{name}: an ISO 8601 time or Unix seconds, not {value!r}"
        ) from None


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    value = query_value(request, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ApiError("invalid_request", f"{name}: an integer, not {value!r}") from None
    if not low <= number <= high:
        raise ApiError("invalid_request", f"{name}: from {low} to {high}")
    return number


def _reads_all(principal: Principal | None) -> bool:
    return principal is None or principal.admin


async def list_audit(request: web.Request) -> web.Response:
    """``GET /v1/audit?voice=&since=&after=&limit=``: events in order of their seq."""
    principal = request_principal(request)
    voice = query_value(request, "voice")
    if voice is not None and voice not in request.app[SERVICE].voices.builtin:
        checked_voice_id(voice, "voice")
    since = query_value(request, "since")
    query = AuditQuery(
        voice=voice,
        since=parse_time(since) if since is not None else None,
        after=_int(request, "after", 0, 0, 2**62),
        limit=_int(request, "limit", 100, 1, MAX_LIMIT),
        tenant=principal.tenant if principal is not None else None,
        all_tenants=_reads_all(principal),
    )
    page = await request.app[SERVICE].audit.read(query)
    body: dict[str, object] = {  # the events as written: each re-serializes to its line
        "events": page.events,
        "next_after": page.events[-1]["seq"] if page.more else None,
    }
    if _reads_all(principal):
        body["head"] = page.head.as_json()
    return web.json_response(body)


async def usage_report(request: web.Request) -> web.Response:
    """``GET /v1/usage?tenant=&since=``: characters and audio seconds sent, per key, tenant and
    voice, from the minute of ``since`` on (default: all that is kept)."""
    principal = request_principal(request)
    since_text = query_value(request, "since")
    since = parse_time(since_text) if since_text is not None else datetime.fromtimestamp(0, UTC)
    asked = query_value(request, "tenant")
    if _reads_all(principal):
        tenant = asked
    else:
        assert principal is not None
        tenant = principal.tenant  # a tenant's key reads its own tenant only
    totals = {}
    if asked is None or asked == tenant:
        totals = await request.app[SERVICE].usage.totals(since.timestamp(), tenant)
    rows = [
        {
            "key_id": key.key_id or None,
            "tenant": key.tenant or None,
            "voice": key.voice,
            "characters": amount.characters,
            "audio_seconds": round(amount.audio_seconds, 6),
        }
        for key, amount in sorted(totals.items())
    ]
    minute = since.replace(second=0, microsecond=0)
    return web.json_response(
        {
            "since": minute.isoformat(),
            "usage": rows,
            "total": {
                "characters": sum(a.characters for a in totals.values()),
                "audio_seconds": round(sum(a.audio_seconds for a in totals.values()), 6),
            },
        }
    )


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    since = query_param(
        "since",
        "From this time on: ISO 8601 (UTC unless it names a zone) or Unix seconds.",
        {"type": "string"},
    )
    return {
        "list_audit": operation(
            "The audit trail: every change to voices and jobs, and scope refusals",
            {
                "200": json_body(ref(AuditPage), "Events in order."),
            },
            tag="audit",
            description="Admins read every event (and the log's `head`); a tenant's key "
            "(`voices` scope) only the events of its tenant's voices and jobs. Each event "
            "carries the SHA-256 of the one before it (`prev`); `voicehost audit verify` "
            "checks the chain.",
            parameters=[
                query_param(
                    "voice",
                    "Only this voice's events (empty: every voice's).",
                    # a voice id, or empty: an empty query value means unset
                    {"type": "string", "pattern": "^(" + VOICE_ID_PATTERN.pattern[1:-1] + ")?$"},
                ),
                since,
                query_param(
                    "after",
                    "Only events after this seq (paging: the answer's `next_after`).",
                    {"type": "integer", "minimum": 0},
                ),
                query_param(
                    "limit",
                    "At most this many events (default 100).",
                    {"type": "integer", "minimum": 1, "maximum": 1000},
                ),
            ],
        ),
        "usage_report": operation(
            "Characters and audio seconds sent, per API key, tenant and voice",
            {
                "200": json_body(ref(UsageReport), "The sums."),
            },
            tag="usage",
            description="Counted as audio is sent (a stream cancelled half-way counts what "
            "was sent), summed per minute over every worker of a cluster. Admins read "
            "every tenant's (or `tenant`'s); any other key its own tenant's.",
            parameters=[
                query_param("tenant", "Only this tenant (admins).", {"type": "string"}),
                since,
            ],
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ((AuditPage, "serialization"), (UsageReport, "serialization"))
