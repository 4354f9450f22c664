"""The streams of a whole host: what admission and the rate meter count across front ends.

One engine core batches the requests of every front end of a host (``voicehost serve
--frontends N``, ``voicehost.api.host``), so what admission counts must be the host's: the
streams in progress (capacity), each API key's streams (its quota; a speech token bound to a
stream count is counted under a key of its own beside its API key's), and the engine requests
generating (the batch the measured rate belongs to). ``LocalBoard`` keeps them for one serving
process; ``HostBoard`` keeps them in a small file mapped into every front end's memory, one row
per front end, each row written only by its own front end under an exclusive ``flock`` of the
file (``voicehost.model.hostfile``), so a check and the count it admits are one step for the whole
host.

A row holds: the front end's streams, its engine requests generating, the request-seconds they have
generated for (up to when), and a table of (key hash, streams) with as many slots as the host admits
streams times ``KEYS_PER_STREAM``. A front end that dies takes the host down
(``voicehost.api.host``), so a row is never left counting streams that no longer exist.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from voicehost.model import hostfile

Check = Callable[[int, tuple[int, ...]], None]  # (the host's streams, each key's): raise to refuse
Keys = tuple[str, ...]  # what one stream counts under: its API key, and its token if bound
KEYS_PER_STREAM = 2


class Board(Protocol):
    """Stream counts as admission and the rate meter read and change them."""

    def reserve(self, keys: Keys, check: Check) -> None:
        """Call ``check`` with the streams in progress and each of ``keys``'s, then count one
        more stream (of each of ``keys``) unless it raised: one step, no stream admitted in
        between."""
        ...

    def release(self, keys: Keys) -> None:
        """One stream (of ``keys``) has ended."""
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

    def reserve(self, keys: Keys, check: Check) -> None:
        check(self.active, tuple(self.by_key.get(key, 0) for key in keys))
        self.active += 1
        for key in keys:
            self.by_key[key] = self.by_key.get(key, 0) + 1

    def release(self, keys: Keys) -> None:
        self.active -= 1
        for key in keys:
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

    def __init__(self, path: Path, count: int, index: int, capacity: int) -> None:
        self.index = index
        self.slots = slots = capacity * KEYS_PER_STREAM
        self._shared = hostfile.SharedTable(path, count, _KEYS + 2 * slots)
        table = self._shared.table
        self._table = table
        self._times = table[:, _BUSY : _AT + 1].view(np.float64)  # busy, at
        self._hashes = table[:, _KEYS : _KEYS + slots]
        self._counts = table[:, _KEYS + slots :]
        self._locked = self._shared.locked

    @staticmethod
    def create(path: Path, count: int, capacity: int) -> None:
        """The zeroed file of ``count`` front ends' rows, for a host of ``capacity`` streams."""
        hostfile.create(path, count, _KEYS + 2 * capacity * KEYS_PER_STREAM)

    def reserve(self, keys: Keys, check: Check) -> None:
        with self._locked():
            hashes = [hostfile.hash63(key) for key in keys]
            held = tuple(int(self._counts[self._hashes == h].sum()) for h in hashes)
            check(int(self._table[:, _STREAMS].sum()), held)
            for hashed in hashes:
                slot = self._slot(hashed)
                self._hashes[self.index, slot] = hashed
                self._counts[self.index, slot] += 1
            self._table[self.index, _STREAMS] += 1

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

    def release(self, keys: Keys) -> None:
        with self._locked():
            self._table[self.index, _STREAMS] -= 1
            for key in keys:
                found = np.flatnonzero(self._hashes[self.index] == hostfile.hash63(key))
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
