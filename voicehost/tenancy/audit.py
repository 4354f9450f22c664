"""The audit trail: every change to a voice or a clone job (and every scope refusal) as one
event, in an append-only log where each line carries the SHA-256 of the line before it.

An event is one line of canonical JSON (sorted keys, no spaces): ``seq`` (1, 2, ...), ``prev``
(the SHA-256 of the previous line, 64 zeros for the first), ``time`` (UTC, ISO 8601), ``action``
(``ACTIONS``), ``actor`` (an API key and its tenant, or the operator, or the service itself),
``request_id``, ``tenant`` (whose voice or job it is: who may read the event), ``voice``,
``version``, ``job`` and ``details`` (what changed). Editing a line changes its hash, so the next
line's ``prev`` no longer matches; removing one breaks ``seq`` and ``prev`` alike; ``verify``
says at which line. (The last line has no successor: ``verify`` compares it with the head the
writer keeps, when it is given one.)

One server keeps the log in a JSONL file (``AuditLog``: appends under a file lock, so the server
and the CLI can both write it); a cluster appends through Redis and mirrors every event to a file
of the same format on the shared store (``voicehost.cluster.audit``). ``FileAuditTrail`` is one
server's ``AuditTrail``.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from voicehost.ids import now_iso, parse_iso

if TYPE_CHECKING:
    from prometheus_client import Counter

    from voicehost.tenancy.keys import Principal

log = logging.getLogger(__name__)

GENESIS = "0" * 64  # the ``prev`` of the first line
Action = Literal[
    "voice.created",
    "voice.version_added",
    "voice.promoted",
    "voice.held",
    "voice.published",
    "voice.deleted",
    "voice.consent_recorded",
    "job.created",
    "job.cancelled",
    "job.retried",
    "job.deleted",
    "job.done",
    "job.held",
    "job.failed",
    "auth.scope_refused",
]
ACTIONS: tuple[str, ...] = get_args(Action)
MAX_PENDING = 10_000  # events kept in memory while the log cannot be written
TAIL_BYTES = 1 << 16  # read from the end of the file to find its last line


@dataclass(frozen=True, slots=True)
class Actor:
    """Who made a change: an API key (``key``), the operator (CLI, adapter folders), the service
    itself (a clone job's runner), or a caller of a server without keys (``open``)."""

    kind: Literal["key", "operator", "service", "open"]
    key_id: str | None = None
    tenant: str | None = None
    runner: str | None = None

    def as_json(self) -> dict[str, str]:
        fields = {"key_id": self.key_id, "tenant": self.tenant, "runner": self.runner}
        return {"kind": self.kind, **{k: v for k, v in fields.items() if v is not None}}


OPERATOR = Actor("operator")


def actor_of(principal: Principal | None) -> Actor:
    """The actor of a request made by ``principal`` (``None``: no keys configured)."""
    if principal is None:
        return Actor("open")
    return Actor("key", principal.key_id, principal.tenant)


def service_actor(runner: str) -> Actor:
    return Actor("service", runner=runner)


@dataclass(frozen=True, slots=True)
class Change:
    """What happened, before the log numbers and chains it."""

    action: Action
    actor: Actor
    tenant: str | None = None  # whose voice or job (None: shared, admins read it)
    voice: str | None = None
    version: int | None = None
    job: str | None = None
    request_id: str | None = None
    details: dict[str, object] = field(default_factory=dict)
    time: str = field(default_factory=now_iso)

    def event(self, seq: int, prev: str) -> dict[str, object]:
        """The event this change is as line ``seq`` after a line hashing to ``prev``."""
        return {
            "seq": seq,
            "prev": prev,
            "time": self.time,
            "action": self.action,
            "actor": self.actor.as_json(),
            "request_id": self.request_id,
            "tenant": self.tenant,
            "voice": self.voice,
            "version": self.version,
            "job": self.job,
            "details": self.details,
        }


def canonical(event: dict[str, object]) -> str:
    """The one text of an event: its line in the log, and what its successor hashes."""
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def line_hash(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Head:
    """The end of a chain: the last line's ``seq`` and SHA-256 (0 and ``GENESIS`` when empty)."""

    seq: int = 0
    hash: str = GENESIS

    def as_json(self) -> dict[str, object]:
        return {"seq": self.seq, "hash": self.hash}


def head_of(line: str) -> Head:
    return Head(int(json.loads(line)["seq"]), line_hash(line))


class ChainBroken(ValueError):
    """The chain an append would continue is not whole: its last line is not an event, or
    the lines to add do not continue it (``voicehost audit verify`` says where)."""


# --- verification ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verification:
    """What ``verify`` found: the lines it checked, the head they end in, and the first line
    (1-based) where the chain breaks, with why (``None``: whole)."""

    lines: int
    head: Head
    broken_at: int | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.broken_at is None


def verify(lines: Iterable[str], expected_head: Head | None = None) -> Verification:
    """Check a log's lines in order: each is an event whose ``seq`` follows the line before
    and whose ``prev`` is that line's SHA-256; with ``expected_head`` (the writer's), the last
    line must be it (an edited or removed last line has no successor to catch it)."""
    head = Head()
    count = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        count = number
        try:
            event = json.loads(line)
            seq, prev = event["seq"], event["prev"]
        except (ValueError, TypeError, KeyError):
            return Verification(number - 1, head, number, "not an event (JSON with seq and prev)")
        if prev != head.hash:
            what = "the first line" if number == 1 else f"line {number - 1}"
            return Verification(
                number - 1,
                head,
                number,
                f"prev is not the SHA-256 of {what}: it was edited, or lines were removed",
            )
        if seq != head.seq + 1:
            return Verification(
                number - 1, head, number, f"seq {seq} does not follow {head.seq}: a line is missing"
            )
        head = Head(seq, line_hash(line))
    if expected_head is not None and head != expected_head:
        return Verification(
            count,
            head,
            count + (head.seq < expected_head.seq),
            f"the log ends at seq {head.seq} ({head.hash[:12]}), its writer's head is seq "
            f"{expected_head.seq} ({expected_head.hash[:12]}): the last lines were edited or "
            "removed",
        )
    return Verification(count, head)


def verify_events(
    events: Iterable[dict[str, object]], expected_head: Head | None = None
) -> Verification:
    """``verify`` for events read back as JSON (``GET /v1/audit``): each is its canonical line."""
    return verify((canonical(e) for e in events), expected_head)


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which events to read: of ``voice``, at or after ``since``, after seq ``after``, at most
    ``limit``; ``tenant`` set: only that tenant's (a tenant's key), ``None``: all (admins)."""

    voice: str | None = None
    since: datetime | None = None
    after: int = 0
    limit: int = 100
    tenant: str | None = None
    all_tenants: bool = True

    def admits(self, event: dict) -> bool:
        if event["seq"] <= self.after:
            return False
        if self.voice is not None and event.get("voice") != self.voice:
            return False
        if not self.all_tenants and event.get("tenant") != self.tenant:
            return False
        return self.since is None or parse_iso(str(event["time"])) >= self.since


@dataclass(frozen=True, slots=True)
class AuditPage:
    events: list[dict]
    head: Head
    more: bool  # further events match: ask again with after = the last one's seq


# --- the JSONL file ----------------------------------------------------------------------------


class AuditLog:
    """An append-only JSONL file of events. Appends hold an exclusive ``flock`` while they read
    the last line and write theirs, so several processes of one machine (a server, the CLI)
    keep one chain; each append is flushed to disk before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)

    def head(self) -> Head:
        """The last line's seq and hash, read from the end of the file."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return Head()
        try:
            return _tail_head(fd)
        finally:
            os.close(fd)

    def append(self, changes: list[Change]) -> list[dict]:
        """Number, chain and write ``changes`` as the next lines; returns their events."""
        with self._lock:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                head = _tail_head(fd)
                events, lines = [], []
                for change in changes:
                    event = change.event(head.seq + 1, head.hash)
                    line = canonical(event)
                    head = Head(head.seq + 1, line_hash(line))
                    events.append(event)
                    lines.append(line + "\n")
                _write_all(fd, "".join(lines).encode())
                os.fsync(fd)
                return events
            finally:
                os.close(fd)  # releases the lock

    def extend(self, lines: list[str]) -> Head:
        """Append lines chained elsewhere (a cluster's mirror), skipping those the file holds
        already; stops at the first line that does not continue the file's chain (it waits for
        the lines before it). Returns the file's head after."""
        with self._lock:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                head = _tail_head(fd)
                out = []
                for line in lines:
                    event = json.loads(line)
                    if event["seq"] <= head.seq:
                        continue
                    if event["seq"] != head.seq + 1 or event["prev"] != head.hash:
                        break
                    head = Head(event["seq"], line_hash(line))
                    out.append(line + "\n")
                if out:
                    _write_all(fd, "".join(out).encode())
                    os.fsync(fd)
                return head
            finally:
                os.close(fd)

    def lines(self) -> Iterator[str]:
        try:
            with self.path.open(encoding="utf-8") as file:
                yield from (line.rstrip("\n") for line in file if line.strip())
        except FileNotFoundError:
            return

    def read(self, query: AuditQuery) -> AuditPage:
        found: list[dict] = []
        more = False
        head = Head()
        for line in self.lines():
            try:
                event = json.loads(line)
                head = Head(int(event["seq"]), line_hash(line))
            except (ValueError, KeyError, TypeError):
                continue  # a damaged line: ``verify`` names it; readers skip it
            if query.admits(event):
                if len(found) == query.limit:
                    more = True
                    continue
                found.append(event)
        return AuditPage(found, head, more)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _tail_head(fd: int) -> Head:
    """The head of the file open at ``fd``: its last non-empty line's seq and hash."""
    size = os.fstat(fd).st_size
    if size == 0:
        return Head()
    chunk = TAIL_BYTES
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        lines = [line for line in data.split(b"\n") if line.strip()]
        if lines and (start == 0 or len(lines) > 1):
            try:
                return head_of(lines[-1].decode())
            except (ValueError, KeyError, TypeError) as exc:
                raise ChainBroken(f"the log's last line is not an event ({exc})") from exc
        if start == 0:
            return Head()
        chunk *= 4


# --- the trail a service records to ----------------------------------------------------------


class AuditTrail(Protocol):
    """Where a service records its changes and reads them back: one server's file
    (``FileAuditTrail``) or a cluster's Redis stream and its mirror
    (``voicehost.cluster.audit.RedisAuditTrail``)."""

    async def record(self, change: Change) -> None:
        """Append ``change``; never raises (a log that cannot be written keeps it in memory,
        says so in the server log, and writes it with the next event that can be)."""
        ...

    async def read(self, query: AuditQuery) -> AuditPage: ...

    # where an append that finds the chain broken (``ChainBroken``) is counted, if anywhere
    breaks: Counter | None


class FileAuditTrail:
    """One server's trail: ``AuditLog`` in the data folder (``VOICEHOST_AUDIT_PATH``)."""

    def __init__(self, path: Path, breaks: Counter | None = None) -> None:
        self.log = AuditLog(path)
        self.breaks = breaks
        self._pending: list[Change] = []
        self._order = asyncio.Lock()

    async def record(self, change: Change) -> None:
        async with self._order:
            batch = [*self._pending, change]
            try:
                await asyncio.to_thread(self.log.append, batch)
                self._pending = []
            except ChainBroken as exc:
                log.error("audit log %s: %s; events kept in memory", self.log.path, exc)
                if self.breaks is not None:
                    self.breaks.inc()
                self._pending = batch[-MAX_PENDING:]
            except Exception:
                log.exception("audit log %s cannot be written; kept in memory", self.log.path)
                self._pending = batch[-MAX_PENDING:]

    async def read(self, query: AuditQuery) -> AuditPage:
        return await asyncio.to_thread(self.log.read, query)
