"""``/v1/audio/speech/ws``: text in as it comes (an LLM's output, word by word), audio out.

The protocol (see docs/API.md): the client sends a ``config`` message, then ``text`` pieces,
``flush``, ``cancel`` and finally ``end``; the server answers ``ready``, then for each segment of
the text ``segment.started`` (with its span in the input), the audio as binary messages and
``segment.done``; after ``end``, ``done`` and a normal close. ``cancel`` (barge-in) stops the
audio at once, aborts the engine request and drops the buffered text; ``cancelled`` confirms
it, and no audio of what was cancelled follows.

The session speaks to a ``Listener`` (``api/listeners.py``): this WebSocket, or a WebRTC peer
(``api/webrtc.py``), whose data channel carries the same messages and whose track the audio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing, suppress
from typing import Literal

import numpy as np
from aiohttp import web
from pydantic import BaseModel, Field, ValidationError
from redis.exceptions import RedisError

from voicehost.api.auth import request_principal
from voicehost.api.captions import WordClock, word_fields
from voicehost.api.edge import (
    SERVING,
    answer,
    end_broken_stream,
    error_event,
    find_voice,
    load_json,
    stream_failure,
    validation_message,
)
from voicehost.api.errors import kind_of
from voicehost.api.lexicons import speech_lexicon
from voicehost.api.listeners import Listener, NotText, SocketListener
from voicehost.api.openapi import REF_TEMPLATE, Json, Models, operation
from voicehost.api.speech import RealtimeConfig, check_audio_options, speak_options
from voicehost.audio.formats import content_type
from voicehost.errors import ServiceError
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.serving import NotReady, ServingProcess
from voicehost.speech.admission import Refused
from voicehost.speech.synthesis import (
    SegmentStarted,
    SpeakOptions,
    SpeechEvent,
    SpokenWord,
    Synthesizer,
)
from voicehost.tenancy.keys import Principal
from voicehost.tenancy.usage import UsageTally
from voicehost.text.lexicon import Lexicon
from voicehost.text.segment import Segment
from voicehost.text.stage import TextStage
from voicehost.voices.voice import Voice

# --- its wire models ---


class RealtimeText(BaseModel):
    """A piece of text, as it comes (a word, a token, a sentence)."""

    type: Literal["text"]
    text: str = Field(max_length=65536)


class RealtimeControl(BaseModel):
    """``flush``: speak the text buffered so far; ``end``: no more text, finish and close;
    ``cancel``: stop at once (barge-in) and drop what is buffered."""

    type: Literal["flush", "end", "cancel"]


log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 17
END = None  # what the segment queue holds after the last segment
# The code of a refused upgrade, in a header too: a WebSocket client never reads the body.
ERROR_CODE_HEADER = "X-Voicehost-Error-Code"


class ProtocolError(Exception):
    """A message the protocol does not allow; answered with an ``error`` event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


MESSAGES: dict[str, type[RealtimeConfig | RealtimeText | RealtimeControl]] = {
    "config": RealtimeConfig,
    "text": RealtimeText,
    "flush": RealtimeControl,
    "end": RealtimeControl,
    "cancel": RealtimeControl,
}


def parse(message: str) -> RealtimeConfig | RealtimeText | RealtimeControl:
    """A client message, parsed once; ``ProtocolError`` if it is not one of ``MESSAGES``."""
    try:
        payload = load_json(message)
    except ValueError as exc:
        raise ProtocolError(
            "invalid_message", f"a message is a JSON object with a type: {exc}"
        ) from exc
    kind = payload.get("type") if isinstance(payload, dict) else None
    model = MESSAGES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ProtocolError("invalid_message", f"unknown message type {kind!r}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ProtocolError("invalid_message", validation_message(exc, "message")) from exc


def parse_client_message(message: str) -> RealtimeText | RealtimeControl:
    parsed = parse(message)
    if isinstance(parsed, RealtimeConfig):
        raise ProtocolError("invalid_message", "the config comes once, first")
    return parsed


class RealtimeSession:
    """One socket: its text segmenter, its queue of segments and the task speaking them."""

    def __init__(
        self,
        request: web.Request,
        listener: Listener,
        serving: ServingProcess,
        synthesizer: Synthesizer,
        voice: Voice,
        config: RealtimeConfig,
        tally: UsageTally,
        lexicon: Lexicon | None = None,
    ) -> None:
        self.request = request
        self.listener = listener
        self.tally = tally  # counts the audio sent, and the text of its segments
        self.serving = serving
        self.synthesizer = synthesizer
        self.voice = voice
        self.stream = serving.encoding_pool.stream(
            config.response_format, config.sample_rate, config.speed
        )
        self.received = 0  # characters of text so far: segment spans count from the first
        self.text = ""  # the text so far, for what a cancel says was heard
        self.clock = WordClock(self.stream)  # the audio sent, and the words waiting for it
        self.first_audio: float | None = None  # when the first audio was sent (monotonic)
        self.words: list[SpokenWord] = []  # words sent since the last cancel (stream clock)
        max_chars = serving.settings.segment_max_chars
        self.stage = TextStage(
            lexicon if lexicon else None, max_chars, config.normalize, voice.language
        )
        self.options: SpeakOptions = speak_options(
            config, serving.settings, serving.aligner, self.stage
        )
        self.said = 0  # characters said by the segmenters before this one (their ``said``)
        self.segmenter = self.stage.streamed()
        self.segmenter_base = 0  # where the current segmenter's offsets start
        self.queue: asyncio.Queue[Segment | None] = asyncio.Queue()
        self.speaker: asyncio.Task[None] | None = None
        self.in_segment = False  # between a segment's start and its end: speaking
        self.last_output = time.monotonic()  # when the socket last sent something
        self.ended = False

    async def send(self, payload: dict[str, object]) -> None:
        await self.listener.send_event(payload)
        self.last_output = time.monotonic()

    async def run(self) -> None:
        await self.send(
            {
                "type": "ready",
                "voice": self.voice.voice_id,
                "version": self.voice.version,
                "response_format": self.stream.fmt,
                "sample_rate": self.stream.sample_rate,
                "speed": self.stream.speed,
                "content_type": content_type(self.stream.fmt),
            }
            | ({"aligner": self.options.aligner.name} if self.options.aligner else {})
        )
        self.speaker = self._start_speaker()
        idle = self.serving.settings.ws_idle_timeout_seconds
        try:
            while not self.listener.closed:
                try:
                    message = await self.listener.receive(idle)
                except TimeoutError:
                    if self._busy(idle):
                        continue
                    await self.send(error_event("idle_timeout", f"no message for {idle:g} s"))
                    await self.listener.close("idle timeout")
                    return
                except NotText:
                    await self.send(error_event("invalid_message", "send text messages (JSON)"))
                    continue
                if message is None:
                    if not self.ended or self.in_segment or not self.queue.empty():
                        log.info("realtime session: the listener left before its end")
                    return
                try:
                    await self._handle(parse_client_message(message))
                except ProtocolError as exc:
                    await self.send(error_event(exc.code, exc.message))
        finally:
            await self._stop_speaker()

    async def _handle(self, message: RealtimeText | RealtimeControl) -> None:
        if self.ended:
            if isinstance(message, RealtimeControl) and message.type == "cancel":
                # a barge-in while the last of the text is spoken: cancelled, then done
                await self._cancel()
                self.queue.put_nowait(END)
                return
            raise ProtocolError(
                "ended", "the input has ended (only cancel is taken); open a new socket"
            )
        if isinstance(message, RealtimeText):
            limit = self.serving.settings.max_input_chars  # over a socket as over HTTP
            if self.received + len(message.text) > limit:
                raise ProtocolError(
                    "input_too_long",
                    f"this socket's text would pass {limit} characters; open a new one",
                )
            self.received += len(message.text)
            self.text += message.text
            self._queue(self.segmenter.push(message.text))
        elif message.type == "flush":
            self._flush()
        elif message.type == "end":
            self.ended = True
            try:
                self._flush()
            finally:
                self.queue.put_nowait(END)
        else:
            await self._cancel()

    def _queue(self, segments: list[Segment]) -> None:
        if self.stage.lexicon is not None:  # aliases may say more than the text: the same cap
            limit = self.serving.settings.max_input_chars
            if self.said + self.segmenter.said > limit:
                raise ProtocolError(
                    "input_too_long",
                    f"with its lexicons this socket's text would say over {limit} characters",
                )
        for segment in segments:
            self.queue.put_nowait(
                dataclasses.replace(
                    segment,
                    start=segment.start + self.segmenter_base,
                    end=segment.end + self.segmenter_base,
                )
            )

    def _flush(self) -> None:
        """Queue the buffered text; the segmenter then counts from 0 again."""
        try:
            self._queue(self.segmenter.flush())
        finally:
            self.segmenter_base = self.received

    async def _cancel(self) -> None:
        """Barge-in: stop speaking, drop every queued segment and the buffered text. With word
        timing, ``cancelled`` says what was heard: the words whose audio had been played by
        the listener's clock (``Listener.played_seconds``), as a span of the text sent."""
        await self._stop_speaker()
        self.queue = asyncio.Queue()
        self.said += self.segmenter.said
        self.segmenter = self.stage.streamed()
        self.segmenter_base = self.received
        cancelled: dict[str, object] = {"type": "cancelled"}
        if self.options.aligner is not None:
            played = self.listener.played_seconds(self.clock.sent_seconds, self.first_audio)
            heard = [w for w in self.words if w.audio_end <= played + 1e-3]
            first = self.words[0].start if self.words else self.received
            end = heard[-1].end if heard else first
            cancelled["heard"] = {"text": self.text[first:end], "start": first, "end": end}
            cancelled["played_seconds"] = round(played, 3)
        self.words = []
        self.clock.restart()
        await self.send(cancelled)
        self.speaker = self._start_speaker()

    def _busy(self, idle: float) -> bool:
        """Whether the socket has something to say: queued text, a segment being spoken (its
        audio may still be generating), or output in the last ``idle`` seconds."""
        recent = time.monotonic() - self.last_output < idle
        return not self.queue.empty() or self.in_segment or recent

    def _start_speaker(self) -> asyncio.Task[None]:
        self.in_segment = False
        return asyncio.create_task(self._speak(self.queue), name="realtime-speaker")

    async def _stop_speaker(self) -> None:
        if self.speaker is not None:
            self.speaker.cancel()
            with suppress(asyncio.CancelledError):
                await self.speaker
            self.speaker = None

    async def _segments(self, queue: asyncio.Queue[Segment | None]) -> AsyncIterator[Segment]:
        while (segment := await queue.get()) is not END:
            yield segment

    async def _speak(self, queue: asyncio.Queue[Segment | None]) -> None:
        """Speak queued segments until ``END``; then ``done`` and close."""
        events = self.synthesizer.speak_segments(self._segments(queue), self.voice, self.options)
        try:
            async with aclosing(events):
                async for event in events:
                    await self._forward(event)
            await self._audio(await self.stream.finish())
            await self._release_words(every=True)
            await self.send({"type": "done"})
            await self.listener.close()
        except asyncio.CancelledError:
            raise
        except ConnectionError as exc:  # the client left; the socket's loop ends too
            log.info("realtime session: the listener left while spoken to (%s)", exc)
        except Exception as exc:  # an error event, then the end, as every stream's
            stage, error = stream_failure(exc)
            self.serving.metrics.errors.labels("engine" if stage == "synthesis" else stage).inc()
            await end_broken_stream(self.request, self.listener, False, stage, error, exc)
        finally:
            self.in_segment = False

    async def _forward(self, event: SpeechEvent) -> None:
        if isinstance(event, SpokenWord):  # onto the stream's clock: after speed and cancels
            self.clock.hold(event)
            await self._release_words()
        elif isinstance(event, np.ndarray):
            data = await self.stream.encode(event)
            try:
                await self._audio(data, event.size)
            except asyncio.CancelledError:  # a barge-in cut the drain after the write: sent
                self.tally.sent(event.size)
                raise
            self.tally.sent(event.size)
            await self._release_words()
        elif isinstance(event, SegmentStarted):
            self.tally.segment(event.segment.text)
            self.in_segment = True
            span = event.segment
            await self.send(
                {
                    "type": "segment.started",
                    "segment": event.index,
                    "text": span.text,
                    "start": span.start,
                    "end": span.end,
                }
            )
        else:
            self.in_segment = False
            await self.send(
                {
                    "type": "segment.done",
                    "segment": event.index,
                    "samples": self.stream.output_samples(event.samples),
                    "audio_seconds": round(event.samples / SAMPLE_RATE / self.stream.speed, 4),
                }
            )

    async def _audio(self, data: bytes, model_samples: int = 0) -> None:
        """Send ``data``, the encoding of ``model_samples``: the stream's clock moves on by the
        samples sent (exact for the raw formats; a compressed one's by what was encoded)."""
        if data:
            await self.listener.send_audio(data)
            self.last_output = time.monotonic()
            if self.first_audio is None:
                self.first_audio = self.last_output
        self.clock.sent(data, model_samples)

    async def _release_words(self, every: bool = False) -> None:
        """Send the words whose audio has gone out (its format stream may hold some back: a
        time stretch, a resampler, a codec's frame), or ``every`` one left."""
        for word in self.clock.ready(every):
            self.words.append(word)
            await self.send({"type": "word", **word_fields(word), "aligner": word.aligner})


async def read_config(listener: Listener, idle: float) -> RealtimeConfig:
    try:
        message = await listener.receive(idle)
    except TimeoutError as exc:
        raise ProtocolError("idle_timeout", f"no config within {idle:g} s") from exc
    except NotText as exc:
        raise ProtocolError("invalid_message", "the first message is the JSON config") from exc
    if message is None:
        raise ConnectionError("the listener left before its config")
    config = parse(message)
    if not isinstance(config, RealtimeConfig):
        raise ProtocolError("invalid_message", 'the first message is {"type": "config", ...}')
    return listener.shape(config)


SessionWork = Callable[[Listener, RealtimeConfig], Awaitable[None]]


async def serve_socket(
    request: web.Request, idle: float, work: SessionWork
) -> web.WebSocketResponse:
    """Upgrade to a WebSocket and ``serve_listener`` it."""
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=20.0)
    await ws.prepare(request)
    await serve_listener(SocketListener(ws), idle, work)
    return ws


async def serve_listener(listener: Listener, idle: float, work: SessionWork) -> None:
    """Read a listener's config, then run ``work`` on it (a server's session, a gateway's
    relay). A bad config, or a ``ServiceError`` from ``work`` (an unknown voice, no worker), is
    refused with its code, and with ``retry_after`` where the error table says waiting helps
    (every worker full, a key at its quota, Redis away); any other failure ends
    the session with an ``internal`` error event: once a session is open, nothing here answers
    in HTTP."""
    try:
        config = await read_config(listener, idle)
        check_audio_options(config)
        await work(listener, config)
    except ProtocolError as exc:
        await refuse(listener, exc.code, exc.message)
    except ServiceError as exc:  # the error table's: with when to retry where waiting helps
        retry = getattr(exc, "retry_after", 1) if kind_of(exc).retry_after else None
        await refuse(listener, exc.code, exc.message, retry)
    except RedisError as exc:
        log.warning("redis unavailable on a realtime session: %s", exc)
        await refuse(listener, "redis_unavailable", "the cluster's Redis is unavailable", 1)
    except ConnectionError:
        pass  # the client left
    except Exception as exc:
        log.exception("realtime session failed")
        await listener.fail(error_event("internal", f"internal error: {type(exc).__name__}"))


async def refuse(
    listener: Listener, code: str, message: str, retry_after: int | None = None
) -> None:
    """An ``error`` event, then the end (a socket: a policy-violation close); with
    ``retry_after`` (seconds) in the event, an end that says to try again later (1013)."""
    event = error_event(code, message)
    if retry_after is not None:
        event["retry_after"] = retry_after
    await listener.end_with(event, retry_later=retry_after is not None)


async def speech_ws(request: web.Request) -> web.StreamResponse:
    """``GET /v1/audio/speech/ws``: the WebSocket of the protocol above. Refused before the
    upgrade (503 warming up or draining, 503 at capacity, 429 over the key's quota, each with
    ``Retry-After``), its code in ``ERROR_CODE_HEADER`` as well (a gateway passes it on)."""
    serving = request.app[SERVING]
    principal = request_principal(request)
    async with AsyncExitStack() as admitted:
        try:
            synthesizer = serving.require_synthesizer()
            # a session counts as one stream while it is open
            await admitted.enter_async_context(serving.admit(principal))
        except (NotReady, Refused) as exc:
            return refused_upgrade(request, exc)

        work = speaking(request, serving, synthesizer, principal)
        return await serve_socket(request, serving.settings.ws_idle_timeout_seconds, work)


def speaking(
    request: web.Request,
    serving: ServingProcess,
    synthesizer: Synthesizer,
    principal: Principal | None,
) -> SessionWork:
    """What a serving process does with a listener's config: a ``RealtimeSession`` with the
    voice and lexicons it names, spoken by this process."""

    async def session(listener: Listener, config: RealtimeConfig) -> None:
        aliases = serving.settings.voice_aliases
        voice = await find_voice(serving.voices, config.voice, principal, aliases)
        tally = serving.usage.tally(principal, voice.voice_id)
        lexicon = await speech_lexicon(serving, config.lexicons, voice, principal)
        session = RealtimeSession(
            request, listener, serving, synthesizer, voice, config, tally, lexicon
        )
        await session.run()

    return session


def refused_upgrade(request: web.Request, refusal: Refused | NotReady) -> web.Response:
    """The HTTP answer to an upgrade that cannot be admitted now: the error middleware's
    (``edge.answer``: the table's status, ``Retry-After``, counted), plus its code in
    ``ERROR_CODE_HEADER``."""
    response = answer(request, refusal)
    response.headers[ERROR_CODE_HEADER] = refusal.code
    return response


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operation of the socket's upgrade (its error answers: the error table's)."""
    kinds = ", ".join(
        f"`{kind}` ([{model.__name__}]({REF_TEMPLATE.format(model=model.__name__)}))"
        for kind, model in MESSAGES.items()
    )
    description = (
        "A WebSocket (OpenAPI cannot describe one; this is its upgrade request). The client "
        f"sends JSON text messages, by `type`: {kinds}. `config` comes first and once; then "
        "`text` pieces as they come, `flush` (speak what is buffered), `cancel` (barge-in: stop "
        "at once, drop what is queued) and finally `end`. The server answers `ready` (with the "
        "voice's `version`), then per "
        "segment `segment.started` (its span in the text sent), the audio as binary messages and "
        "`segment.done`; `cancelled` after `cancel`; `done` and a normal close after `end`; "
        '`{"type": "error", "error": {"code", "message"}}` for a bad message, a bad config '
        "(closed with 1008) or `idle_timeout`."
    )
    return {
        "speak_realtime": operation(
            "Realtime speech: text in as it comes, audio out (WebSocket)",
            {
                "101": {"description": "Switched to the WebSocket protocol."},
            },
            tag="speech",
            description=description,
        )
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = (
    (RealtimeConfig, "validation"),
    (RealtimeText, "validation"),
    (RealtimeControl, "validation"),
)
