"""Usage: characters and seconds of audio spoken, per API key, tenant and voice.

Counted as audio is sent, never when it is asked for: a stream's ``UsageTally`` adds each
chunk's seconds once the chunk has been written to the client (so a stream cancelled or cut
half-way counts what was sent), and a segment's characters with the first chunk of its audio.
The counts go at once into Prometheus counters (``voicehost_usage_*_total``) and into per-minute
buckets in memory, which a background task adds to the ``UsageStore`` every
``VOICEHOST_USAGE_FLUSH_SECONDS``: one server's JSONL file, or a cluster's Redis mirrored to
the shared store (``voicehost.cluster.usage``), so the hot path never waits on a store.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from voicehost.model.orpheus import SAMPLE_RATE

if TYPE_CHECKING:
    from voicehost.metrics import SpeechMetrics
    from voicehost.tenancy.keys import Principal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class UsageKey:
    """Whose speech: the API key and its tenant ("" for both without keys) and the voice."""

    key_id: str
    tenant: str
    voice: str


@dataclass(slots=True)
class Amount:
    characters: int = 0
    audio_seconds: float = 0.0

    def add(self, characters: int, audio_seconds: float) -> None:
        self.characters += characters
        self.audio_seconds += audio_seconds


Buckets = dict[tuple[int, UsageKey], Amount]  # (minute since the epoch, whose) -> amount


def minute_of(timestamp: float) -> int:
    return int(timestamp // 60)


class UsageStore(Protocol):
    """Where a ledger's buckets are summed: one server's file or a cluster's Redis (mirrored to
    the shared store: ``voicehost.cluster.usage``)."""

    @property
    def waiting(self) -> bool:
        """Whether buckets it took are not yet in the sums (to be retried with ``add``)."""
        ...

    async def add(self, buckets: Buckets) -> None: ...

    async def totals(self, since_minute: int, tenant: str | None) -> dict[UsageKey, Amount]:
        """The sums from ``since_minute`` on, of ``tenant`` only (``None``: every tenant)."""
        ...


class UsageTally:
    """The usage of one stream: call ``segment`` when a segment starts, ``sent`` after each
    chunk of audio reached the client's connection."""

    def __init__(self, ledger: UsageLedger, key: UsageKey) -> None:
        self.ledger = ledger
        self.key = key
        self._characters = 0  # of segments started, not yet counted: they count with audio
        self.samples = 0  # 24 kHz samples sent
        metrics = ledger.metrics
        labels = (key.key_id, key.tenant, key.voice)
        self._chars_counter = metrics.usage_characters.labels(*labels) if metrics else None
        self._seconds_counter = metrics.usage_audio_seconds.labels(*labels) if metrics else None

    def segment(self, text: str) -> None:
        self._characters += len(text)

    def sent(self, samples: int) -> None:
        """``samples`` (at 24 kHz, before resampling) have been written to the client."""
        if samples <= 0:
            return
        characters, self._characters = self._characters, 0
        seconds = samples / SAMPLE_RATE
        self.samples += samples
        self.ledger.add(self.key, characters, seconds)
        if self._seconds_counter is not None and self._chars_counter is not None:
            self._seconds_counter.inc(seconds)
            if characters:
                self._chars_counter.inc(characters)


class UsageLedger:
    """This process's usage not yet in the store, by minute, and its flushing."""

    def __init__(
        self, store: UsageStore, metrics: SpeechMetrics | None, flush_seconds: float = 1.0
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.flush_seconds = flush_seconds
        self._pending: Buckets = defaultdict(Amount)
        self._flushing = asyncio.Lock()
        self._stored = True  # the last flush worked: a failure is logged once, not each second

    def tally(self, principal: Principal | None, voice_id: str) -> UsageTally:
        if principal is None:
            return UsageTally(self, UsageKey("", "", voice_id))
        return UsageTally(self, UsageKey(principal.key_id, principal.tenant, voice_id))

    def add(self, key: UsageKey, characters: int, audio_seconds: float) -> None:
        self._pending[(minute_of(time.time()), key)].add(characters, audio_seconds)

    async def flush(self) -> None:
        """Add what was counted since the last flush to the store; kept for the next one if
        the store cannot be reached."""
        async with self._flushing:
            if not self._pending and not self.store.waiting:
                return
            batch, self._pending = self._pending, defaultdict(Amount)
            try:
                await self.store.add(batch)
            except Exception as exc:
                if self._stored:
                    log.warning("usage not stored yet (kept until it can be): %s", exc)
                self._stored = False
                self._count_flush("failed")
                for bucket, amount in batch.items():
                    self._pending[bucket].add(amount.characters, amount.audio_seconds)
                return
            if not self._stored:
                log.info("usage stored again")
            self._stored = True
            self._count_flush("stored")

    def _count_flush(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.usage_flushes.labels(outcome).inc()

    async def run_forever(self) -> None:
        """Flush every ``flush_seconds`` (as a task); a last flush when cancelled."""
        try:
            while True:
                await asyncio.sleep(self.flush_seconds)
                await self.flush()
        finally:
            await asyncio.shield(self.flush())

    async def totals(self, since: float, tenant: str | None) -> dict[UsageKey, Amount]:
        """The store's sums from the minute of ``since`` on (this process's counts included)."""
        await self.flush()
        return await self.store.totals(minute_of(since), tenant)


class FileUsageStore:
    """One server's usage: a JSONL file of flushed buckets (``VOICEHOST_USAGE_PATH``), one line
    per minute, key, tenant and voice of each flush; totals sum the lines."""

    waiting = False  # a flush is in the file or raised

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    async def add(self, buckets: Buckets) -> None:
        lines = [
            json.dumps(
                {
                    "minute": minute,
                    "key_id": key.key_id,
                    "tenant": key.tenant,
                    "voice": key.voice,
                    "characters": amount.characters,
                    "audio_seconds": amount.audio_seconds,
                }
            )
            + "\n"
            for (minute, key), amount in sorted(buckets.items())
        ]
        await asyncio.to_thread(self._append, "".join(lines))

    def _append(self, text: str) -> None:
        """One write of whole lines, under an exclusive ``flock``: the front ends of a host
        append to one file."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as file:
                fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
                file.write(text)

    async def totals(self, since_minute: int, tenant: str | None) -> dict[UsageKey, Amount]:
        return await asyncio.to_thread(self._totals, since_minute, tenant)

    def _totals(self, since_minute: int, tenant: str | None) -> dict[UsageKey, Amount]:
        sums: dict[UsageKey, Amount] = defaultdict(Amount)
        try:
            with self.path.open(encoding="utf-8") as file:
                for line in file:
                    try:
                        row = json.loads(line)
                        key = UsageKey(row["key_id"], row["tenant"], row["voice"])
                        if row["minute"] < since_minute or tenant not in (None, key.tenant):
                            continue
                        sums[key].add(int(row["characters"]), float(row["audio_seconds"]))
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut by a crash
        except FileNotFoundError:
            pass
        return dict(sums)
