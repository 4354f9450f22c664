"""Admission control: a process takes at most the streams it can keep real-time, and each API
key at most its quota; the rest are refused at once, with when to retry, before any engine work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from voicehost.errors import ServiceError
from voicehost.speech.board import Board, LocalBoard
from voicehost.speech.capacity import Realtime
from voicehost.tenancy.keys import TokenStreams


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What a process reports of its load (a cluster worker, with each heartbeat)."""

    active_streams: int
    loaded_adapters: int
    capacity: int
    headroom: int  # streams more it predicts it keeps real time (at most capacity - active)


class Refused(ServiceError):
    """A stream (or a request) that cannot be admitted now: ``code`` says whose limit it is
    (``quota_exceeded``: the caller's; ``at_capacity``: the server's), ``retry_after`` when
    to try again."""

    def __init__(self, code: str, message: str, retry_after: int) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


@dataclass
class Admission:
    """Counts the streams in progress, in all and per API key, on the ``board``
    (``voicehost.speech.board``: this process alone, or every front end of the host,
    ``voicehost.host.board.HostBoard``).

    ``capacity``: streams the host keeps real-time (beyond: 503, it is full); ``per_key``:
    streams one key may hold at once (beyond: 429, that key is over its quota; 0: no quota);
    ``realtime``: measured capacity, which refuses (503) a stream within the static capacity
    that would slow every stream below real time. A stream is one speech request, or one open
    WebSocket session. ``active``: this process's streams (what its drain waits for).
    """

    capacity: int
    per_key: int = 0
    realtime: Realtime | None = None
    retry_after: int = 1  # seconds; streams last seconds, so one soon ends
    board: Board = field(default_factory=LocalBoard)
    active: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._idle.set()

    async def idle(self) -> None:
        """Return once no stream of this process is in progress."""
        await self._idle.wait()

    def streams(self) -> int:
        """Streams in progress on the host."""
        return self.board.streams()

    def headroom(self) -> int:
        """Streams more the host would admit and keep real time."""
        streams = self.board.streams()
        room = self.capacity - streams
        if self.realtime is None:
            return room
        return self.realtime.headroom(streams, room, self.active)

    def _check(
        self,
        streams: int,
        held: tuple[int, ...],
        per_key: int | None = None,
        token: TokenStreams | None = None,
    ) -> None:
        """Raise ``Refused`` unless one more stream fits, the host having ``streams`` and the
        key ``held[0]`` (its quota ``per_key``, else the service's), a ``token`` bound to a
        stream count ``held[1]``. The quotas are checked first: a caller over its own is told
        so even when the host is also full."""
        per_key = self.per_key if per_key is None else per_key
        if held and per_key and held[0] >= per_key:
            raise Refused(
                "quota_exceeded",
                f"this API key already has {held[0]} streams in progress (its limit)",
                self.retry_after,
            )
        if token is not None and held[-1] >= token.limit:
            raise Refused(
                "quota_exceeded",
                f"this token already has {held[-1]} streams in progress (its limit)",
                self.retry_after,
            )
        if streams >= self.capacity:
            raise Refused(
                "at_capacity",
                f"this server is at its capacity of {self.capacity} real-time streams",
                self.retry_after,
            )
        if self.realtime is not None and (slower := self.realtime.refusal(streams, self.active)):
            raise Refused(
                "at_capacity",
                f"this server is at its measured capacity: {slower}",
                self.retry_after,
            )

    @contextmanager
    def admit(
        self, key: str | None, per_key: int | None = None, token: TokenStreams | None = None
    ) -> Iterator[None]:
        """Count one more stream for the ``with`` block (on ``key``'s quota too, whose own is
        ``per_key`` if it has one, and on the ``token``'s, if bound to a stream count), or raise
        ``Refused``."""
        keys = tuple(k for k in (key, token and token.admission_key) if k is not None)
        self.board.reserve(keys, partial(self._check, per_key=per_key, token=token))
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()
            self.board.release(keys)
