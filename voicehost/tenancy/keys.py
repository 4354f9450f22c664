"""API keys, the callers they name, and which tenant's voices and jobs a caller reaches.

A key is configured as an entry ``{"id", "tenant", "scopes", "sha256"}`` (``VOICEHOST_API_KEYS``
and/or the JSON list in ``VOICEHOST_API_KEYS_FILE``); only the SHA-256 of the key is stored. A key
maps to a ``Principal``: its id, its tenant and its scopes (``synthesize``, ``voices``, ``admin``;
``admin`` implies the others and sees every tenant). No HTTP here: ``voicehost.api.auth`` reads a
request's caller; the settings and the CLI use these types without loading a web framework.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Scope = Literal["synthesize", "voices", "admin"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # key ids and tenants travel in headers
KEY_PREFIX = "vh_"


class AuthConfigError(ValueError):
    """The key configuration cannot be used; the service must not start with it."""


class ApiKey(BaseModel):
    """One configured key: never the key itself, only its SHA-256 (see ``hash_key``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=NAME_PATTERN, description="Names the key (logs, quotas).")
    tenant: str = Field(pattern=NAME_PATTERN, description="Whose voices and jobs it reaches.")
    scopes: list[Scope] = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 (hex) of the key.")
    max_streams: int | None = Field(
        None,
        ge=1,
        description="Streams this key may hold at once, in place of VOICEHOST_KEY_MAX_STREAMS "
        "(a browser-facing key gets a small one).",
    )
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        description="Requests this key (and its tokens) may make in any 60 s, per serving "
        "process or gateway (429 rate_limited beyond). None: no limit.",
    )


# the scope of a speech token (voicehost.tenancy.tokens): the speech routes accept it, no other
# does; never a configured key's
SPEECH_TOKEN = "speech_token"


TOKEN_STREAMS_PREFIX = "token:"  # what a token's streams are counted under, before its id


@dataclass(frozen=True)
class TokenStreams:
    """A speech token bound to a stream count: at most ``limit`` of its streams at once, kept
    under its ``token_id`` as a key's are under the key's id (on top of its key's quota)."""

    token_id: str
    limit: int

    @property
    def admission_key(self) -> str:
        return TOKEN_STREAMS_PREFIX + self.token_id


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request: a key, or a speech token minted by one (its
    ``key_id`` and tenant, the ``SPEECH_TOKEN`` scope, and the ``voices`` it is bound to)."""

    key_id: str
    tenant: str
    scopes: frozenset[str]
    voices: frozenset[str] | None = None  # a token's: the voices it may speak (None: any)
    max_streams: int | None = None  # its key's own stream quota (None: the service's)
    token_streams: TokenStreams | None = None  # a token's own stream count, if bound to one

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    def allows(self, scopes: frozenset[str]) -> bool:
        """Whether the key holds one of ``scopes`` (admin holds them all)."""
        return self.admin or bool(self.scopes & scopes)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def can_see(principal: Principal | None, tenant: str | None, *, held: bool = False) -> bool:
    """Whether a voice or job of ``tenant`` exists for ``principal`` (``None`` tenant: shared;
    ``None`` principal: the service runs open, or the gateway spoke for an open gateway). A
    ``held`` voice (not yet published) exists only for those who may manage it: its tenant and
    admins (a shared held voice: admins only)."""
    if held:
        return can_manage(principal, tenant)
    return principal is None or tenant is None or principal.admin or principal.tenant == tenant


def can_manage(principal: Principal | None, tenant: str | None) -> bool:
    """Whether ``principal`` may delete or publish it: its own, or anything for an admin (or
    open mode)."""
    return (
        principal is None or principal.admin or (tenant is not None and principal.tenant == tenant)
    )


def owner_tenant(principal: Principal | None) -> str | None:
    """The tenant recorded on what ``principal`` creates (``None``: shared)."""
    return principal.tenant if principal is not None else None


def read_keys(
    keys: Iterable[ApiKey | Mapping[str, object]], keys_file: Path | None
) -> list[ApiKey]:
    """The configured keys: ``keys`` (``VOICEHOST_API_KEYS``' entries, checked here: the
    settings hold them as JSON objects) plus the JSON list in ``keys_file``."""
    try:
        found = [ApiKey.model_validate(entry) for entry in keys]
    except ValidationError as exc:
        raise AuthConfigError(f"VOICEHOST_API_KEYS: {exc}") from exc
    if keys_file is not None:
        try:
            data = json.loads(keys_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AuthConfigError(f"API keys file {keys_file}: {exc}") from exc
        if not isinstance(data, list):
            raise AuthConfigError(f"API keys file {keys_file}: must hold a JSON list of keys")
        try:
            found += [ApiKey.model_validate(entry) for entry in data]
        except ValidationError as exc:
            raise AuthConfigError(f"API keys file {keys_file}: {exc}") from exc
    for field in ("id", "sha256"):
        values = [getattr(k, field) for k in found]
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise AuthConfigError(f"API keys: duplicate {field} {', '.join(duplicates)}")
    return found
