"""Short-lived speech tokens for browsers: a key holding ``synthesize`` mints one
(``POST /v1/tokens``) for a page to speak with, so the key itself never reaches the page.

A token is ``vht_<payload>.<signature>``: the payload (base64url JSON) names the minting key, its
expiry and what it is bound to (voices, an ``Origin``, a stream count); the signature is an
HMAC-SHA256 of it with the service's token secret, which every gateway and worker of a cluster
derives alike (from ``VOICEHOST_TOKEN_SECRET``, else the internal token, else the keys), so that any
of them verifies a token without Redis. A token speaks on every speech transport and reaches nothing
else; its streams count against its key's quota and usage (and, bound to a stream count, against its
own: the token's id names them in admission, as a key's id names a key's); it dies with its key (a
key no longer configured makes its tokens invalid) and at its expiry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from voicehost.errors import ServiceError

TOKEN_PREFIX = "vht_"
DEFAULT_TTL_SECONDS = 60.0  # long enough for a page to open its stream, short if it leaks
MAX_TTL_SECONDS = 3600.0


class InvalidToken(ServiceError, ValueError):
    """A token that is not one of this service's (``invalid_token``) or has expired
    (``token_expired``): a 401 either way."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True, slots=True)
class SpeechToken:
    key_id: str
    expires_at: float  # Unix seconds
    voices: tuple[str, ...] | None  # the voices it may speak; None: any its key may
    origin: str | None  # the Origin a browser must send with it; None: any
    max_streams: int | None = None  # the streams it may hold at once; None: its key's quota
    token_id: str = ""  # its nonce: what its own stream count is kept under


def is_token(credential: str) -> bool:
    return credential.startswith(TOKEN_PREFIX)


def token_secret(
    explicit: str | None, internal_token: str | None, key_hashes: Iterable[str]
) -> bytes:
    """The secret tokens are signed with: ``explicit`` (``VOICEHOST_TOKEN_SECRET``), else one
    derived from the cluster's internal token, else from the configured keys' hashes: the same
    in every front end and every gateway of a deployment, and never a key itself."""
    if explicit:
        material = "secret:" + explicit
    elif internal_token:
        material = "internal:" + internal_token
    else:
        material = "keys:" + ",".join(sorted(key_hashes))
    return hashlib.sha256(("voicehost speech tokens\n" + material).encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Mints and reads this service's speech tokens."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._secret, payload.encode(), hashlib.sha256).digest())

    def mint(
        self,
        key_id: str,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        voices: Iterable[str] | None = None,
        origin: str | None = None,
        now: float | None = None,
        max_streams: int | None = None,
    ) -> tuple[str, SpeechToken]:
        if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
            raise ValueError(f"a token lives more than 0 and at most {MAX_TTL_SECONDS:.0f} s")
        if max_streams is not None and max_streams < 1:
            raise ValueError(f"a token bound to {max_streams} streams")
        token = SpeechToken(
            key_id,
            round((time.time() if now is None else now) + ttl_seconds, 3),
            None if voices is None else tuple(sorted(set(voices))),
            origin,
            max_streams,
            secrets.token_urlsafe(12),
        )
        body: dict[str, object] = {"k": token.key_id, "e": token.expires_at, "n": token.token_id}
        if token.voices is not None:
            body["v"] = list(token.voices)
        if token.origin is not None:
            body["o"] = token.origin
        if token.max_streams is not None:
            body["s"] = token.max_streams
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{TOKEN_PREFIX}{payload}.{self._sign(payload)}", token

    def read(self, credential: str, now: float | None = None) -> SpeechToken:
        """The token ``credential`` is, checked: signed by this service and not expired."""
        payload, _, signature = credential.removeprefix(TOKEN_PREFIX).partition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            raise InvalidToken("invalid_token", "the token is not valid")
        try:
            body = json.loads(_unb64(payload))
            voices = body.get("v")
            token = SpeechToken(
                str(body["k"]),
                float(body["e"]),
                None if voices is None else tuple(str(v) for v in voices),
                None if body.get("o") is None else str(body["o"]),
                None if body.get("s") is None else int(body["s"]),
                str(body["n"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise InvalidToken("invalid_token", "the token is not valid") from exc
        if (time.time() if now is None else now) >= token.expires_at:
            raise InvalidToken("token_expired", "the token has expired: mint another")
        return token
