"""A table of 64-bit integers shared by the processes of one host: a file mapped into each
process's memory, changed under an exclusive ``flock`` of it (``voicehost serve --frontends N``:
``voicehost.host.board``, ``voicehost.host.lora_ids``).

``flock`` belongs to the open file, so each process opens its own; a process that dies lets go
of the lock with its files.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def create(path: Path, rows: int, columns: int) -> None:
    """The zeroed file of a ``rows`` x ``columns`` table (sparse: untouched pages take no disk)."""
    with path.open("wb") as file:
        file.truncate(rows * columns * 8)


def hash63(text: str, salt: bytes = b"") -> int:
    """63 bits of ``text``'s BLAKE2b hash, never 0 (0 marks a free column)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, salt=salt).digest()
    return (int.from_bytes(digest, "little") >> 1) or 1


class SharedTable:
    """The table in the file at ``path``, as ``self.table`` (an int64 array of ``rows`` x
    ``columns`` that every process sees change); ``locked()`` holds the host's lock."""

    def __init__(self, path: Path, rows: int, columns: int) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, rows * columns * 8)
        self.table = np.frombuffer(self._map, dtype=np.int64).reshape(rows, columns)

    @contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        del self.table
        self._map.close()
        os.close(self._fd)
