"""Which worker serves a voice: a consistent-hash ring with bounded loads.

Every worker owns ``points`` positions on a 64-bit ring, placed by a stable hash of its id
(BLAKE2b, never Python's salted ``hash()``), so every gateway computes the same ring. A voice
goes to the first worker clockwise from the voice's own hash; removing a worker moves only the
voices it held, adding one moves only the voices it takes (about 1/N).

Bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): a worker takes a new stream only while its
in-flight count is below ``ceil(c * (total + 1) / n)``; otherwise the walk continues to the next
worker, so no worker carries more than ``c`` times the average. Hot voices are replicated: a
voice with many streams in flight may go to the least loaded of its first few ring successors.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping

POINTS_PER_WORKER = 1000


def stable_hash(key: str) -> int:
    """A 64-bit hash that is the same in every process and on every machine."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class WorkerRing:
    """An immutable ring over a set of worker ids."""

    def __init__(self, workers: Iterable[str], points: int = POINTS_PER_WORKER) -> None:
        self.workers = frozenset(workers)
        placed = sorted(
            (stable_hash(f"{worker}#{i}"), worker) for worker in self.workers for i in range(points)
        )
        self._hashes = [h for h, _ in placed]
        self._owners = [w for _, w in placed]

    def __len__(self) -> int:
        return len(self.workers)

    def successors(self, key: str) -> Iterator[str]:
        """Distinct workers in ring order, starting with the key's owner."""
        if not self._hashes:
            return
        start = bisect.bisect_right(self._hashes, stable_hash(key))
        seen: set[str] = set()
        size = len(self._owners)
        for step in range(size):
            worker = self._owners[(start + step) % size]
            if worker not in seen:
                seen.add(worker)
                yield worker
                if len(seen) == len(self.workers):
                    return

    def owner(self, key: str) -> str | None:
        return next(self.successors(key), None)


def load_bound(total_in_flight: int, workers: int, factor: float) -> int:
    """The most in-flight streams one worker may hold once one more stream is admitted."""
    return max(1, math.ceil(factor * (total_in_flight + 1) / max(workers, 1)))


def choose_worker(
    ring: WorkerRing,
    key: str,
    loads: Mapping[str, int],
    factor: float = 1.25,
    replicas: int = 1,
    exclude: frozenset[str] = frozenset(),
) -> str | None:
    """The worker for one new stream of ``key``.

    ``loads`` holds in-flight streams per worker; ``replicas`` > 1 lets a hot key use the least
    loaded of its first ``replicas`` successors; ``exclude`` skips workers that just failed.
    """
    live = ring.workers - exclude
    if not live:
        return None
    bound = load_bound(sum(loads.get(w, 0) for w in live), len(live), factor)
    walk = (w for w in ring.successors(key) if w not in exclude)
    preferred = list(itertools.islice(walk, max(1, replicas)))
    first = preferred[0]
    for worker in sorted(preferred, key=lambda w: loads.get(w, 0)):
        if loads.get(worker, 0) < bound:
            return worker
    for worker in walk:
        if loads.get(worker, 0) < bound:
            return worker
    return first  # every worker is at the bound (only when factor < 1)
