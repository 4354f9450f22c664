"""A cluster's usage: every worker's counts summed in Redis per minute, mirrored to the shared
store so that no counted usage is lost with Redis.

A worker's ledger (``voicehost.tenancy.usage.UsageLedger``) flushes its buckets about once a
second. Each flush is first appended, as one line, to a file of the process's own on the shared
store (``usage/<process>.jsonl``: ``{"flush": n, "buckets": [[minute, field, characters,
seconds], ...]}``, ``n`` counting the process's flushes from 1), then applied to Redis by one
script (``APPLY``): ``HINCRBY`` / ``HINCRBYFLOAT`` into ``vh:usage:<minute>`` (fields
``<key>|<tenant>|<voice>|c`` for characters and ``...|s`` for seconds; ids never hold ``|``), the
minute into the index ``vh:usage:minutes``, and ``n`` into ``vh:usage:applied`` (the last flush
of each process that Redis holds). The script applies flush ``n`` only after flush ``n - 1``, so
a flush counts once however often it is sent.

If Redis loses its data (a restart without it, a flush), the mark ``vh:usage:filled`` is gone
with the sums: the script then refuses a worker's flush, and a gateway asked for totals finds no
mark. Either refills Redis from the mirror (``refill``): every process's flushes after the last
one Redis holds, in order, through the same script, so two refilling at once, or a refill beside
the workers' own flushes, still count each flush once; then it sets the mark.
Flushes that reached the mirror but not Redis (Redis away, or the worker killed between the
two) are applied by the next refill, or by the worker's next flush. What no store has seen, the
last second of a worker killed outright, is not counted.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import time
import uuid
from collections import defaultdict
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.cluster.state import USAGE_APPLIED, USAGE_FILLED, USAGE_MINUTES, usage_key
from voicehost.ids import now_iso
from voicehost.tenancy.usage import Amount, Buckets, UsageKey, minute_of

log = logging.getLogger(__name__)

# KEYS: the applied record, the minutes index, the filled mark. ARGV: the process, its flush
# number, '1' from a refill (applied after a gap: the flushes before it are not in the mirror;
# and before Redis is marked filled), the TTL, the oldest minute kept, the buckets' key prefix,
# the buckets (JSON: [minute, field, characters, seconds], the minute and the seconds as
# strings). Returns the process's last applied flush, or -1: Redis must be refilled first.
APPLY = """
local refill = ARGV[3] == '1'
if not refill and redis.call('EXISTS', KEYS[3]) == 0 then
  return -1
end
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local n = tonumber(ARGV[2])
if n <= last or (n ~= last + 1 and not refill) then
  return last
end
local ttl = tonumber(ARGV[4])
local oldest = tonumber(ARGV[5])
for _, bucket in ipairs(cjson.decode(ARGV[7])) do
  local minute = bucket[1]
  if tonumber(minute) >= oldest then
    local key = ARGV[6] .. minute
    if tonumber(bucket[3]) ~= 0 then
      redis.call('HINCRBY', key, bucket[2] .. '|c', bucket[3])
    end
    redis.call('HINCRBYFLOAT', key, bucket[2] .. '|s', bucket[4])
    redis.call('EXPIRE', key, ttl)
    redis.call('ZADD', KEYS[2], tonumber(minute), minute)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], 0, oldest - 1)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('HSET', KEYS[1], ARGV[1], n)
redis.call('EXPIRE', KEYS[1], ttl)
if not refill then
  redis.call('EXPIRE', KEYS[3], ttl)
end
return n
"""

Row = list[str | int]  # [minute, field, characters, seconds]


def rows_of(buckets: Buckets) -> list[Row]:
    return [
        [str(minute), f"{key.key_id}|{key.tenant}|{key.voice}", amount.characters,
         repr(amount.audio_seconds)]
        for (minute, key), amount in sorted(buckets.items())
    ]  # fmt: skip


def append_line(path: Path, line: str) -> None:
    """One write of a whole line under an exclusive ``flock``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
        file.write(line)


def read_flushes(path: Path, after: int) -> list[tuple[int, list[Row]]]:
    """The flushes in ``path`` numbered after ``after``, in order, each once; a line a crash
    cut short is skipped (the flush it began was written again whole, or never applied)."""
    flushes: dict[int, list[Row]] = {}
    try:
        with path.open(encoding="utf-8") as file:
            for line in file:
                try:
                    record = json.loads(line)
                    n, rows = int(record["flush"]), list(record["buckets"])
                except (ValueError, KeyError, TypeError):
                    continue
                if n > after:
                    flushes.setdefault(n, rows)
    except FileNotFoundError:
        return []
    return sorted(flushes.items())


class ClusterUsageStore:
    """``UsageStore`` of a cluster process: flushes mirrored to the shared store's ``folder``,
    summed in Redis, buckets kept ``retention_days``."""

    def __init__(self, redis: Redis, folder: Path, process: str, retention_days: float) -> None:
        self.redis = redis
        self.folder = folder
        self.process = f"{process}-{uuid.uuid4().hex[:12]}"  # each start, a file of its own
        self.retention_seconds = int(retention_days * 86400)
        self._apply = redis.register_script(APPLY)
        self._flushes = 0  # the last flush written to the mirror
        self._unsent: list[tuple[int, list[Row]]] = []  # in the mirror, not yet in Redis
        self._redis_ok = True

    @property
    def mirror(self) -> Path:
        return self.folder / f"{self.process}.jsonl"

    @property
    def waiting(self) -> bool:
        """Whether flushes are in the mirror that Redis does not hold yet."""
        return bool(self._unsent)

    async def add(self, buckets: Buckets) -> None:
        """Mirror ``buckets`` as this process's next flush (raises if the shared store cannot
        be written: the ledger keeps them), then apply every flush Redis lacks; those Redis
        cannot take now wait for the next call."""
        if buckets:
            n = self._flushes + 1
            rows = rows_of(buckets)
            line = json.dumps({"flush": n, "buckets": rows}) + "\n"
            await asyncio.to_thread(append_line, self.mirror, line)
            self._flushes = n
            self._unsent.append((n, rows))
        try:
            await self._send()
        except RedisError as exc:
            if self._redis_ok:
                waiting = len(self._unsent)
                log.warning("usage mirrored, not yet in Redis (%d flushes): %s", waiting, exc)
            self._redis_ok = False
            return
        if not self._redis_ok:
            log.info("usage summed in Redis again")
        self._redis_ok = True

    async def _send(self) -> None:
        while self._unsent:
            n, rows = self._unsent[0]
            last = await self._apply_flush(self.process, n, rows)
            if last < n - 1:  # not refilled since Redis lost its data, or lacking earlier flushes
                await self.refill()  # this flush too: it is in the mirror
                last = await self._apply_flush(self.process, n, rows, refill=True)
            if last >= n:
                self._unsent.pop(0)

    async def _apply_flush(
        self, process: str, n: int, rows: list[Row], refill: bool = False
    ) -> int:
        oldest = minute_of(time.time() - self.retention_seconds)
        last = await self._apply(
            keys=[USAGE_APPLIED, USAGE_MINUTES, USAGE_FILLED],
            args=[
                process,
                n,
                "1" if refill else "0",
                self.retention_seconds,
                oldest,
                usage_key(0)[:-1],  # the buckets' prefix
                json.dumps(rows),
            ],
        )
        return int(last)

    async def refill(self) -> int:
        """Apply every process's mirrored flushes that Redis lacks, in order, then mark Redis
        filled; the number applied. After Redis lost its data that is all of them (within the
        retention). Until a refill has ended, no flush is applied but a refill's, and readers
        refill first: no one sums a Redis half refilled."""
        applied = 0
        paths = await asyncio.to_thread(lambda: sorted(self.folder.glob("*.jsonl")))
        for path in paths:
            process = path.stem
            last = int(await self.redis.hget(USAGE_APPLIED, process) or 0)
            for n, rows in await asyncio.to_thread(read_flushes, path, last):
                # a gap in a file (a line lost): the flushes after it count all the same
                if await self._apply_flush(process, n, rows, refill=True) == n:
                    applied += 1
        await self.redis.set(USAGE_FILLED, now_iso(), ex=self.retention_seconds)
        if applied:
            log.warning(
                "usage refilled from the shared store: %d flushes of %d processes",
                applied,
                len(paths),
            )
        return applied

    async def totals(self, since_minute: int, tenant: str | None) -> dict[UsageKey, Amount]:
        if not await self.redis.exists(USAGE_FILLED):  # Redis lost its data, or is new
            await self.refill()
        minutes = await self.redis.zrangebyscore(USAGE_MINUTES, since_minute, "+inf")
        async with self.redis.pipeline(transaction=False) as pipe:
            for minute in minutes:
                pipe.hgetall(usage_key(int(minute)))
            buckets = await pipe.execute()
        sums: dict[UsageKey, Amount] = defaultdict(Amount)
        for bucket in buckets:
            for field, value in bucket.items():
                key_id, key_tenant, voice, kind = field.split("|")
                if tenant is not None and key_tenant != tenant:
                    continue
                amount = sums[UsageKey(key_id, key_tenant, voice)]
                if kind == "c":
                    amount.add(int(value), 0.0)
                else:
                    amount.add(0, float(value))
        return dict(sums)
