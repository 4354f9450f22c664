"""The gateway: the public API of a cluster, stateless, as many as you like.

Speech requests and realtime sockets are proxied to a worker chosen by the voice's place on the
ring (bounded loads, hot voices replicated, sessions pinned), over one keep-alive client session.
One that fails or is refused before its first byte (a socket: its upgrade) is retried once on the
next worker; one that each worker tried refused through no fault of its own gets their code and
when to retry (503 with ``Retry-After``; on a socket, an error event with ``retry_after``); a
stream cut mid-way ends with a terminal error (an SSE error event, or a response cut short
without its last chunk), never a hang. Requests are checked, and voices looked up, by the same
edge as ``voicehost serve`` (``voicehost.api.edge``); voice and job routes are the same handlers,
over the Redis voice directory and the shared store. Clients are authenticated here
(``voicehost.api.auth``); a worker gets each request with the internal token and the caller, and
checks the voice's tenant again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from aiohttp import WSCloseCode, web
from pydantic import BaseModel, ConfigDict, StrictStr

from voicehost.api import lifecycle
from voicehost.api.auth import ADMIN, AUTH, request_principal
from voicehost.api.edge import (
    REQUEST_ID_HEADER,
    VERSION_HEADER,
    WORKER_HEADER,
    end_broken_stream,
    error_event,
    error_response,
    find_voice,
    read_body,
    request_id,
)
from voicehost.api.errors import ERRORS, ApiError
from voicehost.api.listeners import Listener, NotText
from voicehost.api.openapi import TEXT, Json, json_body, operation, ref
from voicehost.api.realtime import ERROR_CODE_HEADER, MAX_MESSAGE_BYTES, SessionWork, serve_socket
from voicehost.api.routes import CAPTIONED_PATH, Route, public_app
from voicehost.api.speech import (
    CaptionedSpeechRequest,
    RealtimeConfig,
    SpeechRequest,
    check_speech_request,
)
from voicehost.api.webrtc import open_session
from voicehost.cloning.jobs import CloneJobs, add_to
from voicehost.cluster.adapters import SharedDirStore
from voicehost.cluster.audit import RedisAuditTrail
from voicehost.cluster.intake import WorkerIntake
from voicehost.cluster.jobs import RedisJobQueue
from voicehost.cluster.leases import release_owners
from voicehost.cluster.lexicons import shared_lexicons
from voicehost.cluster.ring import choose_worker
from voicehost.cluster.state import Membership, SessionPins, WorkerInfo, connect
from voicehost.cluster.usage import ClusterUsageStore
from voicehost.cluster.voices import RECORD_HEADER, RedisVoiceDirectory
from voicehost.config import Settings
from voicehost.ids import split_voice_ref, voice_ref
from voicehost.metrics import RingMetrics, SpeechMetrics
from voicehost.model.served import adapter_rules, served_languages
from voicehost.speech.admission import Refused
from voicehost.tenancy.keys import Principal
from voicehost.tenancy.usage import UsageLedger
from voicehost.voices.voice import Voice

# --- its wire models ---


class RouteRequest(BaseModel):
    """``POST /v1/cluster/route`` (a gateway): the voices whose owners on the ring to name."""

    model_config = ConfigDict(extra="forbid")

    voices: list[StrictStr]


log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"
RETRYABLE = (502, 503, 504, 500)
CONNECT_TIMEOUT_SECONDS = 2.0
POOL_WAIT_SECONDS = 10.0
Opened = TypeVar("Opened")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A worker's refusal through no fault of its own (503 with ``Retry-After``: at capacity,
    draining, Redis away): its code, its message and when to retry; another worker, or the same
    one later, can serve the stream."""

    code: str
    message: str
    retry_after: int


class UpstreamFailed(Exception):
    """The chosen worker failed, or refused (``refusal``), before its first byte."""

    def __init__(self, message: str, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class Gateway:
    """The routing state of one gateway process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = SpeechMetrics()
        self.redis = connect(settings)
        self.membership = Membership(
            self.redis, settings.membership_poll_seconds, settings.worker_ttl_seconds
        )
        self.ring_metrics = RingMetrics(self.metrics.registry, lambda: len(self.membership.workers))
        self.membership.on_gone = self._workers_gone
        self.pins = SessionPins(self.redis, settings.session_ttl_seconds)
        rules = adapter_rules(settings)
        store = SharedDirStore(settings.shared_dir)
        self.languages = served_languages(settings)
        self.voices = RedisVoiceDirectory(
            self.redis, store, self.languages.voices, rules, owner="gateway"
        )
        self.membership.on_change = self._learn_voices
        queue = RedisJobQueue(self.redis, "gateway")
        self.metrics.watch_registry(self.voices.missing)
        self.audit = RedisAuditTrail(
            self.redis, settings.audit_file(cluster=True), self.metrics.audit_chain_breaks
        )
        self.jobs = CloneJobs(
            settings.shared_dir / "jobs", add_to(self.voices), queue, "gateway", audit=self.audit
        )
        self.intake = WorkerIntake(self.ask, settings)  # an upload's checks, on a worker
        # a gateway speaks nothing: its ledger only reads the workers' sums
        usage = ClusterUsageStore(
            self.redis, settings.usage_mirror_dir(), "gateway", settings.usage_retention_days
        )
        self.usage = UsageLedger(usage, None)
        self.lexicons = shared_lexicons(self.redis, settings)
        self.in_flight: Counter[str] = Counter()  # streams this gateway has open, per worker
        self._stream_ended = asyncio.Event()
        self.draining = False  # SIGTERM: not ready, the streams relayed finishing
        self.voice_streams: Counter[str] = Counter()
        self.client: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def drain(self) -> None:
        """Say not ready (``/readyz`` 503, so a load balancer stops sending), then return once
        no stream this gateway relays is open."""
        self.draining = True
        while sum(self.in_flight.values()):
            self._stream_ended.clear()
            await self._stream_ended.wait()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.settings.proxy_connections, keepalive_timeout=60
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=POOL_WAIT_SECONDS,  # includes waiting for a free pooled connection
            sock_connect=CONNECT_TIMEOUT_SECONDS,
            sock_read=self.settings.upstream_timeout_seconds,  # wedged worker: a clear error
        )
        self.client = aiohttp.ClientSession(connector=connector, timeout=timeout)
        self._tasks.append(asyncio.create_task(self.membership.run(), name="membership"))
        reconcile = self.voices.reconcile_forever(self.settings.registry_reconcile_seconds)
        self._tasks.append(asyncio.create_task(reconcile, name="registry-reconcile"))
        self._tasks.append(asyncio.create_task(self.audit.keep_forever(), name="audit"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
        await self.redis.aclose()

    async def _workers_gone(self, gone: list[str]) -> None:
        """Workers the membership found gone without leaving: counted lost, and their stream
        leases dropped (their keys' quotas whole for the streams their clients start over)."""
        self.ring_metrics.lost.inc(len(gone))
        await release_owners(self.redis, gone)

    def _learn_voices(self, workers: Mapping[str, WorkerInfo]) -> None:
        """The built-in voices of every model the workers serve, each with its model and
        language (a French worker's ``pierre``), beside this gateway's own: listed, and routed
        to their model's workers (``model_unavailable`` once none is left). A name two models
        share is the first one's. And each model's adapter rules: an adapter registered here
        is checked by its own model's, a clone trained on the model of its language."""
        for info in workers.values():
            if not info.base_model:
                continue
            if info.rules is not None and self.voices.models.learn(info.rules):
                languages = ", ".join(info.rules.languages)
                log.info("base model %s (%s): its adapters taken", info.base_model, languages)
            for voice in self.voices.learn_builtin(info.voices, info.base_model):
                log.info("voice %s (%s) of %s", voice.voice_id, voice.language, voice.base_model)

    def replicas(self, voice_id: str) -> int:
        """How many ring successors a voice may spread over: more while it is hot."""
        return 1 + self.voice_streams[voice_id] // max(1, self.settings.hot_voice_streams)

    async def pick(
        self,
        voice_id: str,
        session_id: str | None,
        exclude: frozenset[str],
        base_model: str = "",
    ) -> WorkerInfo | None:
        """The worker for a new stream of ``voice_id``: its session's pinned one, else the
        least loaded near the voice on the ring of its ``base_model``'s workers (``""``: any
        worker's). ``Refused`` ``model_unavailable`` when workers live but none serves it."""
        pinned = None
        if session_id and self.membership.redis_ok:
            pinned = await self.pins.get(session_id)
        elif session_id:
            pinned = self.pins.local(session_id)
        ring, workers = self.membership.ring, self.membership.workers  # one consistent view
        if base_model and workers:
            rings = self.membership.rings
            found = rings.get(base_model) or rings.get("")  # "": workers that say no model
            if found is None:
                served = ", ".join(sorted({w.base_model for w in workers.values()}))
                message = f"no live worker serves {base_model} (they serve {served})"
                raise Refused("model_unavailable", message, MODEL_RETRY_SECONDS)
            ring = found
        if pinned in ring.workers and pinned not in exclude:
            return workers[pinned]
        # Workers that report no room (measured or static) only when no other has any.
        full = frozenset(w for w, info in workers.items() if info.load.headroom <= 0)
        chosen = None
        for skipped in (exclude | full, exclude) if full - exclude else (exclude,):
            chosen = choose_worker(
                ring,
                voice_id,
                self.in_flight,
                self.settings.load_factor,
                self.replicas(voice_id),
                skipped,
            )
            if chosen is not None:
                break
        if chosen is None:
            return None
        if session_id:
            await self.pins.pin(session_id, chosen, remote=self.membership.redis_ok)
        return workers[chosen]

    async def ask(
        self, key: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        """POST a JSON ``body`` to ``path`` on the worker ``key`` routes to (as a voice's
        stream does: the next one if that one fails), and read its whole answer: the worker's
        status and body. Counted as a stream of that worker's while it runs. Raises as
        ``_on_a_worker`` does (503 ``no_workers``, 502 ``upstream_failed``)."""
        opening = _on_a_worker(
            self, key, None, lambda w: _open_upstream(self, w, path, body, dict(headers))
        )
        async with opening as (upstream, first):
            try:  # a 200's first bytes are read already; the rest, or an error's body, now
                return upstream.status, first + await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                worker = upstream.headers.get(WORKER_HEADER)
                raise ApiError("upstream_failed", f"{worker}: cut mid-answer: {exc}") from exc
            finally:
                upstream.release()

    @contextmanager
    def streaming(self, worker_id: str, voice_id: str) -> Iterator[None]:
        """Count a stream of ``voice_id`` on ``worker_id`` for the ``with`` block (what bounded
        loads and hot voices go by)."""
        self.in_flight[worker_id] += 1
        self.voice_streams[voice_id] += 1
        try:
            yield
        finally:
            self.in_flight[worker_id] -= 1
            self.voice_streams[voice_id] -= 1
            self._stream_ended.set()
            if self.voice_streams[voice_id] <= 0:
                del self.voice_streams[voice_id]


GATEWAY = web.AppKey("gateway", Gateway)
MODEL_RETRY_SECONDS = 5  # a model's workers missing: about a worker's start, not a stream's end


@asynccontextmanager
async def _on_a_worker(
    gateway: Gateway,
    voice_id: str,
    session_id: str | None,
    open_on: Callable[[WorkerInfo], Awaitable[Opened]],
    base_model: str = "",
) -> AsyncIterator[Opened]:
    """What ``open_on`` opens (a response's first bytes, a socket) on the worker the ring picks
    for the voice, or else once more on the next one; that worker counts the stream for the
    ``async with`` block. When none took it: ``Refused`` (503, the workers' code) if each one
    tried refused, 502 ``upstream_failed`` if one failed, 503 ``no_workers`` with none."""
    failed: set[str] = set()
    errors: list[str] = []
    refusals: list[Refusal] = []  # of the workers tried, those that refused
    for _attempt in range(2):  # the first choice, then once on the next worker
        worker = await gateway.pick(voice_id, session_id, frozenset(failed), base_model)
        if worker is None:
            break
        with gateway.streaming(worker.worker_id, voice_id):
            try:
                opened = await open_on(worker)
            except UpstreamFailed as exc:
                gateway.metrics.errors.labels("upstream_before_first_byte").inc()
                log.warning("worker failed before the first byte: %s", exc)
                failed.add(worker.worker_id)
                errors.append(str(exc))
                if exc.refusal is not None:
                    refusals.append(exc.refusal)
                continue
            yield opened
            return
    if not errors:
        raise ApiError("no_workers", "no worker is available; try again shortly")
    if len(refusals) == len(errors):  # no worker failed: each refused, for now
        retry = min(r.retry_after for r in refusals)
        codes = {r.code for r in refusals}
        if codes == {"at_capacity"}:
            raise Refused("at_capacity", "every worker tried is at capacity", retry)
        code = codes.pop() if len(codes) == 1 else "no_workers"
        message = "; ".join(dict.fromkeys(r.message for r in refusals))
        raise Refused(code, message, retry)
    raise ApiError("upstream_failed", "; ".join(errors))


def _retry_after(headers: Mapping[str, str]) -> int | None:
    """A worker's ``Retry-After`` in seconds (1 if it is not a number), or None without one."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    return int(value) if value.isdigit() else 1


async def _open_upstream(
    gateway: Gateway, worker: WorkerInfo, path: str, body: bytes, headers: dict[str, str]
) -> tuple[aiohttp.ClientResponse, bytes]:
    """POST to the worker's ``path`` and read its first bytes; ``UpstreamFailed`` if that
    fails."""
    assert gateway.client is not None
    try:
        upstream = await gateway.client.post(
            f"{worker.url}{path}",
            data=body,
            headers={"Content-Type": "application/json", **headers},
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamFailed(f"{worker.worker_id}: {type(exc).__name__}: {exc}") from exc
    if upstream.status in RETRYABLE:
        try:
            text = await upstream.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            text = f"(unreadable body: {exc})"
        finally:
            upstream.release()
        refusal = None
        retry = _retry_after(upstream.headers)
        if upstream.status == 503 and retry is not None:
            refusal = Refusal(*_error_of(text), retry)
        raise UpstreamFailed(f"{worker.worker_id}: HTTP {upstream.status}: {text[:200]}", refusal)
    if upstream.status != 200:
        return upstream, b""
    try:
        first = await upstream.content.readany()
    except (aiohttp.ClientError, TimeoutError) as exc:
        upstream.release()
        raise UpstreamFailed(f"{worker.worker_id}: cut before the first byte: {exc}") from exc
    if not first:
        upstream.release()
        raise UpstreamFailed(f"{worker.worker_id}: empty response")
    return upstream, first


async def _open_upstream_socket(
    gateway: Gateway, worker: WorkerInfo, headers: dict[str, str]
) -> aiohttp.ClientWebSocketResponse:
    """Open the realtime socket on the worker; ``UpstreamFailed`` if that fails (refused with
    5xx, no connection), ``Refused`` for a key at its quota (429: in the whole cluster, so the
    caller's doing, and no other worker would take it either)."""
    assert gateway.client is not None
    try:
        return await gateway.client.ws_connect(
            f"{worker.url}/v1/audio/speech/ws", max_msg_size=MAX_MESSAGE_BYTES, headers=headers
        )
    except aiohttp.WSServerHandshakeError as exc:
        answer = exc.headers or {}
        code = answer.get(ERROR_CODE_HEADER)  # the body of a refused upgrade is not readable
        retry = _retry_after(answer)
        if exc.status == 429:
            retry = retry or 1
            raise Refused(
                code if code in ERRORS else "quota_exceeded",
                f"this API key already holds its most streams in the cluster; retry in {retry} s",
                retry,
            ) from exc
        failure = f"{worker.worker_id}: upgrade refused with HTTP {exc.status} ({code or exc})"
        if exc.status not in RETRYABLE:
            raise ApiError("upstream_failed", failure) from exc
        refusal = None
        if exc.status == 503 and retry is not None:
            code = code if code in ERRORS else "no_workers"
            refusal = Refusal(code, f"{worker.worker_id} refused the stream: {code}", retry)
        raise UpstreamFailed(failure, refusal) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamFailed(f"{worker.worker_id}: {type(exc).__name__}: {exc}") from exc


def _error_of(text: str) -> tuple[str, str]:
    """(code, message) of a worker's error body."""
    try:
        error = json.loads(text)["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "unavailable", text[:200]


def _record_ref(voice: Voice, requested: str) -> str:
    """Which record of ``voice`` a request names: its live one (``anna``, or an alias of it)
    or the version it pins (``anna@2``)."""
    return voice_ref(voice.voice_id, split_voice_ref(requested)[1])


def _worker_headers(
    request: web.Request, principal: Principal | None, voice: str
) -> dict[str, str]:
    """What a forwarded request carries: the token, the caller, and the voice's record (which
    lets a worker that never saw it serve it while Redis is away)."""
    gateway = request.app[GATEWAY]
    headers = request.app[AUTH].forward_headers(principal)  # the worker checks again
    headers[REQUEST_ID_HEADER] = request_id(request)  # one id for the request on both
    if (record := gateway.voices.forwarded_record(voice)) is not None:
        headers[RECORD_HEADER] = record
    return headers


async def proxy_speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech`` (or its captioned form, ``CAPTIONED_PATH``), checked here as
    a worker would, then relayed to one."""
    gateway = request.app[GATEWAY]
    captioned = request.path == CAPTIONED_PATH
    body = await read_body(request, CaptionedSpeechRequest if captioned else SpeechRequest)
    check_speech_request(body, gateway.settings.max_input_chars)
    principal = request_principal(request)
    # routed by the voice an alias names; the worker resolves the alias in the body again
    voice = await find_voice(gateway.voices, body.voice, principal, gateway.settings.voice_aliases)
    forwarded = _worker_headers(request, principal, _record_ref(voice, body.voice))
    raw = await request.read()
    session_id = request.headers.get(SESSION_HEADER)
    opening = _on_a_worker(  # every version of a voice routes as the voice
        gateway,
        voice.voice_id,
        session_id,
        lambda w: _open_upstream(gateway, w, request.path, raw, forwarded),
        voice.base_model,
    )
    async with opening as (upstream, first):
        return await _relay(request, upstream, first, body.stream_format == "sse")


async def _relay(
    request: web.Request, upstream: aiohttp.ClientResponse, first: bytes, sse: bool
) -> web.StreamResponse:
    """Copy the worker's answer to the client as it arrives."""
    headers = {"Content-Type": upstream.headers.get("Content-Type", "application/octet-stream")}
    for name in (WORKER_HEADER, VERSION_HEADER, "Retry-After"):
        if name in upstream.headers:
            headers[name] = upstream.headers[name]
    if upstream.status != 200:  # the worker's own error answer (a 429 too), passed through
        payload = await upstream.read()
        upstream.release()
        return web.Response(status=upstream.status, body=payload, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    await response.prepare(request)
    held = b""  # SSE: the start of an event not yet whole (a cut never leaves half of one)
    try:
        chunk = first
        while chunk:
            if sse:
                held += chunk
                end = held.rfind(b"\n\n") + 2  # 1 when no event is whole yet: nothing sent
                end = end if end > 1 else 0
                chunk, held = held[:end], held[end:]
            if chunk:
                await response.write(chunk)  # a client that left raises here, uncounted
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                request.app[GATEWAY].metrics.errors.labels("upstream_cut").inc()
                worker = headers.get(WORKER_HEADER)
                cut = ("upstream_cut", f"the worker serving this stream ({worker}) failed")
                await end_broken_stream(request, response, sse, "upstream", cut, exc)
                return response  # aiohttp finds the transport closed: one warning, no traceback
    finally:
        upstream.release()
    if held:
        await response.write(held)
    await response.write_eof()
    return response


async def proxy_speech_ws(request: web.Request) -> web.StreamResponse:
    """Relay a realtime socket to the worker its voice routes to (read from the config)."""
    work = relaying(request, request_principal(request))
    return await serve_socket(request, request.app[GATEWAY].settings.ws_idle_timeout_seconds, work)


async def proxy_speech_webrtc(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech/webrtc``: the WebRTC session ends here, at the edge; its data
    channel's messages and the worker's audio are relayed over the internal realtime socket
    of the worker its voice routes to, as a socket's are (a worker is never reached by a
    client). The worker admits the stream when the config arrives: a refusal then is an error
    event on the data channel, and the session's end."""
    principal = request_principal(request)
    work = relaying(request, principal)
    return await open_session(request, principal, work)


def relaying(request: web.Request, principal: Principal | None) -> SessionWork:
    """What a gateway does with a realtime listener's config (a socket's, a WebRTC peer's):
    opens the internal realtime socket on the worker the voice routes to, chosen as for
    ``proxy_speech`` (the next one if that one fails or refuses the upgrade), and relays."""
    gateway = request.app[GATEWAY]

    async def relay(listener: Listener, config: RealtimeConfig) -> None:
        aliases = gateway.settings.voice_aliases
        voice = await find_voice(gateway.voices, config.voice, principal, aliases)
        headers = _worker_headers(request, principal, _record_ref(voice, config.voice))
        session_id = request.headers.get(SESSION_HEADER)
        opening = _on_a_worker(
            gateway,
            voice.voice_id,
            session_id,
            lambda w: _open_upstream_socket(gateway, w, headers),
            voice.base_model,
        )
        resolved = config.model_copy(update={"voice": voice.voice_id})
        async with opening as upstream:
            try:
                await upstream.send_str(resolved.model_dump_json())
                await _relay_session(request, listener, upstream)
            finally:
                await upstream.close()

    return relay


ENDS = ("done", "error")  # a worker's socket session ends with one of these events


def _event_type(text: str) -> str:
    """The ``type`` of a realtime event as sent ("" for anything else)."""
    with suppress(ValueError, TypeError, AttributeError):
        return str(json.loads(text).get("type", ""))
    return ""


async def _relay_session(
    request: web.Request, client: Listener, upstream: aiohttp.ClientWebSocketResponse
) -> None:
    """Copy messages both ways until either side ends; then end the other. A worker's socket
    that ends before its session did (no ``done`` or ``error`` last: the worker died, or the
    connection to it did) is told to the client as a stream cut mid-way
    (``end_broken_stream``): an ``upstream_cut`` error, then an end that reads as a failure
    (a socket's close with 1011), never one that reads like a finished session."""
    last: list[str] = ["{}"]  # the worker's last event, as sent

    async def from_client() -> None:
        while True:
            try:
                text = await client.receive(None)
            except NotText:
                await client.send_event(error_event("invalid_message", "send text messages (JSON)"))
                continue
            if text is None:
                return
            await upstream.send_str(text)

    async def from_worker() -> None:
        async for message in upstream:
            if message.type == aiohttp.WSMsgType.TEXT:
                await client.send_text(message.data)
                last[0] = message.data
            elif message.type == aiohttp.WSMsgType.BINARY:
                await client.send_audio(message.data)
            elif message.type == aiohttp.WSMsgType.ERROR:  # the socket closes after it
                log.warning("the worker's realtime socket failed: %r", message.data)

    client_side = asyncio.create_task(from_client())
    worker_side = asyncio.create_task(from_worker())
    try:
        await asyncio.wait((client_side, worker_side), return_when=asyncio.FIRST_COMPLETED)
    finally:
        worker_ended = (  # the worker's side ended first, not by a failed send to the client
            worker_side.done()
            and not worker_side.cancelled()
            and worker_side.exception() is None
            and not client_side.done()
        )
        for task in (client_side, worker_side):
            task.cancel()
        await asyncio.gather(client_side, worker_side, return_exceptions=True)
        if not upstream.closed:
            await upstream.close()
        abnormal = upstream.close_code in (None, WSCloseCode.ABNORMAL_CLOSURE)
        if not client.closed and worker_ended and (abnormal or _event_type(last[0]) not in ENDS):
            cut = ("upstream_cut", "the worker serving this stream failed")
            request.app[GATEWAY].metrics.errors.labels("upstream_cut").inc()
            code = upstream.close_code
            ended = f"its socket ended (close code {code}, last event {last[0][:80]})"
            await end_broken_stream(request, client, False, "upstream", cut, ended)
        elif not client.closed:
            await client.close()


async def cluster_view(request: web.Request) -> web.Response:
    """``GET /v1/cluster``: the workers this gateway routes to, and its own streams in flight."""
    gateway = request.app[GATEWAY]
    workers = [
        {
            "id": w.worker_id,
            "url": w.url,
            "active_streams": w.load.active_streams,
            "loaded_adapters": w.load.loaded_adapters,
            "capacity": w.load.capacity,
            "headroom": w.load.headroom,
            "gateway_in_flight": gateway.in_flight[w.worker_id],
        }
        for w in sorted(gateway.membership.workers.values(), key=lambda w: w.worker_id)
    ]
    return web.json_response({"redis_ok": gateway.membership.redis_ok, "workers": workers})


async def route(request: web.Request) -> web.Response:
    """``POST /v1/cluster/route`` ``{"voices": [...]}``: each voice's owner on the ring."""
    ring = request.app[GATEWAY].membership.ring
    body = await read_body(request, RouteRequest)
    return web.json_response({"owners": {v: ring.owner(v) for v in body.voices}})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", **await request.app[GATEWAY].voices.health()})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if gateway.draining:
        return error_response(503, "not_ready", "the gateway is draining after SIGTERM")
    if not gateway.membership.workers:
        return error_response(503, "no_workers", "no worker has joined yet")
    return web.json_response({"status": "ready"})


def cluster_operations() -> dict[str, Json]:
    """A gateway's own view of its cluster (``voicehost.cluster.gateway``), for admins."""
    worker = {
        "type": "object",
        "properties": {
            "id": TEXT,
            "url": TEXT,
            **{
                name: {"type": "integer"}
                for name in (
                    "active_streams",
                    "loaded_adapters",
                    "capacity",
                    "headroom",
                    "gateway_in_flight",
                )
            },
        },
    }
    view = {
        "type": "object",
        "properties": {
            "redis_ok": {"type": "boolean"},
            "workers": {"type": "array", "items": worker},
        },
        "required": ["redis_ok", "workers"],
    }
    owners = {
        "type": "object",
        "properties": {"owners": {"type": "object", "additionalProperties": TEXT}},
        "required": ["owners"],
    }
    return {
        "cluster_view": operation(
            "The workers this gateway routes to, with their load (a gateway's own route)",
            {
                "200": json_body(view, "The workers."),
            },
            tag="cluster",
        ),
        "cluster_route": operation(
            "Each voice's owner on the ring (a gateway's own route)",
            {
                "200": json_body(owners, "The owners, by voice."),
            },
            tag="cluster",
            body={"required": True, "content": {"application/json": {"schema": ref(RouteRequest)}}},
        ),
    }


def create_gateway_app(settings: Settings) -> web.Application:
    gateway = Gateway(settings)
    app = public_app(
        settings,
        "gateway",
        gateway,
        {
            "speech": proxy_speech,
            "speech_captioned": proxy_speech,
            "speech_ws": proxy_speech_ws,
            "speech_webrtc": proxy_speech_webrtc,
            "healthz": healthz,
            "readyz": readyz,
        },
        own_routes=[
            Route("GET", "/v1/cluster", cluster_view, ADMIN, "cluster_view"),
            Route("POST", "/v1/cluster/route", route, ADMIN, "cluster_route"),
        ],
        own_operations=cluster_operations(),
        own_models=((RouteRequest, "validation"),),
    )
    app[GATEWAY] = gateway

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await gateway.start()
        yield
        with suppress(Exception):
            await gateway.close()

    app.cleanup_ctx.append(lifecycle)
    return app


def serve_gateway(settings: Settings) -> None:
    """Serve the gateway until SIGTERM or SIGINT, then let the streams it relays finish (for
    up to the drain timeout): ``serve``'s listener and connections (``lifecycle``)."""
    app = create_gateway_app(settings)
    gateway = app[GATEWAY]
    relayed = gateway.in_flight
    lifecycle.serve_app(app, settings, gateway.drain, lambda: sum(relayed.values()))
