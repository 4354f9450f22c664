"""The service's own errors, each named by a ``code``: what went wrong, in the caller's terms.

A layer raises its errors where it finds them (the voice directory a ``voice_exists``, the
training pipeline a ``not_enough_speech``, admission an ``at_capacity``) and knows nothing of
HTTP. The API's one error table (``voicehost.api.errors``) gives each code its status, whether
``Retry-After`` goes with it, its OpenAPI text and the operations that answer it; the API's
error middleware applies it to any ``ServiceError`` a handler lets through, so a handler never
catches one to re-raise it as another.

A subclass names its code once, as a class attribute; an error whose code depends on what was
found (a file refused as too long, unsupported or unreadable) passes it to ``__init__``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import ValidationError


class ServiceError(Exception):
    """An error the service answers as ``{"error": {"code", "message"}}``; the message is the
    exception's text."""

    code: ClassVar[str] = ""

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code  # type: ignore[misc]  # an instance's own code
        if not self.code:
            raise TypeError(f"{type(self).__name__} names no error code")

    @property
    def message(self) -> str:
        return str(self)


def validation_message(exc: ValidationError, whole: str = "body") -> str:
    """Every problem pydantic found, ``field.path: message`` joined by ``; ``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in exc.errors()
    )
