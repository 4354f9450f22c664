"""The small values every layer stores and exchanges: ids, ``voice@n`` references, timestamps.

Voice and job ids name folders on disk: each has one strict pattern, checked whole
(``fullmatch``: no trailing newline, no path separators, dots, percent signs or non-ASCII
letters), and ``child`` is the one way to turn an id into a path under its root. A reference
``anna@3`` pins version 3 of a voice (``voice_ref`` writes one, ``split_voice_ref`` reads it).
Every timestamp written is ``now_iso``'s (UTC, ISO 8601, microseconds, ``+00:00``), and
``parse_iso`` reads one back; ``as_iso`` shows a stored one in ``now_iso``'s form, Unix seconds
(what jobs and lexicons stored before) included. ``checked_voice_id``, ``checked_job_id``
and ``checked_version`` raise ``InvalidId`` for what breaks a pattern.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from voicehost.errors import ServiceError

VOICE_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
JOB_ID_PATTERN = re.compile(r"^job-[0-9a-f]{16}$")
# A version of a voice: 1, 2, ... (``anna@3`` names version 3 of ``anna``).
VERSION_PATTERN = re.compile(r"^[1-9][0-9]{0,8}$")
VERSION_SEPARATOR = "@"


def is_voice_id(value: object) -> bool:
    return isinstance(value, str) and VOICE_ID_PATTERN.fullmatch(value) is not None


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID_PATTERN.fullmatch(value) is not None


def is_version(value: object) -> bool:
    return isinstance(value, str) and VERSION_PATTERN.fullmatch(value) is not None


class InvalidId(ServiceError, ValueError):
    """A voice id, job id or version number that breaks its pattern."""

    code = "invalid_voice_id"


def checked_voice_id(value: str, name: str = "voice_id") -> str:
    """``value`` if it is a voice id, else ``InvalidId`` naming the pattern (as ``name``)."""
    if not is_voice_id(value):
        raise InvalidId(f"{name} must match {VOICE_ID_PATTERN.pattern}")
    return value


def checked_job_id(value: str) -> str:
    if not is_job_id(value):
        raise InvalidId(f"job_id must match {JOB_ID_PATTERN.pattern}", code="invalid_job_id")
    return value


def checked_version(value: str) -> int:
    """A version number written as text (``"3"``), else ``InvalidId``."""
    if not is_version(value):
        message = f"version must match {VERSION_PATTERN.pattern}"
        raise InvalidId(message, code="invalid_version")
    return int(value)


def voice_ref(voice_id: str, version: int | None) -> str:
    """``("anna", 3)`` -> ``"anna@3"``; ``("anna", None)`` -> ``"anna"`` (the live version)."""
    return voice_id if version is None else f"{voice_id}{VERSION_SEPARATOR}{version}"


def split_voice_ref(ref: str) -> tuple[str, int | None]:
    """``"anna@3"`` -> ``("anna", 3)``; ``"anna"`` -> ``("anna", None)`` (the live version).
    A part after ``@`` that is not a version number is left in the id (which then fails the id
    pattern where it is checked)."""
    voice_id, separator, version = ref.rpartition(VERSION_SEPARATOR)
    if separator and is_version(version):
        return voice_id, int(version)
    return ref, None


def now_iso() -> str:
    """The time now as every record stores it: ``2026-12-01T14:03:11.123456+00:00``."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def parse_iso(value: str) -> datetime:
    """An ISO 8601 time (``now_iso``'s, or with ``Z``, or with no zone: read as UTC), as an
    aware datetime; raises ``ValueError`` for anything else."""
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def as_iso(value: str | float) -> str:
    """A stored timestamp in ``now_iso``'s form: an ISO 8601 time (as ``parse_iso`` reads it) or
    Unix seconds, a number or a number in a string (as records were written before ISO was the
    rule); raises ``ValueError`` for anything else."""
    try:
        moment = datetime.fromtimestamp(float(value), UTC)
    except (TypeError, ValueError):  # not a number: an ISO 8601 time
        moment = parse_iso(str(value))
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def child(root: Path, name: str) -> Path:
    """``root / name`` where ``name`` is one plain path component that stays under ``root``
    once resolved (symlinks too); raises ``ValueError`` otherwise."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a plain file name")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{name!r} leads outside {root}")
    return path
