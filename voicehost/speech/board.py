"""The streams admission and the rate meter count: the ``Board`` they read and change them on.

What admission counts must be the host's: the streams in progress (capacity), each API key's
streams (its quota; a speech token bound to a stream count is counted under a key of its own
beside its API key's), and the engine requests generating (the batch the measured rate belongs
to). ``LocalBoard`` keeps them for one serving process that is the whole host; the board of a
host of several front ends sharing one engine core is ``voicehost.host.board.HostBoard``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

Check = Callable[[int, tuple[int, ...]], None]  # (the host's streams, each key's): raise to refuse
Keys = tuple[str, ...]  # what one stream counts under: its API key, and its token if bound


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

    def loras_in_use(self, held: Collection[int]) -> int:
        """Say that this process's engine requests use the LoRA ids ``held``; the distinct
        ids the host's engine requests use."""
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

    def loras_in_use(self, held: Collection[int]) -> int:
        return len(set(held))
