"""Key quotas across the cluster: each stream of an API key holds a lease in Redis.

``VOICEHOST_KEY_MAX_STREAMS`` is a per-key limit for the whole cluster, not per worker: a stream
takes a lease in ``vh:lease:<key id>`` (a sorted set: one member per stream, scored by when it
expires on Redis' clock) before it starts, and gives it back when it ends. Leases are refreshed
while their streams run, so a crashed worker's leases expire after ``LEASE_SECONDS``; a gateway
that finds a worker gone without leaving (its member key expired) drops that worker's leases at
once (``release_owners``), so its clients' keys have their whole quota for the streams they start
over. While Redis is away, quotas fall back to the per-process count (said once in the log).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.cluster.state import lease_key, raise_if_cancelled
from voicehost.speech.admission import Refused
from voicehost.tenancy.keys import TOKEN_STREAMS_PREFIX

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
REFRESH_SECONDS = LEASE_SECONDS / 3

# Drop expired leases, then take one if fewer than the limit are held: one atomic step.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then return -held end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return held + 1
"""
# Push the expiry of leases still held (XX: never revive one that expired and was dropped).
REFRESH = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""


class KeyLeases:
    """The leases of this process's streams; ``owner`` names it in every lease."""

    def __init__(self, redis: Redis, owner: str, lease_seconds: float = LEASE_SECONDS) -> None:
        self.redis = redis
        self.owner = owner
        self.lease_ms = int(lease_seconds * 1000)
        self.held: dict[str, str] = {}  # lease -> key id
        self.redis_ok = True
        self._take = redis.register_script(TAKE)
        self._refresh = redis.register_script(REFRESH)

    @asynccontextmanager
    async def hold(self, key_id: str, limit: int) -> AsyncIterator[None]:
        """A lease of ``key_id``'s for the ``async with`` block: ``Refused`` (429) when the
        cluster holds ``limit`` already. Without Redis, the block runs on the process's own
        count alone."""
        lease = f"{self.owner}:{uuid.uuid4().hex}"
        args = [self.lease_ms, limit, lease]
        try:
            held: int | None = int(await self._take(keys=[lease_key(key_id)], args=args))
            self._redis_back()
        except RedisError as exc:
            self._redis_gone(exc)
            held = None
        if held is None:
            yield
            return
        if held < 0:
            raise Refused(
                "quota_exceeded",
                f"{_whose(key_id)} already has {-held} streams in progress in the cluster"
                " (its limit)",
                1,
            )
        self.held[lease] = key_id
        try:
            yield
        finally:
            self.held.pop(lease, None)
            try:
                await asyncio.shield(self.redis.zrem(lease_key(key_id), lease))
            except RedisError:
                pass  # it expires by itself

    async def refresh(self) -> None:
        """Keep every lease still held alive for another ``lease_seconds``."""
        for lease, key_id in list(self.held.items()):
            await self._refresh(keys=[lease_key(key_id)], args=[self.lease_ms, lease])
            raise_if_cancelled()

    async def refresh_forever(self, interval: float = REFRESH_SECONDS) -> None:
        while True:
            try:
                await self.refresh()
                self._redis_back()
            except RedisError as exc:
                self._redis_gone(exc)
            raise_if_cancelled()
            await asyncio.sleep(interval)

    def _redis_gone(self, exc: Exception) -> None:
        if self.redis_ok:
            log.warning("redis unavailable (%s): key quotas count this process only", exc)
        self.redis_ok = False

    def _redis_back(self) -> None:
        if not self.redis_ok:
            log.info("redis reachable: key quotas hold for the cluster again")
        self.redis_ok = True


async def release_owners(redis: Redis, owners: Collection[str]) -> int:
    """Drop every lease of the processes ``owners`` (workers found gone without leaving: their
    streams ended with them): their keys' quotas are whole at once, not once the leases would
    have expired. How many were dropped. A worker that drained first has left the ring alive and
    is not found gone: its leases stay while its streams finish, and expire if it dies then."""
    dropped, owners = 0, set(owners)
    async for key in redis.scan_iter(match=lease_key("*"), count=100):
        stale = [m for m in await redis.zrange(key, 0, -1) if m.rsplit(":", 1)[0] in owners]
        if stale:
            dropped += await redis.zrem(key, *stale)
    if dropped:
        log.info("dropped %d stream leases of %s (gone)", dropped, ", ".join(sorted(owners)))
    return dropped


def _whose(key_id: str) -> str:
    """What a refusal calls the holder of ``key_id``'s streams: an API key, or a token bound to
    a stream count (``TokenStreams.admission_key``)."""
    return "this token" if key_id.startswith(TOKEN_STREAMS_PREFIX) else "this API key"
