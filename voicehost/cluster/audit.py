"""A cluster's audit trail: one hash chain for every gateway and worker, through Redis, mirrored
to the shared store.

Who appends: any process, with one script (``APPEND``) that checks the chain's head
(``vh:audit:head``: the last seq and the SHA-256 of its line) is the one the process chained its
line to, and only then adds the line to the stream ``vh:audit`` (entry id = its seq) and moves
the head, atomically. A process that lost the race is told the new head, chains its line again
and retries. Redis has no SHA-256, so the line and its hash are made by the process; the script
only compares.

The mirror: after each append the process copies the stream's lines the shared store's file
lacks into it (``AuditLog.extend``, under a file lock; idempotent, so any process may catch it
up), before ``record`` returns. Readers read the mirror. If Redis loses its data (a restart
without it, a flush), the head is gone: every append passes the mirror's head as a floor, and the
script continues the chain from there, so the chain stays one across the loss. While Redis is
away, events wait in the process's memory and are appended, in order, once it is back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.cluster.state import AUDIT_HEAD, AUDIT_STREAM, raise_if_cancelled
from voicehost.tenancy.audit import (
    GENESIS,
    MAX_PENDING,
    AuditLog,
    AuditPage,
    AuditQuery,
    ChainBroken,
    Change,
    Head,
    canonical,
    line_hash,
)

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

STREAM_TTL_SECONDS = 30 * 24 * 3600
STREAM_MAX_ENTRIES = 100_000  # Redis keeps the recent ones; the mirror keeps all
MIRROR_BATCH = 1000
RETRY_SECONDS = 1.0
# KEYS: head, stream. ARGV: the head the line was chained to (seq, hash), the mirror's head
# (seq, hash: where the chain resumes if Redis lost its own), the line, its hash, the genesis
# hash, the stream's cap, its TTL. Returns {1, seq, hash} once appended, {0, seq, hash} (the
# head now) if the line was chained to another head.
APPEND = """
local seq, hash = 0, ARGV[7]
local head = redis.call('GET', KEYS[1])
if head then
  local space = string.find(head, ' ')
  seq = tonumber(string.sub(head, 1, space - 1))
  hash = string.sub(head, space + 1)
end
if tonumber(ARGV[3]) > seq then
  seq = tonumber(ARGV[3])
  hash = ARGV[4]
end
if seq ~= tonumber(ARGV[1]) or hash ~= ARGV[2] then
  return {0, tostring(seq), hash}
end
local next_seq = tostring(seq + 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], next_seq .. '-0', 'line', ARGV[5])
redis.call('SET', KEYS[1], next_seq .. ' ' .. ARGV[6], 'EX', ARGV[9])
redis.call('EXPIRE', KEYS[2], ARGV[9])
return {1, next_seq, ARGV[6]}
"""


class RedisAuditTrail:
    """``AuditTrail`` of a cluster process: appends through Redis, reads the mirror."""

    def __init__(self, redis: Redis, mirror: Path, breaks: Counter | None = None) -> None:
        self.redis = redis
        self.mirror = AuditLog(mirror)
        self.breaks = breaks  # appends that found the chain broken (``ChainBroken``)
        self._append = redis.register_script(APPEND)
        self._head = Head()  # the chain's head as this process last saw it
        self._pending: list[Change] = []
        self._order = asyncio.Lock()  # this process's events go in the order they happened
        self._redis_ok = True

    async def record(self, change: Change) -> None:
        async with self._order:
            self._pending = [*self._pending, change][-MAX_PENDING:]
            await self._flush()

    async def _flush(self) -> None:
        """Append the pending events, then bring the mirror up to date."""
        try:
            while self._pending:
                await self._append_one(self._pending[0])
                self._pending.pop(0)
            await self.catch_up()
        except ChainBroken as exc:
            log.error("audit events wait in memory (%d): %s", len(self._pending), exc)
            if self.breaks is not None:
                self.breaks.inc()
            self._redis_ok = False
            return
        except (RedisError, OSError) as exc:
            if self._redis_ok:
                log.warning("audit events wait in memory (%d): %s", len(self._pending), exc)
            self._redis_ok = False
            return
        except Exception:  # a damaged mirror (verify says where): never the caller's failure
            log.exception("audit events wait in memory (%d)", len(self._pending))
            self._redis_ok = False
            return
        if not self._redis_ok:
            log.info("audit trail written again")
        self._redis_ok = True

    async def _append_one(self, change: Change) -> None:
        floor = await asyncio.to_thread(self.mirror.head)
        head = self._head if self._head.seq > floor.seq else floor
        while True:
            line = canonical(change.event(head.seq + 1, head.hash))
            digest = line_hash(line)
            appended, seq, current = await self._append(
                keys=[AUDIT_HEAD, AUDIT_STREAM],
                args=[
                    head.seq,
                    head.hash,
                    floor.seq,
                    floor.hash,
                    line,
                    digest,
                    GENESIS,
                    STREAM_MAX_ENTRIES,
                    STREAM_TTL_SECONDS,
                ],
            )
            head = Head(int(seq), str(current))
            if appended:
                self._head = head
                return

    async def catch_up(self) -> Head:
        """Copy the stream's lines after the mirror's last into it; returns the mirror's head."""
        head = await asyncio.to_thread(self.mirror.head)
        while True:
            entries = await self.redis.xrange(
                AUDIT_STREAM, min=f"{head.seq + 1}-0", max="+", count=MIRROR_BATCH
            )
            if not entries:
                return head
            lines = [fields["line"] for _id, fields in entries]
            extended = await asyncio.to_thread(self.mirror.extend, lines)
            if extended.seq == head.seq:  # a gap the stream no longer holds: nothing to add
                raise ChainBroken(
                    f"the mirror ends at seq {head.seq}; the stream's next line is seq "
                    f"{json.loads(lines[0])['seq']} or does not chain to it"
                )
            head = extended

    async def read(self, query: AuditQuery) -> AuditPage:
        async with self._order:
            await self._flush()  # what is in Redis but not yet mirrored, and what waits here
        return await asyncio.to_thread(self.mirror.read, query)

    async def keep_forever(self) -> None:
        """Retry waiting events every second (as a task), so they are written soon after
        Redis returns even if nothing else happens."""
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            if self._pending:
                async with self._order:
                    await self._flush()
            raise_if_cancelled()
