"""HTTP handlers (aiohttp): thin adapters between the wire schemas and the synthesis pipeline."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError

from voicehost.admission import Refused
from voicehost.api import lifecycle, realtime
from voicehost.api import voices as voice_routes
from voicehost.api.common import (
    RUNTIME,
    SERVICE,
    ApiError,
    check_audio_options,
    error_response,
    find_voice,
    speak_options,
)
from voicehost.api.openapi import openapi
from voicehost.api.schemas import SpeechRequest, VoiceInfo, VoiceList
from voicehost.audio import AudioEncoder, content_type
from voicehost.auth import (
    AUTH,
    Authenticator,
    auth_middleware,
    bind_host,
    can_see,
    request_principal,
)
from voicehost.config import Settings
from voicehost.engine import InputTooLong
from voicehost.orpheus import SAMPLE_RATE
from voicehost.runtime import NotReady, Runtime
from voicehost.synthesis import SpeechEvent
from voicehost.text import Segment, split_text

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)
WORKER_HEADER = "X-Voicehost-Worker"  # which worker served a request (cluster mode)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        request.app[SERVICE].metrics.errors.labels(exc.code).inc()
        return error_response(exc.status, exc.code, exc.message)
    except NotReady as exc:  # warming up, draining or failed: another process may answer
        response = error_response(503, "not_ready", str(exc))
        response.headers["Retry-After"] = "1"
        return response
    except Refused as exc:
        request.app[SERVICE].metrics.errors.labels(exc.code).inc()
        response = error_response(exc.status, exc.code, exc.message)
        response.headers["Retry-After"] = str(exc.retry_after)
        return response
    except RedisError as exc:
        request.app[SERVICE].metrics.errors.labels("redis_unavailable").inc()
        log.warning("redis unavailable on %s %s: %s", request.method, request.path, exc)
        return error_response(503, "redis_unavailable", "the cluster's Redis is unavailable")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    except ConnectionResetError:
        raise  # the client went away; nothing to answer
    except Exception as exc:
        request.app[SERVICE].metrics.errors.labels("internal").inc()
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")


async def read_body(request: web.Request, model: type[Body]) -> Body:
    try:
        payload = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise ApiError(400, "invalid_request", problems) from exc


def check_speech_request(body: SpeechRequest, max_chars: int) -> None:
    if not any(ch.isalnum() for ch in body.input):
        raise ApiError(400, "empty_input", "input is empty or has nothing to say")
    if len(body.input) > max_chars:
        raise ApiError(
            413,
            "input_too_long",
            f"input has {len(body.input)} characters; the limit is {max_chars}",
        )
    check_audio_options(body)
    if body.speed != 1.0:
        raise ApiError(400, "unsupported_speed", "only speed 1.0 is supported for now")


async def each(segments: list[Segment]) -> AsyncIterator[Segment]:
    for segment in segments:
        yield segment


async def audio_only(events: AsyncIterator[SpeechEvent]) -> AsyncIterator[np.ndarray]:
    async for event in events:
        if isinstance(event, np.ndarray):
            yield event


async def speech(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    body = await read_body(request, SpeechRequest)
    check_speech_request(body, runtime.settings.max_input_chars)
    synthesizer = runtime.require_synthesizer()
    principal = request_principal(request)
    voice = await find_voice(runtime, body.voice, principal)
    segments = split_text(body.input, runtime.settings.segment_max_chars)
    options = speak_options(body, runtime.settings)
    with runtime.admit(principal):
        events = synthesizer.speak(each(segments), voice, options)
        return await speak(request, runtime, body, events)


async def speak(
    request: web.Request, runtime: Runtime, body: SpeechRequest, events: AsyncIterator[SpeechEvent]
) -> web.StreamResponse:
    """Stream ``events``' audio as ``body`` asks (raw bytes of its format, or SSE)."""
    async with aclosing(events), aclosing(audio_only(events)) as chunks:
        try:
            first = await anext(chunks)
        except InputTooLong as exc:
            raise ApiError(413, "input_too_long", str(exc)) from exc
        except StopAsyncIteration:
            raise ApiError(500, "no_audio", "the model produced no audio for this input") from None
        except Exception as exc:
            runtime.metrics.errors.labels("engine").inc()
            log.exception("synthesis failed before the first audio")
            raise ApiError(500, "synthesis_failed", f"synthesis failed: {exc}") from exc
        encoder = AudioEncoder(body.response_format, body.sample_rate)
        if body.stream_format == "sse":
            return await send_sse(request, encoder, first, chunks)
        return await send_audio(request, encoder, first, chunks)


async def send_audio(
    request: web.Request, encoder: AudioEncoder, first: np.ndarray, rest: AsyncIterator[np.ndarray]
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": content_type(encoder.fmt)})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(encoder.encode(first))
    async for pcm in rest:
        if data := encoder.encode(pcm):
            await response.write(data)
    await response.write(encoder.finish())
    await response.write_eof()
    return response


async def send_sse(
    request: web.Request, encoder: AudioEncoder, first: np.ndarray, rest: AsyncIterator[np.ndarray]
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)

    async def event(payload: dict[str, object]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())

    async def audio(data: bytes) -> None:
        if data:
            await event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    samples = first.size
    await audio(encoder.encode(first))
    async for pcm in rest:
        samples += pcm.size
        await audio(encoder.encode(pcm))
    await audio(encoder.finish())
    rate = encoder.sample_rate
    await event({"type": "speech.audio.done", "samples": round(samples * rate / SAMPLE_RATE)})
    await response.write_eof()
    return response


async def list_voices(request: web.Request) -> web.Response:
    """Voices the caller can use: shared ones and its tenant's (all for an admin); unusable
    adapters only to an admin or in open mode (their tenant is unknown)."""
    registry = request.app[SERVICE].registry
    principal = request_principal(request)
    usable, broken = await registry.list_voices()
    usable = [v for v in usable if can_see(principal, v.tenant)]
    if principal is not None and not principal.admin:
        broken = []
    voices = [
        VoiceInfo(
            id=v.voice_id,
            name=v.name,
            kind="builtin" if v.voice_id in registry.builtin else "adapter",
        )
        for v in usable
    ]
    voices += [
        VoiceInfo(id=b.voice_id, name=b.voice_id, kind="adapter", status="error", error=b.error)
        for b in broken
    ]
    return web.json_response(VoiceList(voices=voices).model_dump(exclude_none=True))


async def healthz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if runtime.failure:
        return error_response(503, "failed", runtime.failure)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    runtime.require_synthesizer()
    return web.json_response({"status": "ready"})


async def worker_load(request: web.Request) -> web.Response:
    """``GET /internal/load``: this process's streams in flight and whether it is draining."""
    runtime = request.app[RUNTIME]
    return web.json_response(
        {"active_streams": runtime.active_streams, "draining": runtime.draining}
    )


async def drain(request: web.Request) -> web.Response:
    """``POST /internal/drain``: take no new streams and leave the ring; in-flight ones finish."""
    runtime = request.app[RUNTIME]
    await runtime.drain()
    return web.json_response(
        {"active_streams": runtime.active_streams, "draining": runtime.draining}
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_public_routes(
    app: web.Application, speak: Handler, speak_ws: Handler, health: Handler, ready: Handler
) -> None:
    """The public API, the same on ``serve``, a worker and a gateway (which speaks by proxy)."""
    app.router.add_post("/v1/audio/speech", speak)
    app.router.add_get("/v1/audio/speech/ws", speak_ws)
    app.router.add_get("/v1/audio/voices", list_voices)
    app.router.add_get("/v1/voices", list_voices)
    voice_routes.add_routes(app)
    app.router.add_get("/healthz", health)
    app.router.add_get("/readyz", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)


def create_app(settings: Settings, worker: bool = False) -> web.Application:
    """The application; the runtime starts in the background when the app starts.

    ``worker``: a cluster worker, whose voices and jobs live in Redis and the shared store.
    """
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[AUTH] = Authenticator.from_settings(settings, "worker" if worker else "serve")
    cluster = None
    if worker:
        from voicehost.cluster.worker import WorkerCluster

        cluster = WorkerCluster(settings)

        async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[WORKER_HEADER] = cluster.worker_id

        app.on_response_prepare.append(name_worker)
    app[RUNTIME] = app[SERVICE] = Runtime(settings, cluster)

    async def runtime_ctx(app: web.Application) -> AsyncIterator[None]:
        app[RUNTIME].start()
        yield
        await app[RUNTIME].close()

    app.cleanup_ctx.append(runtime_ctx)
    add_public_routes(app, speech, realtime.speech_ws, healthz, readyz)
    app.router.add_get("/internal/load", worker_load)
    app.router.add_post("/internal/drain", drain)
    return app


def serve(settings: Settings, worker: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then drain (see ``lifecycle``); a disconnecting client
    cancels its handler."""
    app = create_app(settings, worker)
    runtime = app[RUNTIME]
    asyncio.run(
        lifecycle.serve_until_signalled(
            app,
            host=bind_host(settings.host, app[AUTH].enabled),
            port=settings.port,
            drain=runtime.drain_and_wait,
            in_flight=lambda: runtime.admission.active,
            drain_timeout=settings.drain_timeout_seconds,
        )
    )
