"""Who a request is and what it may do, at the HTTP edge: the API key a request presents, the
gateway's word for its caller, and the scope each route needs (keys themselves:
``voicehost.tenancy.keys``).

With no key configured the service runs open (no principal) and binds to localhost only. Workers
trust a request's forwarded principal only with the cluster's internal token
(``VOICEHOST_INTERNAL_TOKEN``), which the gateway sends after authenticating the client; the
worker-internal routes (``/internal/...``) accept nothing else.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal

from aiohttp import web
from pydantic import ValidationError

from voicehost.config import is_loopback_host
from voicehost.errors import ServiceError
from voicehost.tenancy.keys import (
    SPEECH_TOKEN,
    ApiKey,
    AuthConfigError,
    Principal,
    TokenStreams,
    hash_key,
    read_keys,
)
from voicehost.tenancy.tokens import InvalidToken, TokenSigner, is_token, token_secret

if TYPE_CHECKING:
    from voicehost.config import Settings

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
RATE_WINDOW_SECONDS = 60.0  # a key's requests_per_minute count over this window

INTERNAL_TOKEN_HEADER = "X-Voicehost-Internal-Token"
KEY_ID_HEADER = "X-Voicehost-Key-Id"
TENANT_HEADER = "X-Voicehost-Tenant"
SCOPES_HEADER = "X-Voicehost-Scopes"
STREAMS_HEADER = "X-Voicehost-Key-Streams"  # the key's own stream quota, when it has one
TOKEN_STREAMS_HEADER = "X-Voicehost-Token-Streams"  # "LIMIT TOKEN_ID": a token's stream count
FORWARDED_HEADERS = (KEY_ID_HEADER, TENANT_HEADER, SCOPES_HEADER)

# Who may call a route (declared with the route, in ``voicehost.api.routes``): anyone, only the
# cluster's gateway (the worker-internal routes, under INTERNAL_PREFIX), or a key holding one of
# a set of scopes (admin holds them all). A route the app does not know needs admin.
Access = frozenset[str] | Literal["public", "internal"]
PUBLIC: Access = "public"
INTERNAL: Access = "internal"
ADMIN: Access = frozenset({"admin"})
ROUTE_ACCESS = web.AppKey("route_access", dict[tuple[str, str], Access])
INTERNAL_PREFIX = "/internal/"
METRICS_ROUTE = "/metrics"  # open too while VOICEHOST_METRICS_PUBLIC is on
WS_ROUTE = "/v1/audio/speech/ws"  # browsers cannot set headers on a WebSocket: ?api_key= too


class Authenticator:
    """The keys and the internal token of one process, and how it reads a request's caller."""

    def __init__(
        self,
        keys: Iterable[ApiKey],
        internal_token: str | None,
        metrics_public: bool = True,
        secret: str | None = None,
    ) -> None:
        self.keys = list(keys)
        if internal_token is not None and len(internal_token) < MIN_TOKEN_CHARS:
            raise AuthConfigError(f"the internal token needs at least {MIN_TOKEN_CHARS} characters")
        self._token_hash = hash_key(internal_token).encode() if internal_token else None
        self.internal_token = internal_token
        self.metrics_public = metrics_public
        hashes = [entry.sha256 for entry in self.keys]
        self.tokens = TokenSigner(token_secret(secret, internal_token, hashes))
        self._rates = {e.id: e.requests_per_minute for e in self.keys if e.requests_per_minute}
        self._recent: dict[str, deque[float]] = {}  # each rate-limited key's requests, 60 s

    def rate_limited(self, key_id: str) -> bool:
        """Whether ``key_id`` has a ``requests_per_minute`` of its own."""
        return key_id in self._rates

    def over_rate(self, key_id: str, now: float | None = None) -> int | None:
        """Seconds until ``key_id`` may make another request, if its ``requests_per_minute``
        are spent in the last 60 s (this request counted otherwise); None if it may now."""
        limit = self._rates.get(key_id)
        if limit is None:
            return None
        now = time.monotonic() if now is None else now
        recent = self._recent.setdefault(key_id, deque())
        while recent and now - recent[0] >= RATE_WINDOW_SECONDS:
            recent.popleft()
        if len(recent) >= limit:
            return max(1, math.ceil(RATE_WINDOW_SECONDS - (now - recent[0])))
        recent.append(now)
        return None

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
        secret = settings.token_secret.get_secret_value() if settings.token_secret else None
        return cls(keys, token, settings.metrics_public, secret)

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
        return Principal(
            match.id, match.tenant, frozenset(match.scopes), max_streams=match.max_streams
        )

    def token_principal(self, credential: str, origin: str | None) -> Principal:
        """The caller a speech token speaks for: its key's id and tenant, the token's scope and
        voices; ``AccessDenied`` 401 for a token that is not valid, has expired or whose key is
        gone, 403 for one bound to another ``Origin`` than the request's."""
        try:
            token = self.tokens.read(credential)
        except InvalidToken as exc:
            raise AccessDenied(exc.code, exc.message) from exc
        key = next((entry for entry in self.keys if entry.id == token.key_id), None)
        if key is None:
            raise AccessDenied("invalid_token", "the token's API key is no longer valid")
        if token.origin is not None and origin != token.origin:
            message = f"this token speaks only for pages of {token.origin}"
            raise AccessDenied("origin_not_allowed", message)
        speaks = "synthesize" in key.scopes or "admin" in key.scopes
        voices = None if token.voices is None else frozenset(token.voices)
        scopes = frozenset({SPEECH_TOKEN} if speaks else ())
        bound = None
        if token.max_streams is not None:
            bound = TokenStreams(token.token_id, token.max_streams)
        return Principal(key.id, key.tenant, scopes, voices, key.max_streams, bound)

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
            if principal.max_streams is not None:
                headers[STREAMS_HEADER] = str(principal.max_streams)
            if (bound := principal.token_streams) is not None:
                headers[TOKEN_STREAMS_HEADER] = f"{bound.limit} {bound.token_id}"
        return headers


def forwarded_principal(headers: Mapping[str, str]) -> Principal | None:
    """The caller a gateway forwarded (only read once its token checked out); ``None`` when it
    forwarded none (an open gateway). ``ValueError`` if the headers are malformed."""
    if not any(name in headers for name in FORWARDED_HEADERS):
        return None
    try:
        streams = headers.get(STREAMS_HEADER)
        principal = _principal_of(
            headers[KEY_ID_HEADER],
            headers[TENANT_HEADER],
            headers[SCOPES_HEADER].split(),
            None if streams is None else int(streams),
        )
        if (bound := headers.get(TOKEN_STREAMS_HEADER)) is not None:
            limit, token_id = bound.split(" ")
            if int(limit) < 1 or not token_id:
                raise ValueError(f"a token bound to {bound!r}")
            streams_of = TokenStreams(token_id, int(limit))
            principal = dataclasses.replace(principal, token_streams=streams_of)
        return principal
    except (KeyError, ValueError, ValidationError) as exc:
        raise ValueError(f"malformed forwarded principal: {exc}") from exc


def _principal_of(
    key_id: str, tenant: str, scopes: list[str], max_streams: int | None = None
) -> Principal:
    if scopes == [SPEECH_TOKEN]:  # a speech token's caller: its scope is no key's
        entry = ApiKey(id=key_id, tenant=tenant, scopes=["synthesize"], sha256="0" * 64)
        granted = frozenset({SPEECH_TOKEN})
    else:
        entry = ApiKey(id=key_id, tenant=tenant, scopes=scopes, sha256="0" * 64)  # type: ignore[arg-type]
        granted = frozenset(entry.scopes)
    if max_streams is not None and max_streams < 1:
        raise ValueError(f"a stream quota of {max_streams}")
    return Principal(entry.id, entry.tenant, granted, max_streams=max_streams)


def presented_key(request: web.Request) -> str | None:
    """The API key of a request: ``Authorization: Bearer``, ``X-API-Key``, or on the WebSocket
    route only, ``?api_key=``. Two different ones are ``AccessDenied`` (400
    ``ambiguous_api_key``): which caller the request is must not depend on which place is read
    first (RFC 6750: one way per request), say a page's ``?api_key=`` beside a proxy's header."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    sent = [value.strip() if scheme.lower() == "bearer" else ""]
    sent.append(request.headers.get("X-API-Key", "").strip())
    if _route(request) == WS_ROUTE:
        sent.append(request.query.get("api_key", "").strip())
    keys = {key for key in sent if key}
    if len(keys) > 1:
        message = "different API keys were sent (Authorization, X-API-Key, ?api_key=): send one"
        raise AccessDenied("ambiguous_api_key", message)
    return keys.pop() if keys else None


def bind_host(host: str, auth_enabled: bool) -> str:
    """The address to bind: ``host``, unless auth is off and ``host`` is not loopback, then
    127.0.0.1. Says at start-up when auth is off."""
    if auth_enabled:
        return host
    loopback = is_loopback_host(host)
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


_REDACT_KEYS = RedactKeys()


def redact_access_log() -> None:
    """Install ``RedactKeys`` on aiohttp's access log (once per process; a server calls it)."""
    logging.getLogger("aiohttp.access").addFilter(_REDACT_KEYS)


AUTH = web.AppKey("auth", Authenticator)
PRINCIPAL = web.RequestKey("principal", object)  # Principal | None, set by the edge's middleware


class AccessDenied(ServiceError):
    """A caller the route does not admit: 401 (no key, a wrong one) or 403 (scope, internal),
    as the error table says of ``code``."""

    def __init__(self, code: str, message: str, principal: Principal | None = None) -> None:
        super().__init__(message, code=code)
        self.principal = principal  # a known key refused for its scope (audited)


def request_principal(request: web.Request) -> Principal | None:
    """The caller of a request; ``None`` when nothing restricts it (no keys configured)."""
    if PRINCIPAL not in request:
        raise RuntimeError("the auth middleware did not run for this request")
    principal = request[PRINCIPAL]
    assert principal is None or isinstance(principal, Principal)
    return principal


def _route(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def identify(auth: Authenticator, request: web.Request) -> Principal | None:
    """The caller of ``request`` (``None``: unrestricted); ``AccessDenied`` without a valid key,
    for a key without the route's scope, or for an internal route called by anyone but the
    gateway."""
    route = _route(request)
    method = "GET" if request.method == "HEAD" else request.method
    access = request.app[ROUTE_ACCESS].get((method, route or ""), ADMIN)
    if request.match_info.http_exception is not None:
        access = ADMIN  # no such route (404), or not with this method (405)
    if not auth.enabled or access == PUBLIC or (route == METRICS_ROUTE and auth.metrics_public):
        return None
    gateway = auth.is_gateway(request.headers.get(INTERNAL_TOKEN_HEADER))
    if access == INTERNAL:
        if not gateway:
            raise AccessDenied("forbidden", "internal routes accept only the cluster's gateway")
        return None
    if gateway:
        try:
            principal = forwarded_principal(request.headers)
        except ValueError as exc:
            raise AccessDenied("invalid_principal", str(exc)) from exc
    else:
        key = presented_key(request)
        if key is None:
            raise AccessDenied("missing_api_key", "send an API key: Authorization: Bearer <key>")
        if is_token(key):
            principal = auth.token_principal(key, request.headers.get("Origin"))
        else:
            principal = auth.authenticate(key)
            if principal is None:
                raise AccessDenied("invalid_api_key", "the API key is not valid")
    if principal is not None and request.match_info.http_exception is None:
        assert not isinstance(access, str)  # public and internal returned above
        if not principal.allows(access):
            if SPEECH_TOKEN in principal.scopes:
                message = "a speech token opens speech only (HTTP, SSE, the socket, WebRTC)"
                raise AccessDenied("token_not_allowed", message, principal)
            wanted = " or ".join(f"'{s}'" for s in sorted(access - {SPEECH_TOKEN}))
            message = f"this API key needs the {wanted} scope"
            raise AccessDenied("insufficient_scope", message, principal)
    return principal
