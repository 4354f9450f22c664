"""Admission control: a process takes at most the streams it can keep real-time, and each API
key at most its quota; the rest are refused at once, with when to retry, before any engine work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from voicehost.speech.capacity import Realtime


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What a process reports of its load (a cluster worker, with each heartbeat)."""

    active_streams: int
    loaded_adapters: int
    capacity: int
    headroom: int  # streams more it predicts it keeps real time (at most capacity - active)


class Refused(Exception):
    """A stream that cannot be admitted now: answered ``status`` with ``Retry-After``."""

    def __init__(self, status: int, code: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


@dataclass
class Admission:
    """Counts the streams in progress, in all and per API key.

    ``capacity``: streams the process keeps real-time (beyond: 503, the process is full);
    ``per_key``: streams one key may hold at once (beyond: 429, that key is over its quota;
    0: no quota); ``realtime``: measured capacity, which refuses (503) a stream within the
    static capacity that would slow every stream below real time. A stream is one speech
    request, or one open WebSocket session.
    """

    capacity: int
    per_key: int = 0
    realtime: Realtime | None = None
    retry_after: int = 1  # seconds; streams last seconds, so a slot is soon free again
    active: int = 0
    by_key: dict[str, int] = field(default_factory=dict)
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._idle.set()

    async def idle(self) -> None:
        """Return once no stream is in progress."""
        await self._idle.wait()

    def headroom(self) -> int:
        """Streams more this process would admit and keep real time."""
        room = self.capacity - self.active
        return room if self.realtime is None else self.realtime.headroom(self.active, room)

    @contextmanager
    def admit(self, key: str | None) -> Iterator[None]:
        """Hold a stream slot (and one of ``key``'s) for the ``with`` block, or raise
        ``Refused``. The key quota is checked first: a key over its quota is told so even when
        the process is also full."""
        held = self.by_key.get(key, 0) if key is not None else 0
        if key is not None and self.per_key and held >= self.per_key:
            raise Refused(
                429,
                "quota_exceeded",
                f"this API key already has {held} streams in progress (its limit)",
                self.retry_after,
            )
        if self.active >= self.capacity:
            raise Refused(
                503,
                "at_capacity",
                f"this server is at its capacity of {self.capacity} real-time streams",
                self.retry_after,
            )
        if self.realtime is not None and (slower := self.realtime.refusal(self.active)):
            raise Refused(
                503,
                "at_capacity",
                f"this server is at its measured capacity: {slower}",
                self.retry_after,
            )
        self.active += 1
        self._idle.clear()
        if key is not None:
            self.by_key[key] = held + 1
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()
            if key is not None:
                if self.by_key[key] <= 1:
                    del self.by_key[key]
                else:
                    self.by_key[key] -= 1
