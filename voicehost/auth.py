"""Who a request is and what it may do: API keys, tenants, scopes, and the gateway's word.

A key is configured as an entry ``{"id", "tenant", "scopes", "sha256"}`` (``VOICEHOST_API_KEYS``
and/or the JSON list in ``VOICEHOST_API_KEYS_FILE``); only the SHA-256 of the key is stored, and a
presented key is hashed and compared with every entry in constant time. A key maps to a
``Principal``: its id, its tenant and its scopes (``synthesize``, ``voices``, ``admin``; ``admin``
implies the others and sees every tenant). With no key configured the service runs open (no
principal) and binds to localhost only.

Workers trust a request's forwarded principal only with the cluster's internal token
(``VOICEHOST_INTERNAL_TOKEN``), which the gateway sends after authenticating the client; the
worker-internal routes (``/internal/...``) accept nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voicehost.api.schemas import ErrorDetail, ErrorResponse

if TYPE_CHECKING:
    from voicehost.config import Settings

log = logging.getLogger(__name__)

Scope = Literal["synthesize", "voices", "admin"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # key ids and tenants travel in headers
KEY_PREFIX = "vh_"
MIN_TOKEN_CHARS = 16

INTERNAL_TOKEN_HEADER = "X-Voicehost-Internal-Token"
KEY_ID_HEADER = "X-Voicehost-Key-Id"
TENANT_HEADER = "X-Voicehost-Tenant"
SCOPES_HEADER = "X-Voicehost-Scopes"
FORWARDED_HEADERS = (KEY_ID_HEADER, TENANT_HEADER, SCOPES_HEADER)

PUBLIC_ROUTES = frozenset({"/healthz", "/readyz", "/openapi.json"})
INTERNAL_PREFIX = "/internal/"
WS_ROUTE = "/v1/audio/speech/ws"  # browsers cannot set headers on a WebSocket: ?api_key= too
# (method, route) -> the scopes of which a key needs one; every other route needs admin.
ROUTE_SCOPES: dict[tuple[str, str], frozenset[str]] = {
    ("POST", "/v1/audio/speech"): frozenset({"synthesize"}),
    ("GET", WS_ROUTE): frozenset({"synthesize"}),
    ("GET", "/v1/audio/voices"): frozenset({"synthesize", "voices"}),
    ("GET", "/v1/voices"): frozenset({"synthesize", "voices"}),
    ("POST", "/v1/voices"): frozenset({"voices"}),
    ("GET", "/v1/voices/{voice_id}"): frozenset({"voices"}),
    ("DELETE", "/v1/voices/{voice_id}"): frozenset({"voices"}),
    ("GET", "/v1/jobs/{job_id}"): frozenset({"voices"}),
    ("DELETE", "/v1/jobs/{job_id}"): frozenset({"voices"}),
    ("POST", "/v1/jobs/{job_id}/retry"): frozenset({"voices"}),
}
ADMIN_ONLY = frozenset({"admin"})


class AuthConfigError(ValueError):
    """The key configuration cannot be used; the service must not start with it."""


class ApiKey(BaseModel):
    """One configured key: never the key itself, only its SHA-256 (see ``hash_key``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=NAME_PATTERN, description="Names the key (logs, quotas).")
    tenant: str = Field(pattern=NAME_PATTERN, description="Whose voices and jobs it reaches.")
    scopes: list[Scope] = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 (hex) of the key.")


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request."""

    key_id: str
    tenant: str
    scopes: frozenset[str]

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


def can_see(principal: Principal | None, tenant: str | None) -> bool:
    """Whether a voice or job of ``tenant`` exists for ``principal`` (``None`` tenant: shared;
    ``None`` principal: the service runs open, or the gateway spoke for an open gateway)."""
    return principal is None or tenant is None or principal.admin or principal.tenant == tenant


def can_manage(principal: Principal | None, tenant: str | None) -> bool:
    """Whether ``principal`` may delete it: its own, or anything for an admin (or open mode)."""
    return (
        principal is None or principal.admin or (tenant is not None and principal.tenant == tenant)
    )


def owner_tenant(principal: Principal | None) -> str | None:
    """The tenant recorded on what ``principal`` creates (``None``: shared)."""
    return principal.tenant if principal is not None else None


def read_keys(keys: Iterable[ApiKey], keys_file: Path | None) -> list[ApiKey]:
    """The configured keys: ``keys`` plus the JSON list in ``keys_file``."""
    found = list(keys)
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


class Authenticator:
    """The keys and the internal token of one process, and how it reads a request's caller."""

    def __init__(
        self, keys: Iterable[ApiKey], internal_token: str | None, metrics_public: bool = True
    ) -> None:
        self.keys = list(keys)
        if internal_token is not None and len(internal_token) < MIN_TOKEN_CHARS:
            raise AuthConfigError(f"the internal token needs at least {MIN_TOKEN_CHARS} characters")
        self._token_hash = hash_key(internal_token).encode() if internal_token else None
        self.internal_token = internal_token
        self.metrics_public = metrics_public

    @classmethod
    def from_settings(
        cls, settings: Settings, role: Literal["serve", "worker", "gateway"] = "serve"
    ) -> Authenticator:
        keys = read_keys(settings.api_keys, settings.api_keys_file)
        token = settings.internal_token.get_secret_value() if settings.internal_token else None
        if keys and token is None and role != "serve":
            raise AuthConfigError(
                f"a {role} with API keys needs VOICEHOST_INTERNAL_TOKEN (the same on gateways and "
                "workers): gateways vouch for their clients with it, and drains use it"
            )
        return cls(keys, token, settings.metrics_public)

    @property
    def enabled(self) -> bool:
        """Whether requests must say who they are (a key, or the gateway's token)."""
        return bool(self.keys) or self._token_hash is not None

    def authenticate(self, key: str) -> Principal | None:
        """The principal of a presented key, or ``None``; every entry is compared, in constant
        time, so the time taken says nothing about which keys exist."""
        digest = hash_key(key).encode()
        match = None
        for entry in self.keys:
            if hmac.compare_digest(digest, entry.sha256.encode()):
                match = entry
        if match is None:
            return None
        return Principal(match.id, match.tenant, frozenset(match.scopes))

    def is_gateway(self, token: str | None) -> bool:
        """Whether ``token`` is the cluster's internal token."""
        if token is None or self._token_hash is None:
            return False
        return hmac.compare_digest(hash_key(token).encode(), self._token_hash)

    def forward_headers(self, principal: Principal | None) -> dict[str, str]:
        """What a gateway adds to a request it forwards to a worker: its token and the caller."""
        headers = {}
        if self.internal_token is not None:
            headers[INTERNAL_TOKEN_HEADER] = self.internal_token
        if principal is not None:
            headers[KEY_ID_HEADER] = principal.key_id
            headers[TENANT_HEADER] = principal.tenant
            headers[SCOPES_HEADER] = " ".join(sorted(principal.scopes))
        return headers


def forwarded_principal(headers: Mapping[str, str]) -> Principal | None:
    """The caller a gateway forwarded (only read once its token checked out); ``None`` when it
    forwarded none (an open gateway). ``ValueError`` if the headers are malformed."""
    if not any(name in headers for name in FORWARDED_HEADERS):
        return None
    try:
        return _principal_of(
            headers[KEY_ID_HEADER], headers[TENANT_HEADER], headers[SCOPES_HEADER].split()
        )
    except (KeyError, ValidationError) as exc:
        raise ValueError(f"malformed forwarded principal: {exc}") from exc


def _principal_of(key_id: str, tenant: str, scopes: list[str]) -> Principal:
    entry = ApiKey(id=key_id, tenant=tenant, scopes=scopes, sha256="0" * 64)  # type: ignore[arg-type]
    return Principal(entry.id, entry.tenant, frozenset(entry.scopes))


def presented_key(request: web.Request) -> str | None:
    """The API key of a request: ``Authorization: Bearer``, ``X-API-Key``, or on the WebSocket
    route only, ``?api_key=``."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if key := request.headers.get("X-API-Key", "").strip():
        return key
    if _route(request) == WS_ROUTE and (key := request.query.get("api_key", "").strip()):
        return key
    return None


def bind_host(host: str, auth_enabled: bool) -> str:
    """The address to bind: ``host``, unless auth is off and ``host`` is not loopback, then
    127.0.0.1. Says at start-up when auth is off."""
    if auth_enabled:
        return host
    loopback = _is_loopback(host)
    log.warning(
        "authentication is OFF: no API keys are configured (VOICEHOST_API_KEYS or "
        "VOICEHOST_API_KEYS_FILE); %s",
        f"serving on {host} only"
        if loopback
        else f"binding 127.0.0.1 instead of {host} so that only this machine can reach it",
    )
    return host if loopback else "127.0.0.1"


class RedactKeys(logging.Filter):
    """Hides ``?api_key=`` values in access log lines (the WebSocket's key in the URL)."""

    PATTERN = re.compile(r"([?&]api_key=)[^&\s]*")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "api_key=" in message:
            record.msg, record.args = self.PATTERN.sub(r"\1<redacted>", message), ()
        return True


logging.getLogger("aiohttp.access").addFilter(RedactKeys())  # every server of this process


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --- aiohttp -----------------------------------------------------------------------------------

AUTH = web.AppKey("auth", Authenticator)
PRINCIPAL = web.RequestKey("principal", object)  # Principal | None, set by ``auth_middleware``
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_principal(request: web.Request) -> Principal | None:
    """The caller of a request; ``None`` when nothing restricts it (no keys configured)."""
    if PRINCIPAL not in request:
        raise RuntimeError("auth_middleware did not run for this request")
    principal = request[PRINCIPAL]
    assert principal is None or isinstance(principal, Principal)
    return principal


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def _deny(status: int, code: str, message: str) -> web.Response:
    body = ErrorResponse(error=ErrorDetail(code=code, message=message))
    response = web.json_response(body.model_dump(), status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="voicehost"'
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 without a valid key, 403 for a key without the route's scope or an internal route
    called by anyone but the gateway; sets the request's principal."""
    auth = request.app[AUTH]
    route = _route(request)
    if not auth.enabled or route in PUBLIC_ROUTES or (route == "/metrics" and auth.metrics_public):
        request[PRINCIPAL] = None
        return await handler(request)
    gateway = auth.is_gateway(request.headers.get(INTERNAL_TOKEN_HEADER))
    if route is not None and route.startswith(INTERNAL_PREFIX):
        if not gateway:
            return _deny(403, "forbidden", "internal routes accept only the cluster's gateway")
        request[PRINCIPAL] = None
        return await handler(request)
    if gateway:
        try:
            principal = forwarded_principal(request.headers)
        except ValueError as exc:
            return _deny(401, "invalid_principal", str(exc))
    else:
        key = presented_key(request)
        if key is None:
            return _deny(401, "missing_api_key", "send an API key: Authorization: Bearer <key>")
        principal = auth.authenticate(key)
        if principal is None:
            return _deny(401, "invalid_api_key", "the API key is not valid")
    if principal is not None and request.match_info.http_exception is None:
        method = "GET" if request.method == "HEAD" else request.method
        needed = ROUTE_SCOPES.get((method, route or ""), ADMIN_ONLY)
        if not principal.allows(needed):
            wanted = " or ".join(f"'{s}'" for s in sorted(needed))
            return _deny(403, "insufficient_scope", f"this API key needs the {wanted} scope")
    request[PRINCIPAL] = principal
    return await handler(request)
