"""Ids that name folders on disk: voices and clone jobs.

Each has one strict pattern, checked whole (``fullmatch``: no trailing newline, no path
separators, dots, percent signs or non-ASCII letters), and ``child`` is the one way to turn an
id into a path under its root.
"""

from __future__ import annotations

import re
from pathlib import Path

VOICE_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
JOB_ID_PATTERN = re.compile(r"^job-[0-9a-f]{16}$")


def is_voice_id(value: object) -> bool:
    return isinstance(value, str) and VOICE_ID_PATTERN.fullmatch(value) is not None


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID_PATTERN.fullmatch(value) is not None


def child(root: Path, name: str) -> Path:
    """``root / name`` where ``name`` is one plain path component that stays under ``root``
    once resolved (symlinks too); raises ``ValueError`` otherwise."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a plain file name")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{name!r} leads outside {root}")
    return path
