"""The handlers of a process that speaks (``voicehost serve``, a cluster worker): speech from this
process's engine, its health, and the worker-internal routes. What they share with a gateway is
``voicehost.api.edge`` and ``voicehost.api.routes``."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from functools import partial

import numpy as np
from aiohttp import web

from voicehost.api import lifecycle, realtime, webrtc
from voicehost.api.auth import INTERNAL, request_principal
from voicehost.api.edge import (
    FRONTEND_HEADER,
    SERVING,
    VERSION_HEADER,
    ApiError,
    check_speech_request,
    end_broken_stream,
    error_response,
    find_voice,
    read_body,
    registry_health,
    speak_options,
    stream_failure,
)
from voicehost.api.lexicons import speech_lexicon
from voicehost.api.routes import Route, public_app
from voicehost.api.schemas import SpeechRequest
from voicehost.audio.encoding import FormatStream
from voicehost.audio.formats import content_type
from voicehost.config import Settings
from voicehost.model.engine import InputTooLong
from voicehost.serving import ClusterLink, FrontEnd, ServingProcess
from voicehost.speech.synthesis import SegmentStarted, SpeechEvent
from voicehost.tenancy.usage import UsageTally
from voicehost.text.segment import Segment
from voicehost.text.stage import TextStage, TextTooLong

log = logging.getLogger(__name__)

# How a speech response ends (its last bytes, or the end of a broken stream), written once the
# stream's slot is given back: a client that has heard the end may speak again at once.
Ending = Callable[[], Awaitable[None]]


async def each(segments: list[Segment]) -> AsyncIterator[Segment]:
    for segment in segments:
        yield segment


async def audio_only(
    events: AsyncIterator[SpeechEvent], tally: UsageTally
) -> AsyncIterator[np.ndarray]:
    """The audio of ``events``; each segment's text goes to ``tally`` as it starts."""
    async for event in events:
        if isinstance(event, np.ndarray):
            yield event
        elif isinstance(event, SegmentStarted):
            tally.segment(event.segment.text)


async def create_speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: the input's segments spoken as one stream."""
    serving = request.app[SERVING]
    body = await read_body(request, SpeechRequest)
    check_speech_request(body, serving.settings.max_input_chars)
    synthesizer = serving.require_synthesizer()
    principal = request_principal(request)
    voice = await find_voice(serving.voices, body.voice, principal, serving.settings.voice_aliases)
    lexicon = await speech_lexicon(serving, body.lexicons, voice, principal)
    stage = TextStage(lexicon, serving.settings.segment_max_chars, body.normalize)
    try:
        segments = stage.whole(body.input, serving.settings.max_input_chars)
    except TextTooLong as exc:
        raise ApiError(413, "input_too_long", str(exc)) from exc
    options = speak_options(body, serving.settings)
    tally = serving.usage.tally(principal, voice.voice_id)  # counts what is sent
    async with serving.admit(principal):
        events = synthesizer.speak_segments(each(segments), voice, options)
        version = {VERSION_HEADER: str(voice.version)}
        response, ending = await respond(request, serving, body, events, tally, version)
    await ending()
    return response


async def respond(
    request: web.Request,
    serving: ServingProcess,
    body: SpeechRequest,
    events: AsyncIterator[SpeechEvent],
    tally: UsageTally,
    headers: dict[str, str],
) -> tuple[web.StreamResponse, Ending]:
    """The response, with ``headers``: ``events``' audio as ``body`` asks (raw bytes of its
    format, or SSE), each chunk counted by ``tally`` once written; and its ``Ending``, for the
    caller to write once the engine work is over and the stream's slot given back."""
    async with aclosing(events), aclosing(audio_only(events, tally)) as chunks:
        try:
            first = await anext(chunks)
        except InputTooLong as exc:
            raise ApiError(413, "input_too_long", str(exc)) from exc
        except StopAsyncIteration:
            raise ApiError(500, "no_audio", "the model produced no audio for this input") from None
        except Exception as exc:
            serving.metrics.errors.labels("engine").inc()
            log.exception("synthesis failed before the first audio")
            raise ApiError(500, "synthesis_failed", f"synthesis failed: {exc}") from exc
        encoder = serving.format_encoders.stream(body.response_format, body.sample_rate, body.speed)
        if body.stream_format == "sse":
            return await send_sse(request, encoder, first, chunks, tally, headers)
        return await send_audio(request, encoder, first, chunks, tally, headers)


async def send_encoded(
    request: web.Request,
    response: web.StreamResponse,
    encoder: FormatStream,
    chunks: tuple[np.ndarray, AsyncIterator[np.ndarray]],
    tally: UsageTally,
    write: Callable[[bytes], Awaitable[None]],
    sse: bool,
) -> int | Ending:
    """Encode and ``write`` the first chunk and the rest, each counted by ``tally`` once
    written, then the encoder's end; the samples sent, or, when synthesis failed after the
    first byte, the ``Ending`` of a broken stream (``end_broken_stream``: ``sse``, with an
    error event, else cut)."""
    first, rest = chunks
    samples = first.size
    await write(await encoder.encode(first))
    tally.sent(first.size)
    try:
        async for pcm in rest:
            samples += pcm.size
            await write(await encoder.encode(pcm))
            tally.sent(pcm.size)
        await write(await encoder.finish())
    except ConnectionError:
        raise  # the client left
    except Exception as exc:
        return partial(end_broken_stream, request, response, sse, *stream_failure(exc), exc)
    return samples


async def send_audio(
    request: web.Request,
    encoder: FormatStream,
    first: np.ndarray,
    rest: AsyncIterator[np.ndarray],
    tally: UsageTally,
    headers: dict[str, str],
) -> tuple[web.StreamResponse, Ending]:
    response = web.StreamResponse(headers={"Content-Type": content_type(encoder.fmt), **headers})
    response.enable_chunked_encoding()
    await response.prepare(request)

    async def write(data: bytes) -> None:
        if data:
            await response.write(data)

    sent = await send_encoded(request, response, encoder, (first, rest), tally, write, False)
    return response, response.write_eof if isinstance(sent, int) else sent


async def send_sse(
    request: web.Request,
    encoder: FormatStream,
    first: np.ndarray,
    rest: AsyncIterator[np.ndarray],
    tally: UsageTally,
    headers: dict[str, str],
) -> tuple[web.StreamResponse, Ending]:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)

    def event(payload: dict[str, object]) -> bytes:
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def audio(data: bytes) -> None:
        if data:
            delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            await response.write(event(delta))

    sent = await send_encoded(request, response, encoder, (first, rest), tally, audio, True)
    if not isinstance(sent, int):
        return response, sent
    done = event({"type": "speech.audio.done", "samples": encoder.output_samples(sent)})
    return response, partial(response.write_eof, done)


async def healthz(request: web.Request) -> web.Response:
    serving = request.app[SERVING]
    if serving.failure:
        return error_response(503, "failed", serving.failure)
    return web.json_response({"status": "ok", **registry_health(serving.voices)})


async def readyz(request: web.Request) -> web.Response:
    """Ready: this process can speak, and so can each front end of its host."""
    serving = request.app[SERVING]
    serving.require_synthesizer()
    if serving.frontend is not None and (waiting := serving.frontend.not_ready()):
        message = f"front ends {waiting} of this host are starting or draining"
        return error_response(503, "not_ready", message)
    return web.json_response({"status": "ready"})


async def worker_load(request: web.Request) -> web.Response:
    """``GET /internal/load``: the host's streams in flight (every front end's) and whether it
    is draining."""
    serving = request.app[SERVING]
    return web.json_response(
        {"active_streams": serving.admission.streams(), "draining": serving.draining}
    )


async def drain(request: web.Request) -> web.Response:
    """``POST /internal/drain``: the host takes no new streams (every front end) and leaves the
    ring; in-flight ones finish."""
    serving = request.app[SERVING]
    await serving.drain()
    return web.json_response(
        {"active_streams": serving.admission.streams(), "draining": serving.draining}
    )


# a worker's load and drain, for its gateway (on serve too: a drain works the same)
INTERNAL_ROUTES = (
    Route("GET", "/internal/load", worker_load, INTERNAL, None),
    Route("POST", "/internal/drain", drain, INTERNAL, None),
)


def create_app(
    settings: Settings, cluster: ClusterLink | None = None, frontend: FrontEnd | None = None
) -> web.Application:
    """The application of a process that speaks; its serving starts when the app starts.

    ``cluster``: what a cluster worker adds (``voicehost.cluster.worker``): voices and jobs in
    Redis and the shared store, and a place on the ring. ``slot``: this process is a front end
    of an engine core it shares with others (``voicehost.api.host``).
    """
    serving = ServingProcess(settings, cluster, frontend)
    app = public_app(
        settings,
        "serve" if cluster is None else "worker",
        serving,
        {
            "speech": create_speech,
            "speech_ws": realtime.speech_ws,
            "speech_webrtc": webrtc.speech_webrtc,
            "healthz": healthz,
            "readyz": readyz,
        },
        own_routes=INTERNAL_ROUTES,
    )
    app[SERVING] = serving
    if frontend is not None:  # a session's DELETE or PATCH may reach another front end
        app[webrtc.PEERS].mailboxes = frontend.ready_dir / "webrtc"
        index = str(frontend.slot.index)

        async def name_frontend(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[FRONTEND_HEADER] = index

        app.on_response_prepare.append(name_frontend)

    async def runtime_ctx(app: web.Application) -> AsyncIterator[None]:
        app[SERVING].start()
        yield
        await app[SERVING].close()

    app.cleanup_ctx.append(runtime_ctx)
    return app


def frontend_app(settings: Settings, frontend: FrontEnd) -> web.Application:
    """``voicehost serve``'s app, as front end ``frontend`` of a host."""
    return create_app(settings, frontend=frontend)


def serve(
    settings: Settings, app: web.Application | None = None, sock: socket.socket | None = None
) -> None:
    """Serve ``app`` (``create_app(settings)`` by default) until SIGTERM or SIGINT, then drain
    (see ``lifecycle``); a disconnecting client cancels its handler. With
    ``VOICEHOST_FRONTENDS`` above 1, ``voicehost.api.host`` starts one engine core and that
    many front ends, each serving ``create_app`` on the one port (``sock``)."""
    if app is None and sock is None and settings.frontend_count() > 1:
        from voicehost.api.host import serve_frontends

        serve_frontends(settings, frontend_app)
        return
    app = app if app is not None else create_app(settings)
    serving = app[SERVING]
    admitted = serving.admission
    lifecycle.serve_app(app, settings, serving.drain_and_wait, lambda: admitted.active, sock=sock)
