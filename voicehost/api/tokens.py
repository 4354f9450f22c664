"""``POST /v1/tokens``: a short-lived speech token for a browser (``voicehost.tenancy.tokens``):
an app's backend mints one with its key and hands it to the page, which speaks with it on any
transport (a WebSocket takes it as ``?api_key=``) and reaches nothing else."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from voicehost.api.auth import AUTH, request_principal
from voicehost.api.edge import read_body
from voicehost.api.errors import ApiError
from voicehost.api.openapi import Json, Models, json_body, operation, ref
from voicehost.ids import checked_voice_id
from voicehost.tenancy.tokens import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_seconds: float = Field(
        DEFAULT_TTL_SECONDS, gt=0, le=MAX_TTL_SECONDS, description="How long it speaks."
    )
    voices: list[str] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="The voices it may speak (ids; default: any its key may).",
    )
    origin: str | None = Field(
        None,
        pattern=r"^https?://[^/\s?#]+$",
        max_length=256,
        description="The page origin it speaks for (`https://app.example`): a request with "
        "another `Origin` header, or none, is refused 403.",
    )
    max_streams: int | None = Field(
        None,
        ge=1,
        le=64,
        description="The streams it may hold at once, on any transport (beyond: 429 "
        "`quota_exceeded`); its key's quota holds too. Default: only its key's.",
    )


class TokenResponse(BaseModel):
    token: str
    expires_at: str = Field(description="When it stops speaking (ISO 8601, UTC).")
    ttl_seconds: float
    voices: list[str] | None
    origin: str | None
    max_streams: int | None


async def mint_token(request: web.Request) -> web.Response:
    """Mint a speech token for the calling key: 201 with it; 409 on a server without keys
    (there is nothing for a token to stand in for)."""
    principal = request_principal(request)
    if principal is None:
        raise ApiError("no_api_keys", "this server runs without API keys: speak without one")
    body = await read_body(request, TokenRequest)
    for voice in body.voices or ():
        checked_voice_id(voice, "voices")
    token, minted = request.app[AUTH].tokens.mint(
        principal.key_id, body.ttl_seconds, body.voices, body.origin, max_streams=body.max_streams
    )
    answer = TokenResponse(
        token=token,
        expires_at=datetime.fromtimestamp(minted.expires_at, UTC).isoformat(),
        ttl_seconds=body.ttl_seconds,
        voices=None if minted.voices is None else list(minted.voices),
        origin=minted.origin,
        max_streams=minted.max_streams,
    )
    return web.json_response(answer.model_dump(), status=201)


# --- its OpenAPI operation (voicehost.api.openapi builds the document from it) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operation of the token route (its error answers: the error table's)."""
    mint = operation(
        "Mint a short-lived speech token for a browser",
        {
            "201": json_body(ref(TokenResponse), "The token, and when it expires."),
        },
        tag="speech",
        description=(
            "A signed token that speaks for the calling key (which needs `synthesize`) on every "
            "speech transport (HTTP, SSE, the socket as `?api_key=`, WebRTC) and reaches no "
            "other route, for `ttl_seconds` (60 by default, at most 3600), optionally only "
            "`voices` and only with an `Origin` header of `origin`. Its streams count against "
            "the key's quota and usage; it dies with its key. An app's backend mints one and "
            "hands it to its page, so the key never reaches a browser."
        ),
        body={"required": True, "content": {"application/json": {"schema": ref(TokenRequest)}}},
    )
    return {"mint_token": mint}


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ((TokenRequest, "validation"), (TokenResponse, "serialization"))
