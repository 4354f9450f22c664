"""A worker's links to the cluster: its identity, Redis, the shared voice registry with a local
adapter cache, the clone-job stream, and its presence in the ring."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from voicehost.cluster.adapters import AdapterCache, SharedDirStore
from voicehost.cluster.jobs import StreamQueue
from voicehost.cluster.state import WorkerLoad, WorkerPresence, connect
from voicehost.cluster.voices import RedisVoiceRegistry
from voicehost.config import Settings
from voicehost.voices import AdapterRules


def worker_identity(settings: Settings) -> tuple[str, str]:
    """This worker's stable id and the URL gateways reach it at."""
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
    worker_id = settings.worker_id or f"{socket.gethostname()}-{settings.port}"
    url = settings.advertise_url or f"http://{host}:{settings.port}"
    return worker_id, url.rstrip("/")


class WorkerCluster:
    """What ``voicehost worker`` adds to a serving runtime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.worker_id, self.url = worker_identity(settings)
        self.redis = connect(settings)
        self.store = SharedDirStore(settings.shared_dir)
        self.cache = AdapterCache(
            settings.adapter_cache_dir / self.worker_id,
            int(settings.adapter_cache_mb * 1e6),
            self.store,
        )
        self.presence: WorkerPresence | None = None

    def voice_registry(self, builtin: Iterable[str], rules: AdapterRules) -> RedisVoiceRegistry:
        return RedisVoiceRegistry(
            self.redis, self.store, builtin, rules, cache=self.cache, owner=self.worker_id
        )

    def job_queue(self) -> StreamQueue:
        return StreamQueue(self.redis, self.worker_id)

    def join(self, load: Callable[[], WorkerLoad]) -> WorkerPresence:
        self.presence = WorkerPresence(self.redis, self.settings, self.worker_id, self.url, load)
        return self.presence

    async def close(self) -> None:
        if self.presence is not None:
            await self.presence.leave()
        await self.redis.aclose()
