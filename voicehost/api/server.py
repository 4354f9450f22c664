"""The handlers of a process that speaks (``voicehost serve``, a cluster worker): speech from this
process's engine, its health, and the worker-internal routes. What they share with a gateway is
``voicehost.api.edge`` and ``voicehost.api.routes``."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial

import numpy as np
from aiohttp import web

from voicehost.api import lifecycle, realtime, webrtc
from voicehost.api.auth import INTERNAL, request_principal
from voicehost.api.captions import WordClock, word_fields
from voicehost.api.edge import (
    FRONTEND_HEADER,
    SERVING,
    VERSION_HEADER,
    end_broken_stream,
    error_response,
    find_voice,
    read_body,
    read_json_object,
    stream_failure,
)
from voicehost.api.errors import ApiError
from voicehost.api.lexicons import speech_lexicon
from voicehost.api.routes import Route, public_app
from voicehost.api.speech import (
    CaptionedSpeech,
    CaptionedSpeechRequest,
    SpeechRequest,
    TimedWord,
    check_speech_request,
    speak_options,
)
from voicehost.audio.encoding import FormatStream
from voicehost.audio.formats import content_type
from voicehost.config import Settings
from voicehost.errors import ServiceError
from voicehost.host.frontend import FrontEnd
from voicehost.serving import ClusterLink, ServingProcess
from voicehost.speech.synthesis import SegmentStarted, SpeechEvent, SpokenWord
from voicehost.tenancy.usage import UsageTally
from voicehost.text.segment import Segment
from voicehost.text.stage import TextStage

log = logging.getLogger(__name__)

# How a speech response ends (its last bytes, or the end of a broken stream), written once
# admission has let the stream go: a client that has heard the end may speak again at once.
Ending = Callable[[], Awaitable[None]]


async def each(segments: list[Segment]) -> AsyncIterator[Segment]:
    for segment in segments:
        yield segment


SpeechItem = np.ndarray | SpokenWord  # what a response sends: audio, and words (if timed)


@dataclass(frozen=True)
class Outgoing:
    """What a speech response sends: its first item and the rest, encoded by ``stream``,
    each counted by ``tally`` once written; and the response's ``headers``."""

    stream: FormatStream  # the response's format: its bytes, rate and speed
    first: SpeechItem
    rest: AsyncIterator[SpeechItem]
    tally: UsageTally
    headers: dict[str, str]


async def spoken(
    events: AsyncIterator[SpeechEvent], tally: UsageTally
) -> AsyncIterator[SpeechItem]:
    """The audio and the words of ``events``; each segment's text goes to ``tally`` as it
    starts."""
    async for event in events:
        if isinstance(event, (np.ndarray, SpokenWord)):
            yield event
        elif isinstance(event, SegmentStarted):
            tally.segment(event.segment.text)


async def create_speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: the input's segments spoken as one stream."""
    return await speak(request, captioned=False)


async def create_captioned_speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech/captioned``: the input spoken, answered at once as JSON: the
    audio (base64) and every word's timing."""
    return await speak(request, captioned=True)


async def speak(request: web.Request, captioned: bool) -> web.StreamResponse:
    serving = request.app[SERVING]
    body = await read_body(request, CaptionedSpeechRequest if captioned else SpeechRequest)
    check_speech_request(body, serving.settings.max_input_chars)
    synthesizer = serving.require_synthesizer()
    principal = request_principal(request)
    voice = await find_voice(serving.voices, body.voice, principal, serving.settings.voice_aliases)
    lexicon = await speech_lexicon(serving, body.lexicons, voice, principal)
    stage = TextStage(lexicon, serving.settings.segment_max_chars, body.normalize, voice.language)
    segments = stage.whole(body.input, serving.settings.max_input_chars)  # or TextTooLong
    options = speak_options(body, serving.settings, serving.aligner, stage)
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
    format, or SSE; all at once as JSON for a ``CaptionedSpeechRequest``), each chunk counted
    by ``tally`` once written; and its ``Ending``, for the caller to write once the engine work
    is over and admission has let the stream go."""
    async with aclosing(events), aclosing(spoken(events, tally)) as items:
        try:
            first = await anext(items)
        except ServiceError:
            raise  # the service's own (input_too_long, not_ready): the error table answers it
        except StopAsyncIteration:
            message = "the model produced no audio for this input"
            raise ApiError("no_speech_produced", message) from None
        except Exception as exc:
            serving.metrics.errors.labels("engine").inc()
            log.exception("synthesis failed before the first audio")
            raise ApiError("synthesis_failed", f"synthesis failed: {exc}") from exc
        stream = serving.encoding_pool.stream(body.response_format, body.sample_rate, body.speed)
        out = Outgoing(stream, first, items, tally, headers)
        if isinstance(body, CaptionedSpeechRequest):
            return await send_captioned(serving, out)
        if body.stream_format == "sse":
            return await send_sse(request, out)
        return await send_audio(request, out)


async def send_encoded(
    out: Outgoing,
    write: Callable[[bytes], Awaitable[None]],
    word: Callable[[SpokenWord], Awaitable[None]] | None = None,
) -> int | Exception:
    """Encode and ``write`` the first item's audio and the rest's, each counted by the tally
    once written, then the stream's end; each word to ``word`` once the audio that ends it
    has been written (``captions.WordClock``). The samples sent (at the stream's rate: exact
    for the raw formats), or the exception of a synthesis or an encoding that failed once the
    response had begun (a raw response is ended broken then, not left waiting)."""
    stream, tally = out.stream, out.tally
    clock = WordClock(stream)

    async def send(item: SpeechItem) -> None:
        if isinstance(item, SpokenWord):
            clock.hold(item)
        else:
            data = await stream.encode(item)
            await write(data)
            clock.sent(data, item.size)
            tally.sent(item.size)
        for ready in clock.ready():
            if word is not None:
                await word(ready)

    try:
        await send(out.first)  # encoded here: its encoding process may be lost before it
        async for item in out.rest:
            await send(item)
        data = await stream.finish()
        await write(data)
        clock.sent(data)
        for ready in clock.ready(every=True):
            if word is not None:
                await word(ready)
    except ConnectionError:
        raise  # the client left
    except Exception as exc:
        return exc
    return clock.samples


def broken(request: web.Request, response: web.StreamResponse, sse: bool, exc: Exception) -> Ending:
    """The ``Ending`` of a stream whose synthesis failed after its first byte."""
    return partial(end_broken_stream, request, response, sse, *stream_failure(exc), exc)


async def send_audio(request: web.Request, out: Outgoing) -> tuple[web.StreamResponse, Ending]:
    response = web.StreamResponse(
        headers={"Content-Type": content_type(out.stream.fmt), **out.headers}
    )
    response.enable_chunked_encoding()
    await response.prepare(request)

    async def write(data: bytes) -> None:
        if data:
            await response.write(data)

    sent = await send_encoded(out, write)
    if isinstance(sent, Exception):
        return response, broken(request, response, False, sent)
    return response, response.write_eof


async def send_sse(request: web.Request, out: Outgoing) -> tuple[web.StreamResponse, Ending]:
    """SSE: ``speech.audio.delta`` events, a ``speech.word`` after the audio that ends it (with
    word timing), then ``speech.audio.done``."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **out.headers}
    )
    await response.prepare(request)

    def event(payload: dict[str, object]) -> bytes:
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def audio(data: bytes) -> None:
        if data:
            delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            await response.write(event(delta))

    async def word(spoken: SpokenWord) -> None:
        payload = {"type": "speech.word", **word_fields(spoken), "aligner": spoken.aligner}
        await response.write(event(payload))

    sent = await send_encoded(out, audio, word)
    if isinstance(sent, Exception):
        return response, broken(request, response, True, sent)
    done = event({"type": "speech.audio.done", "samples": sent})
    return response, partial(response.write_eof, done)


async def send_captioned(
    serving: ServingProcess, out: Outgoing
) -> tuple[web.StreamResponse, Ending]:
    """The whole audio, base64, and every word, as one JSON object (nothing is sent before
    the synthesis has ended, so a failure is a plain error answer)."""
    audio = bytearray()
    words: list[SpokenWord] = []

    async def keep(data: bytes) -> None:
        audio.extend(data)

    async def word(spoken: SpokenWord) -> None:
        words.append(spoken)

    sent = await send_encoded(out, keep, word)
    if isinstance(sent, Exception):
        stage, (code, message) = stream_failure(sent)
        serving.metrics.errors.labels("engine" if stage == "synthesis" else stage).inc()
        log.error("captioned speech failed: %s: %s", type(sent).__name__, sent)
        raise ApiError(code, message)
    stream = out.stream
    payload = CaptionedSpeech(
        audio=base64.b64encode(bytes(audio)).decode(),
        response_format=stream.fmt,
        content_type=content_type(stream.fmt),
        sample_rate=stream.sample_rate,
        samples=sent,
        audio_seconds=round(sent / stream.sample_rate, 4),
        aligner=words[0].aligner if words else serving.aligner.name,
        words=[TimedWord.model_validate(word_fields(w)) for w in words],
    ).model_dump()
    return web.json_response(payload, headers=out.headers), finished


async def finished() -> None:
    """The ``Ending`` of an answer sent whole."""


async def healthz(request: web.Request) -> web.Response:
    serving = request.app[SERVING]
    if serving.failure:
        return error_response(503, "failed", serving.failure)
    return web.json_response({"status": "ok", **await serving.voices.health()})


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


async def change_dev_settings(request: web.Request) -> web.Response:
    """``PATCH /internal/dev/settings`` (a dev server's only): a JSON object of runtime settings
    (``serving.RUNTIME_DEV_SETTINGS``) changed now, answered with every runtime setting's value;
    400 for another name or a value its field refuses."""
    values = request.app[SERVING].change_dev_settings(await read_json_object(request))
    return web.json_response(values)


# a worker's load and drain, for its gateway (on serve too: a drain works the same)
INTERNAL_ROUTES = (
    Route("GET", "/internal/load", worker_load, INTERNAL, None),
    Route("POST", "/internal/drain", drain, INTERNAL, None),
)
# a dev server's settings that a test changes while it runs, instead of booting its own server
DEV_ROUTES = (Route("PATCH", "/internal/dev/settings", change_dev_settings, INTERNAL, None),)


def create_app(
    settings: Settings,
    cluster: ClusterLink | None = None,
    frontend: FrontEnd | None = None,
    routes: Iterable[Route] = (),
) -> web.Application:
    """The application of a process that speaks; its serving starts when the app starts.

    ``cluster``: what a cluster worker adds (``voicehost.cluster.worker``): voices and jobs in
    Redis and the shared store, and a place on the ring. ``frontend``: this process is a front
    end of an engine core it shares with others (``voicehost.host``). ``routes``: a worker's own
    internal routes, beside ``INTERNAL_ROUTES``.
    """
    serving = ServingProcess(settings, cluster, frontend)
    app = public_app(
        settings,
        "serve" if cluster is None else "worker",
        serving,
        {
            "speech": create_speech,
            "speech_captioned": create_captioned_speech,
            "speech_ws": realtime.speech_ws,
            "speech_webrtc": webrtc.speech_webrtc,
            "healthz": healthz,
            "readyz": readyz,
        },
        own_routes=(*INTERNAL_ROUTES, *routes, *(DEV_ROUTES if settings.dev else ())),
    )
    app[SERVING] = serving
    if serving.channel is not None:  # a session's DELETE or PATCH may reach another front end
        app[webrtc.PEERS].join(serving.channel)
    if frontend is not None:
        index = str(frontend.client.index)

        async def name_frontend(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[FRONTEND_HEADER] = index

        app.on_response_prepare.append(name_frontend)

    async def runtime_ctx(app: web.Application) -> AsyncIterator[None]:
        await app[SERVING].open()
        yield
        await app[SERVING].close()

    app.cleanup_ctx.append(runtime_ctx)
    return app


def serve_frontend(settings: Settings, frontend: FrontEnd, sock: socket.socket) -> None:
    """A front end of ``voicehost serve``'s host (``voicehost.host.launcher.FrontEndMain``)."""
    serve(settings, create_app(settings, frontend=frontend), sock=sock)


def serve(
    settings: Settings, app: web.Application | None = None, sock: socket.socket | None = None
) -> None:
    """Serve ``app`` (``create_app(settings)`` by default) until SIGTERM or SIGINT, then drain
    (see ``lifecycle``); a disconnecting client cancels its handler. With
    ``VOICEHOST_FRONTENDS`` above 1, a host (``voicehost.host``) of one engine core and that
    many front ends, each serving ``create_app`` on the one port (``sock``)."""
    if app is None and sock is None and settings.frontend_count() > 1:
        lifecycle.serve_host(settings, serve_frontend, "serve")
        return
    app = app if app is not None else create_app(settings)
    serving = app[SERVING]
    admitted = serving.admission
    lifecycle.serve_app(app, settings, serving.drain_and_wait, lambda: admitted.active, sock=sock)
