"""The streams of a whole host: what admission and the rate meter count across front ends.

One engine core batches the requests of every front end of a host (``voicehost serve
--frontends N``, ``voicehost.api.host``), so what admission counts must be the host's: the
streams in progress (capacity), each API key's streams (its quota), and the engine requests
generating (the batch the measured rate belongs to). ``LocalBoard`` keeps them for one serving
process; ``HostBoard`` keeps them in a small file mapped into every front end's memory, one row
per front end, each row written only by its own front end under an exclusive ``flock`` of the
file (``voicehost.model.hostfile``), so a check and the count it admits are one step for the whole
host.

A row holds: the front end's streams, its engine requests generating, the request-seconds they
have generated for (up to when), and a table of (API key hash, streams) with as many slots as
the host admits streams. A front end that dies takes the host down (``voicehost.api.host``), so
a row is never left counting streams that no longer exist.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from voicehost.model import hostfile

Check = Callable[[int, int], None]  # (streams of the host, streams of the key): raise to refuse


class Board(Protocol):
    """Stream counts as admission and the rate meter read and change them."""

    def reserve(self, key: str | None, check: Check) -> None:
        """Call ``check`` with the streams in progress and ``key``'s, then count one more
        stream (of ``key``) unless it raised: one step, no stream admitted in between."""
        ...

    def release(self, key: str | None) -> None:
        """One stream (of ``key``) has ended."""
        ...

    def streams(self) -> int:
        """Streams in progress on the host."""
        ...

    def publish(self, generating: int, busy: float, at: float) -> None:
        """This process's engine requests generating, and the request-seconds generated up to
        ``at`` (``time.monotonic``)."""
        ...

    def generating(self, now: float) -> tuple[int, float]:
        """The host's engine requests generating and its request-seconds up to ``now``."""
        ...


class LocalBoard:
    """The counts of one serving process that is the whole host."""

    def __init__(self) -> None:
        self.active = 0
        self.by_key: dict[str, int] = {}
        self._generating = (0, 0.0, 0.0)

    def reserve(self, key: str | None, check: Check) -> None:
        check(self.active, self.by_key.get(key, 0) if key is not None else 0)
        self.active += 1
        if key is not None:
            self.by_key[key] = self.by_key.get(key, 0) + 1

    def release(self, key: str | None) -> None:
        self.active -= 1
        if key is not None:
            if self.by_key[key] <= 1:
                del self.by_key[key]
            else:
                self.by_key[key] -= 1

    def streams(self) -> int:
        return self.active

    def publish(self, generating: int, busy: float, at: float) -> None:
        self._generating = (generating, busy, at)

    def generating(self, now: float) -> tuple[int, float]:
        count, busy, at = self._generating
        return count, busy + count * (now - at)


_STREAMS, _GENERATING, _BUSY, _AT, _KEYS = 0, 1, 2, 3, 4  # the columns of a row


class HostBoard:
    """The counts of every front end of one host, in the file at ``path`` (made by ``create``
    before the front ends start): this process is front end ``index``."""

    def __init__(self, path: Path, count: int, index: int, slots: int) -> None:
        self.index = index
        self.slots = slots
        self._shared = hostfile.SharedTable(path, count, _KEYS + 2 * slots)
        table = self._shared.table
        self._table = table
        self._times = table[:, _BUSY : _AT + 1].view(np.float64)  # busy, at
        self._hashes = table[:, _KEYS : _KEYS + slots]
        self._counts = table[:, _KEYS + slots :]
        self._locked = self._shared.locked

    @staticmethod
    def create(path: Path, count: int, slots: int) -> None:
        """The zeroed file of ``count`` front ends' rows, ``slots`` API keys each."""
        hostfile.create(path, count, _KEYS + 2 * slots)

    def reserve(self, key: str | None, check: Check) -> None:
        with self._locked():
            hashed = hostfile.hash63(key) if key is not None else 0
            held = int(self._counts[self._hashes == hashed].sum()) if hashed else 0
            check(int(self._table[:, _STREAMS].sum()), held)
            own = self._table[self.index]
            if hashed:
                slot = self._slot(hashed)
                self._hashes[self.index, slot] = hashed
                self._counts[self.index, slot] += 1
            own[_STREAMS] += 1

    def _slot(self, hashed: int) -> int:
        """This row's slot of the key ``hashed``, or a free one."""
        hashes, counts = self._hashes[self.index], self._counts[self.index]
        found = np.flatnonzero(hashes == hashed)
        if len(found):
            return int(found[0])
        free = np.flatnonzero(counts == 0)
        if not len(free):  # more keys than the host admits streams: a check let too many in
            raise RuntimeError("the host's stream board has no free key slot")
        return int(free[0])

    def release(self, key: str | None) -> None:
        with self._locked():
            self._table[self.index, _STREAMS] -= 1
            if key is None:
                return
            hashed = hostfile.hash63(key)
            found = np.flatnonzero(self._hashes[self.index] == hashed)
            slot = int(found[0])
            self._counts[self.index, slot] -= 1
            if not self._counts[self.index, slot]:
                self._hashes[self.index, slot] = 0

    def streams(self) -> int:
        return int(self._table[:, _STREAMS].sum())

    def publish(self, generating: int, busy: float, at: float) -> None:
        with self._locked():
            self._table[self.index, _GENERATING] = generating
            self._times[self.index] = (busy, at)

    def generating(self, now: float) -> tuple[int, float]:
        with self._locked():
            counts = self._table[:, _GENERATING].copy()
            busy, at = self._times[:, 0].copy(), self._times[:, 1].copy()
        return int(counts.sum()), float((busy + counts * (now - at)).sum())

    def close(self) -> None:
        del self._table, self._times, self._hashes, self._counts
        self._shared.close()
