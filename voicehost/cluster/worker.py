"""A cluster worker: a serving process (``voicehost.api.server``) with its links to the cluster:
its identity, Redis, the shared voice directory with a local adapter cache, the clone-job queue,
its presence in the ring, and the uploads it checks for the gateways (``cluster.intake``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiohttp import web

from voicehost.api.auth import AUTH, INTERNAL_TOKEN_HEADER
from voicehost.api.edge import WORKER_HEADER, Handler
from voicehost.api.lifecycle import serve_host
from voicehost.api.server import create_app, serve
from voicehost.cluster.adapters import AdapterCache, SharedDirStore
from voicehost.cluster.audit import RedisAuditTrail
from voicehost.cluster.intake import INTAKE_ROUTES
from voicehost.cluster.jobs import RedisJobQueue
from voicehost.cluster.leases import KeyLeases
from voicehost.cluster.lexicons import RedisLexicons, shared_lexicons
from voicehost.cluster.state import WorkerPresence, connect
from voicehost.cluster.usage import ClusterUsageStore
from voicehost.cluster.voices import RECORD_HEADER, RedisVoiceDirectory
from voicehost.config import Settings
from voicehost.host.frontend import FrontEnd
from voicehost.model.served import adapter_rules, served_languages
from voicehost.speech.admission import WorkerLoad
from voicehost.voices.validation import AdapterRules


def worker_identity(settings: Settings) -> tuple[str, str]:
    """This worker's stable id and the URL gateways reach it at."""
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
    worker_id = settings.worker_id or f"{socket.gethostname()}-{settings.port}"
    url = settings.advertise_url or f"http://{host}:{settings.port}"
    return worker_id, url.rstrip("/")


class WorkerCluster:
    """What ``voicehost worker`` adds to a serving process (a ``serving.ClusterLink``)."""

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
        self.directory: RedisVoiceDirectory | None = None
        self.leases = KeyLeases(self.redis, self.worker_id)
        self.audit = RedisAuditTrail(self.redis, settings.audit_file(cluster=True))

    def voice_directory(
        self, builtin: Mapping[str, str] | Iterable[str], rules: AdapterRules
    ) -> RedisVoiceDirectory:
        self.directory = RedisVoiceDirectory(
            self.redis, self.store, builtin, rules, cache=self.cache, owner=self.worker_id
        )
        return self.directory

    def job_queue(self) -> RedisJobQueue:
        sweep = self.settings.job_lease_seconds / 3
        model = self.settings.served_base_name()  # its model's jobs only
        return RedisJobQueue(self.redis, self.worker_id, model, sweep_seconds=sweep)

    def audit_trail(self) -> RedisAuditTrail:
        return self.audit

    def usage_store(self) -> ClusterUsageStore:
        s = self.settings
        return ClusterUsageStore(
            self.redis, s.usage_mirror_dir(), self.worker_id, s.usage_retention_days
        )

    def lexicon_store(self) -> RedisLexicons:
        return shared_lexicons(self.redis, self.settings)

    def join(self, load: Callable[[], WorkerLoad], ring: bool = True) -> Coroutine[Any, Any, None]:
        if ring:
            self.presence = WorkerPresence(
                self.redis,
                self.settings,
                self.worker_id,
                self.url,
                load,
                self._rules,
                served_languages(self.settings).voices,
            )
        return self._serve_cluster(self.presence)

    def _rules(self) -> AdapterRules:
        """The served model's adapter rules, as its voice directory has them (its shape once
        the model has loaded), else the settings'."""
        if self.directory is not None:
            return self.directory.models.own
        return adapter_rules(self.settings)

    async def _serve_cluster(self, presence: WorkerPresence | None) -> None:
        """The leases of this process's streams and its audit events kept; on the ring,
        heartbeats and the voice records rebuilt from the store whenever Redis lost them."""
        tasks = [self.leases.refresh_forever(), self.audit.keep_forever()]
        if presence is not None:
            tasks.append(presence.run())
            if self.directory is not None:
                seconds = self.settings.registry_reconcile_seconds
                tasks.append(self.directory.reconcile_forever(seconds))
        await asyncio.gather(*tasks)

    def key_stream(self, key_id: str, limit: int) -> AbstractAsyncContextManager[None]:
        return self.leases.hold(key_id, limit)

    async def leave(self) -> None:
        if self.presence is not None:
            await self.presence.leave()

    async def close(self) -> None:
        await self.leave()
        await self.redis.aclose()


def create_worker_app(settings: Settings, frontend: FrontEnd | None = None) -> web.Application:
    """A serving app whose voices and jobs live in Redis and the shared store, naming itself in
    every response (``X-Voicehost-Worker``), that checks uploads for the gateways
    (``voicehost.cluster.intake``); ``frontend``: one of a host's front ends, the host being
    one worker (one ring member, one load figure)."""
    cluster = WorkerCluster(settings)
    app = create_app(settings, cluster, frontend, INTAKE_ROUTES)

    async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = cluster.worker_id

    @web.middleware
    async def gateway_records(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Keep the voice record a gateway sent (only the gateway's word counts)."""
        record = request.headers.get(RECORD_HEADER)
        auth = request.app[AUTH]
        trusted = not auth.enabled or auth.is_gateway(request.headers.get(INTERNAL_TOKEN_HEADER))
        if record and trusted and cluster.directory is not None:
            cluster.directory.offer(record)
        return await handler(request)

    app.middlewares.append(gateway_records)
    app.on_response_prepare.append(name_worker)
    return app


def serve_worker_frontend(settings: Settings, frontend: FrontEnd, sock: socket.socket) -> None:
    """A front end of a worker's host (``voicehost.host.launcher.FrontEndMain``)."""
    serve(settings, create_worker_app(settings, frontend), sock=sock)


def serve_worker(settings: Settings) -> None:
    if settings.frontend_count() > 1:
        serve_host(settings, serve_worker_frontend, role="worker")
        return
    serve(settings, create_worker_app(settings))
