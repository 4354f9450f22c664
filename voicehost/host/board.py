"""The streams of a whole host: what admission and the rate meter count across front ends.

One engine core batches the requests of every front end of a host (``voicehost serve
--frontends N``, ``voicehost.host``), so what admission counts (``voicehost.speech.board``)
must be the host's. ``HostBoard`` keeps it in a small file mapped into every front end's
memory, one row per front end, each row written only by its own front end under an exclusive
``flock`` of the file (``voicehost.host.hostfile``), so a check and the count it admits are one
step for the whole host.

A row holds: the front end's streams, its engine requests generating, the request-seconds they have
generated for (up to when), a table of (key hash, streams) with as many columns as the host
admits streams times ``KEYS_PER_STREAM``, and the LoRA ids of the requests the front end has in
the engine (host-wide ids, ``voicehost.host.lora_ids``: an adapter two front ends run is one id),
as many columns again. A front end that dies takes the host down
(``voicehost.host.launcher``), so a row is never left counting streams that no longer exist.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np

from voicehost.host import hostfile
from voicehost.speech.board import Check, Keys

KEYS_PER_STREAM = 2  # what one stream counts under: its API key, and its token if bound

_STREAMS, _GENERATING, _BUSY, _AT, _KEYS = 0, 1, 2, 3, 4  # the columns of a row


class HostBoard:
    """The counts of every front end of one host, in the file at ``path`` (made by ``create``
    before the front ends start): this process is front end ``index``."""

    def __init__(self, path: Path, count: int, index: int, capacity: int) -> None:
        self.index = index
        self.key_columns = columns = capacity * KEYS_PER_STREAM
        self._shared = hostfile.SharedTable(path, count, _KEYS + 3 * columns)
        table = self._shared.table
        self._table = table
        self._times = table[:, _BUSY : _AT + 1].view(np.float64)  # busy, at
        self._hashes = table[:, _KEYS : _KEYS + columns]
        self._counts = table[:, _KEYS + columns : _KEYS + 2 * columns]
        self._loras = table[:, _KEYS + 2 * columns :]
        self._locked = self._shared.locked

    @staticmethod
    def create(path: Path, count: int, capacity: int) -> None:
        """The zeroed file of ``count`` front ends' rows, for a host of ``capacity`` streams."""
        hostfile.create(path, count, _KEYS + 3 * capacity * KEYS_PER_STREAM)

    def reserve(self, keys: Keys, check: Check) -> None:
        with self._locked():
            hashes = [hostfile.hash63(key) for key in keys]
            held = tuple(int(self._counts[self._hashes == h].sum()) for h in hashes)
            check(int(self._table[:, _STREAMS].sum()), held)
            for hashed in hashes:
                column = self._column(hashed)
                self._hashes[self.index, column] = hashed
                self._counts[self.index, column] += 1
            self._table[self.index, _STREAMS] += 1

    def _column(self, hashed: int) -> int:
        """This row's column of the key ``hashed``, or a free one."""
        hashes, counts = self._hashes[self.index], self._counts[self.index]
        found = np.flatnonzero(hashes == hashed)
        if len(found):
            return int(found[0])
        free = np.flatnonzero(counts == 0)
        if not len(free):  # more keys than the host admits streams: a check let too many in
            raise RuntimeError("the host's stream board has no free key column")
        return int(free[0])

    def release(self, keys: Keys) -> None:
        with self._locked():
            self._table[self.index, _STREAMS] -= 1
            for key in keys:
                found = np.flatnonzero(self._hashes[self.index] == hostfile.hash63(key))
                column = int(found[0])
                self._counts[self.index, column] -= 1
                if not self._counts[self.index, column]:
                    self._hashes[self.index, column] = 0

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

    def loras_in_use(self, held: Collection[int]) -> int:
        """Say that this front end's engine requests use the LoRA ids ``held``; the distinct
        ids the host's requests use. (A front end holds adapters of its streams only, at most
        the host's capacity; its row keeps twice that, for requests still being aborted.)"""
        ids = sorted(held)[: self._loras.shape[1]]
        with self._locked():
            row = self._loras[self.index]
            row[:] = 0
            row[: len(ids)] = ids
            used = np.unique(self._loras)
        return int(np.count_nonzero(used))

    def close(self) -> None:
        del self._table, self._times, self._hashes, self._counts, self._loras
        self._shared.close()
