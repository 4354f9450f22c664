"""What Redis holds for the cluster, and the one place that knows its key names.

- ``vh:member:<worker>``: a worker's URL, load, base model (its adapter rules, built-in voices),
  expiring ``worker_ttl_seconds`` after its last heartbeat; ``vh:members`` indexes them (a
  sorted set by heartbeat time, itself expiring).
- ``vh:alive``: rewritten by every heartbeat, expiring with the index: its absence tells a
  gateway that Redis lost its data (workers that left or died leave it behind).
- ``vh:session:<id>``: the worker a session is pinned to, expiring ``session_ttl_seconds`` after
  its last use.
- ``vh:voice:<id>`` and the ``vh:voices`` index: the voice directory's records (the voice's live
  version, and ``newest``), and ``vh:voice:<id>@<n>``: each version's; the only keys without a
  TTL.
- ``vh:lease:<key id>``: the streams an API key holds in the cluster (``leases.py``), each
  expiring unless its worker refreshes it.
- ``vh:jobs:<model>``: each base model's clone-job stream, with its consumer group ``trainers``
  (``jobs.py``).
- ``vh:audit`` and ``vh:audit:head``: the audit trail's stream (entry id = the event's seq) and
  the chain's last seq and hash, written together by one script (``audit.py``), expiring 30 days
  after the last event (the shared store's mirror holds every event).
- ``vh:usage:<minute>`` and the ``vh:usage:minutes`` index: usage summed per minute, per key,
  tenant and voice (``usage.py``), expiring after ``usage_retention_days``.
- ``vh:lexicons:<tenant>``: a tenant's pronunciation lexicons (name -> document), a copy of the
  shared store's files, without a TTL (``lexicons.py``).

The client's timeouts, retries and pool size are pinned from the settings: a Redis that stops
answering costs a request at most about ``(retries + 1) x timeout``, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voicehost.cluster.ring import WorkerRing
from voicehost.config import Settings
from voicehost.ids import voice_ref
from voicehost.speech.admission import WorkerLoad
from voicehost.voices.validation import AdapterRules

log = logging.getLogger(__name__)

PREFIX = "vh:"
MEMBERS = f"{PREFIX}members"
ALIVE = f"{PREFIX}alive"
VOICES = f"{PREFIX}voices"
JOBS_STREAM = f"{PREFIX}jobs"
AUDIT_STREAM = f"{PREFIX}audit"
AUDIT_HEAD = f"{PREFIX}audit:head"
USAGE_MINUTES = f"{PREFIX}usage:minutes"
USAGE_APPLIED = f"{PREFIX}usage:applied"
USAGE_FILLED = f"{PREFIX}usage:filled"
# set by a reconcile that found every voice of the store recorded (refreshed by each): gone with
# a FLUSHALL or a Redis restarted empty, so every process knows at once that lists would miss
# voices and health says rebuilding, until a reconcile has restored them all
REGISTRY_WHOLE = f"{PREFIX}registry:whole"
MEMBERS_INDEX_TTL_SECONDS = 3600


def member_key(worker_id: str) -> str:
    return f"{PREFIX}member:{worker_id}"


def session_key(session_id: str) -> str:
    return f"{PREFIX}session:{session_id}"


def lease_key(key_id: str) -> str:
    return f"{PREFIX}lease:{key_id}"


def voice_key(voice_id: str) -> str:
    return f"{PREFIX}voice:{voice_id}"


def usage_key(minute: int) -> str:
    return f"{PREFIX}usage:{minute}"


def lexicons_key(tenant: str | None) -> str:
    """A tenant's lexicons (name -> document); ``_shared``: those of no tenant."""
    return f"{PREFIX}lexicons:{tenant or '_shared'}"


def version_key(voice_id: str, version: int) -> str:
    """One version's record; the voice's own record (``voice_key``) holds a copy of the live
    one's fields, so that speaking with the live version is one read."""
    return f"{PREFIX}voice:{voice_ref(voice_id, version)}"


def connect(settings: Settings) -> Redis:
    """A client with explicit timeouts, retries and pool size (no call can hang on Redis)."""
    if not settings.redis_url:
        raise ValueError("cluster mode needs a Redis URL: pass --redis (or VOICEHOST_REDIS_URL)")
    pool = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_pool_size,
        timeout=settings.redis_timeout_seconds,  # wait for a free connection, then fail
        socket_timeout=settings.redis_timeout_seconds,
        socket_connect_timeout=settings.redis_timeout_seconds,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), settings.redis_retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=10,
        decode_responses=True,
        protocol=2,
    )
    return Redis(connection_pool=pool)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker as gateways see it."""

    worker_id: str
    url: str
    load: WorkerLoad
    base_model: str = ""  # the base model it serves (its voices' adapters declare it)
    voices: Mapping[str, str] = field(default_factory=dict)  # its model's built-in voices: language
    rules: AdapterRules | None = None  # what its model's adapters must be (None: not said)


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if this task has been asked to stop.

    redis-py can swallow a cancellation that arrives in the middle of a command (the command
    then returns, or fails as a ``RedisError``), and a polling loop would go on forever while
    whoever cancelled it waits: seen as a gateway whose shutdown hung. The task still counts the
    request, so loops around Redis calls check it after each one."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _attempt(step: Callable[[], Awaitable[None]], was_ok: bool, up: str, down: str) -> bool:
    """Run one Redis step; log only when Redis comes or goes. Returns whether it worked."""
    try:
        await step()
    except RedisError as exc:
        raise_if_cancelled()
        if was_ok:
            log.warning(down, exc)
        return False
    raise_if_cancelled()
    if not was_ok:
        log.info("%s", up)
    return True


class WorkerPresence:
    """A worker's membership: heartbeats that rewrite its whole record, so a worker re-registers
    by itself after Redis restarts or is flushed."""

    def __init__(
        self,
        redis: Redis,
        settings: Settings,
        worker_id: str,
        url: str,
        load: Callable[[], WorkerLoad],
        rules: Callable[[], AdapterRules] | None = None,
        voices: Mapping[str, str] | None = None,
    ) -> None:
        self.redis = redis
        self.worker_id = worker_id
        self.url = url
        self.load = load
        self.rules = rules  # the served model's (read at each heartbeat: known once it loads)
        self.voices = json.dumps(dict(voices or {}), ensure_ascii=False)  # its built-in voices
        self.interval = settings.heartbeat_seconds
        self.ttl_ms = int(settings.worker_ttl_seconds * 1000)
        self.registered = False
        self.left = False

    async def heartbeat(self) -> None:
        load = self.load()
        rules = self.rules() if self.rules is not None else None
        now_ms = int(time.time() * 1000)  # only orders the index; liveness is the key TTL
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                member_key(self.worker_id),
                mapping={
                    "url": self.url,
                    "base_model": rules.base_model if rules is not None else "",
                    "rules": rules.to_json() if rules is not None else "",
                    "voices": self.voices,
                    "active_streams": load.active_streams,
                    "loaded_adapters": load.loaded_adapters,
                    "capacity": load.capacity,
                    "headroom": load.headroom,
                },
            )
            pipe.pexpire(member_key(self.worker_id), self.ttl_ms)
            pipe.zadd(MEMBERS, {self.worker_id: now_ms})
            pipe.expire(MEMBERS, MEMBERS_INDEX_TTL_SECONDS)
            pipe.set(ALIVE, now_ms, ex=MEMBERS_INDEX_TTL_SECONDS)
            await pipe.execute()

    async def run(self) -> None:
        """Heartbeat until cancelled or ``leave`` is called; Redis errors are logged, retried.

        A heartbeat that comes late by half the TTL is logged: the process was starved of CPU or
        its event loop blocked, and gateways may have dropped it from the ring meanwhile."""
        last = time.monotonic()
        while not self.left:
            self.registered = await _attempt(
                self.heartbeat,
                self.registered,
                f"worker {self.worker_id} registered at {self.url}",
                "heartbeat failed (%s); serving on, retrying",
            )
            now = time.monotonic()
            if self.registered and now - last > self.interval + self.ttl_ms / 2000:
                log.warning(
                    "heartbeat came %.1f s apart (TTL %.1f s)", now - last, self.ttl_ms / 1e3
                )
            last = now
            # while Redis is away, try again sooner: re-register as soon as it is back
            await asyncio.sleep(self.interval if self.registered else self.interval / 4)

    async def leave(self) -> None:
        """Leave the ring now (drain): gateways stop sending new streams here."""
        self.left = True
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(member_key(self.worker_id))
                pipe.zrem(MEMBERS, self.worker_id)
                await pipe.execute()
        except RedisError as exc:
            log.warning("could not leave the ring (%s); the member key expires by itself", exc)


def _voices(text: str | None) -> dict[str, str]:
    """A member record's built-in voices (``{"pierre": "fr"}``); none from one that says none,
    or from a record that is not JSON (a record is never trusted to be well formed)."""
    try:
        voices = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(voices, dict):
        return {}
    return {str(k): str(v) for k, v in voices.items()}


def _rules(text: str | None, base_model: str) -> AdapterRules | None:
    """A member record's adapter rules; none from one that says none, or rules not of its own
    model, or that cannot be read (logged)."""
    if not text:
        return None
    try:
        rules = AdapterRules.from_json(text)
    except ValueError as exc:
        log.warning("a worker's adapter rules are unreadable (%s)", exc)
        return None
    return rules if rules.base_model == base_model else None


def _serving(workers: Mapping[str, WorkerInfo]) -> dict[str, tuple]:
    """What a membership serves: each worker's model, its rules and built-in voices."""
    return {
        w: (info.base_model, info.rules, tuple(sorted(info.voices.items())))
        for w, info in workers.items()
    }


def rings_by_model(served: Mapping[str, str]) -> dict[str, WorkerRing]:
    """A ring per base model, of the workers (``{worker: base model}``) that serve it: a voice
    is placed, spread when hot and failed over within its own model's ring. A worker that says
    no model (one from before models were said) is in every ring, and in ``""``'s."""
    anyone = [worker for worker, model in served.items() if not model]
    models = {model for model in served.values() if model}
    rings = {
        model: WorkerRing([w for w, m in served.items() if m == model] + anyone) for model in models
    }
    if anyone:
        rings[""] = WorkerRing(anyone)
    return rings


class Membership:
    """A gateway's view of the live workers, refreshed every poll interval.

    A worker is live while its member key exists (its TTL runs on Redis' clock, so clocks of the
    machines need not agree). While Redis is unreachable, the last membership seen is kept. A
    membership that drops to nothing because Redis lost its data (came back empty, or was
    flushed, before the workers' next heartbeats: ``vh:alive`` is gone too) is not believed for
    ``hold_empty_seconds`` (the worker TTL): live workers re-register within a heartbeat. Workers
    that drained or expired leave ``vh:alive`` behind, and an empty ring is believed at once.
    """

    def __init__(self, redis: Redis, poll_seconds: float, hold_empty_seconds: float = 0.0) -> None:
        self.redis = redis
        self.poll_seconds = poll_seconds
        self.hold_empty_seconds = hold_empty_seconds
        self.workers: dict[str, WorkerInfo] = {}
        self.ring = WorkerRing([])
        self.rings: dict[str, WorkerRing] = {}  # a ring per base model the workers serve
        self._serving: dict[str, tuple[str, tuple]] = {}  # what the last membership served
        # told each new membership (a gateway learns the built-in voices of its workers' models)
        self.on_change: Callable[[Mapping[str, WorkerInfo]], None] | None = None
        # told which workers a poll found gone without leaving (their member keys expired)
        self.on_gone: Callable[[list[str]], Awaitable[object]] | None = None
        self.redis_ok = False
        self._empty_since: float | None = None  # when a poll first found no worker at all

    async def refresh(self) -> None:
        ids = await self.redis.zrange(MEMBERS, 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker_id in ids:
                pipe.hgetall(member_key(worker_id))
            records = await pipe.execute()
        gone = [w for w, record in zip(ids, records, strict=True) if not record]
        if gone:  # their member keys expired: prune the index (no clocks compared)
            await self.redis.zrem(MEMBERS, *gone)
            log.warning("workers gone without leaving: %s", ", ".join(sorted(gone)))
            if self.on_gone is not None:
                await self.on_gone(gone)
        workers = {}
        for worker_id, record in zip(ids, records, strict=True):
            if record and record.get("url"):
                active, capacity = (
                    int(record.get("active_streams", 0)),
                    int(record.get("capacity", 0)),
                )
                load = WorkerLoad(
                    active,
                    int(record.get("loaded_adapters", 0)),
                    capacity,
                    int(record.get("headroom", max(0, capacity - active))),
                )
                base_model = record.get("base_model", "")
                voices = _voices(record.get("voices"))
                rules = _rules(record.get("rules"), base_model)
                workers[worker_id] = WorkerInfo(
                    worker_id, record["url"], load, base_model, voices, rules
                )
        if not workers and self.workers and not await self.redis.exists(ALIVE):
            if self._hold_empty():
                return
        self._empty_since = None
        served = {w: info.base_model for w, info in workers.items()}
        serving = _serving(workers)
        changed = serving != self._serving
        self._serving = serving
        if changed:
            log.info("workers: %s", ", ".join(sorted(workers)) or "none")
            self.ring = WorkerRing(workers)
            self.rings = rings_by_model(served)
        self.workers = workers  # set together with the rings, with no await between them
        if changed and self.on_change is not None:
            self.on_change(workers)

    def _hold_empty(self) -> bool:
        """Whether to keep the last membership over one that Redis lost (see above)."""
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
            log.warning(
                "redis lost the membership: keeping the last one for up to %.1f s",
                self.hold_empty_seconds,
            )
        return now - self._empty_since < self.hold_empty_seconds

    async def run(self) -> None:
        while True:
            self.redis_ok = await _attempt(
                self.refresh,
                self.redis_ok,
                "redis reachable",
                "redis unreachable (%s); routing on the last membership",
            )
            await asyncio.sleep(self.poll_seconds)


class SessionPins:
    """Session id -> worker, in Redis with a TTL refreshed on use (and a local copy for when
    Redis is down)."""

    LOCAL_LIMIT = 100_000

    def __init__(self, redis: Redis, ttl_seconds: float) -> None:
        self.redis = redis
        self.ttl = max(1, int(ttl_seconds))
        self._local: dict[str, str] = {}

    def local(self, session_id: str) -> str | None:
        """The pin as this process last set or saw it (for when Redis is down)."""
        return self._local.get(session_id)

    async def get(self, session_id: str) -> str | None:
        try:
            worker = await self.redis.getex(session_key(session_id), ex=self.ttl)
        except RedisError:
            return self.local(session_id)
        if worker:
            self._remember(session_id, worker)
        return worker

    async def pin(self, session_id: str, worker_id: str, remote: bool = True) -> None:
        self._remember(session_id, worker_id)
        if not remote:
            return
        try:
            await self.redis.set(session_key(session_id), worker_id, ex=self.ttl)
        except RedisError as exc:
            log.warning("session pin kept locally only (%s)", exc)

    def _remember(self, session_id: str, worker_id: str) -> None:
        if len(self._local) >= self.LOCAL_LIMIT:
            self._local.clear()
        self._local[session_id] = worker_id
