"""The cluster's clone-job queue: a Redis stream read by the workers through one consumer group.

Why a stream with a consumer group (and not a list, or a queue library): each job goes to one
worker at once; an entry stays pending until that worker acknowledges it, and one a stopped worker
left pending is claimed after ``CLAIM_IDLE_MS`` (``XAUTOCLAIM``). The stream is the fast path, not
the record: who runs a job is decided by its lease on the shared store (``CloneJobs``), and an idle
worker also looks in the jobs folder every third of the lease (``CloneJobs.orphans``), so a job
whose runner died is taken over once its lease lapses, and one whose entry Redis lost (restarted
empty, flushed) is still run. Job state itself stays in ``job.json`` on the shared store, where
the gateways read it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from voicehost.cloning.jobs import LEASE_SECONDS, CloneJobs
from voicehost.cluster.state import JOBS_STREAM, raise_if_cancelled

log = logging.getLogger(__name__)

GROUP = "trainers"
CLAIM_IDLE_MS = 60_000
STREAM_TTL_SECONDS = 30 * 24 * 3600
STREAM_MAX_ENTRIES = 10_000
SWEPT = ""  # the receipt of a job found in the jobs folder: no stream entry to keep or ack


def jobs_stream(base_model: str) -> str:
    """The stream of one base model's jobs (a worker takes its own model's only); ``vh:jobs``
    for jobs that name none."""
    return f"{JOBS_STREAM}:{base_model}" if base_model else JOBS_STREAM


class RedisJobQueue:
    """``JobQueue`` over the job streams; ``consumer`` is the worker's id, ``base_model`` the
    name of the model whose jobs it takes (``jobs_stream``)."""

    def __init__(
        self,
        redis: Redis,
        consumer: str,
        base_model: str = "",
        poll_seconds: float = 1.0,
        sweep_seconds: float = LEASE_SECONDS / 3,
    ) -> None:
        self.redis = redis
        self.consumer = consumer
        self.stream = jobs_stream(base_model)  # the one this queue takes from
        self.poll_seconds = poll_seconds
        self.sweep_seconds = sweep_seconds
        self._swept = 0.0
        self._own_pending_checked = False
        self._redis_ok = True  # as last seen: Redis' comings and goings are logged once each

    async def _ensure_group(self, stream: str) -> None:
        try:
            await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            await self.redis.expire(stream, STREAM_TTL_SECONDS)

    async def put(self, job_id: str, base_model: str) -> None:
        stream = jobs_stream(base_model)
        await self._ensure_group(stream)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(stream, {"job": job_id}, maxlen=STREAM_MAX_ENTRIES, approximate=True)
            pipe.expire(stream, STREAM_TTL_SECONDS)
            await pipe.execute()

    async def _next(self) -> tuple[str, str] | None:
        await self._ensure_group(self.stream)
        if not self._own_pending_checked:  # after a restart: what this worker had taken
            mine = await self.redis.xreadgroup(GROUP, self.consumer, {self.stream: "0"}, count=1)
            if mine and mine[0][1]:
                return await self._entry(*mine[0][1][0])
            self._own_pending_checked = True
        claimed = await self.redis.xautoclaim(
            self.stream, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=1
        )
        if claimed and claimed[1]:
            log.info("claiming a clone job from a worker that stopped: %s", claimed[1][0])
            return await self._entry(*claimed[1][0])
        fresh = await self.redis.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=1)
        if fresh and fresh[0][1]:
            return await self._entry(*fresh[0][1][0])
        return None

    async def _entry(self, entry_id: str, fields: dict[str, str] | None) -> tuple[str, str] | None:
        """The job of a stream entry; an entry without one (trimmed, foreign) is acknowledged."""
        job_id = (fields or {}).get("job")
        if not job_id:
            await self.redis.xack(self.stream, GROUP, entry_id)
            return None
        return job_id, entry_id

    async def take(self, jobs: CloneJobs) -> tuple[str, str]:
        while True:
            try:
                found = await self._next()
                if not self._redis_ok:  # one line when Redis returns, one when it goes
                    log.info("clone-job queue reachable again")
                self._redis_ok = True
            except RedisError as exc:
                if self._redis_ok:
                    log.warning("clone-job queue unavailable (%s); retrying quietly", exc)
                self._redis_ok = False
                found = None
            except Exception:  # whatever is in the stream, the queue keeps running
                log.exception("reading the clone-job queue failed; retrying")
                found = None
            raise_if_cancelled()
            if found is None and time.monotonic() - self._swept >= self.sweep_seconds:
                self._swept = time.monotonic()
                found = await self._sweep(jobs)
            if found is not None:
                return found
            await asyncio.sleep(self.poll_seconds)

    async def _sweep(self, jobs: CloneJobs) -> tuple[str, str] | None:
        """A job that needs a runner though the stream did not offer it (its runner died; its
        entry was lost with Redis' data), from the jobs folder; its receipt is not an entry."""
        try:
            waiting = await asyncio.to_thread(jobs.orphans)
        except OSError as exc:
            log.warning("could not look for clone jobs in the shared store (%s)", exc)
            return None
        if waiting:
            log.info("clone job %s needs a runner; taking it from the jobs folder", waiting[0])
            return waiting[0], SWEPT
        return None

    async def keep(self, receipt: str) -> None:
        """Reset the entry's idle time, so no other worker claims a job still training."""
        if receipt == SWEPT:
            return
        try:
            await self.redis.xclaim(self.stream, GROUP, self.consumer, 0, [receipt], justid=True)
        except RedisError as exc:
            log.warning("could not refresh the claim on %s (%s)", receipt, exc)

    async def done(self, receipt: str) -> None:
        if receipt == SWEPT:
            return
        try:
            await self.redis.xack(self.stream, GROUP, receipt)
        except RedisError as exc:  # redelivered later; a finished job is then skipped
            log.warning("could not acknowledge %s (%s)", receipt, exc)
