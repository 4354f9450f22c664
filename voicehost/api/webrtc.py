"""``POST /v1/audio/speech/webrtc``: the realtime session over WebRTC, the WHIP/WHEP convention.

The client POSTs an SDP offer (``application/sdp``) with a receiving audio section and a data
channel labelled ``voicehost``; the answer (201) carries the session's ``Location`` (``DELETE``
ends it, ``PATCH`` takes trickled ICE candidates) and the ICE servers in ``Link`` headers. The data
channel carries exactly the realtime socket's messages (``config`` first, text, ``flush``,
``cancel``, ``end``; every event back); the audio is the session's track: Opus at 48 kHz in 20 ms
packets, paced by a real-time clock (``audio/opus_track.py``). One ``RealtimeSession``, two
transports: the session speaks to a ``PeerListener`` as it speaks to a socket.

A ``cancel`` drops the packets queued for the track at once, and the audio that was on its way
until the session's ``cancelled``: the listener hears at most the packet on the wire and its own
jitter buffer. A session's end waits for its queued audio to be played out. A peer that never
connects (``webrtc_connect_timeout_seconds``) or stops answering ICE consent checks
(``webrtc_consent_seconds``) is closed, and its stream and engine request freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import uuid
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field

from aiohttp import web
from aiortc import (
    RTCDataChannel,
    RTCIceCandidate,
    RTCPeerConnection,
)

from voicehost.api.auth import request_principal
from voicehost.api.edge import SERVICE, SERVING
from voicehost.api.errors import ApiError
from voicehost.api.listeners import Listener, NotText
from voicehost.api.openapi import Json, Models, operation
from voicehost.api.realtime import SessionWork, serve_listener, speaking
from voicehost.api.speech import RealtimeConfig
from voicehost.audio.opus_track import OPUS_RATE, OpusPacketizer, PacedOpusTrack
from voicehost.config import Settings
from voicehost.host.channel import Body, ChannelError, HostChannel, PeerGone, PeerSilent
from voicehost.metrics import SpeechMetrics
from voicehost.speech.admission import Refused
from voicehost.tenancy.keys import Principal
from voicehost.webrtc.ice import (
    announced,
    configured_screen,
    ice_configuration,
    link_headers,
    screening,
)
from voicehost.webrtc.offer import DATA_CHANNEL, InvalidOffer, read_candidates, read_offer

log = logging.getLogger(__name__)

WEBRTC_PATH = "/v1/audio/speech/webrtc"
SESSION_PATH = WEBRTC_PATH + "/{session_id}"
SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
MAX_SDP_BYTES = 64 * 1024
SESSION_ID = re.compile(r"[0-9a-f]{32}")


# --- the listener ---------------------------------------------------------------------------------


def event_type(text: str) -> str:
    """The ``type`` of an event or message as sent ("" for anything else)."""
    with suppress(ValueError, TypeError, AttributeError):
        return str(json.loads(text).get("type", ""))
    return ""


class PeerListener(Listener):
    """A WebRTC peer: messages on its ``voicehost`` data channel, audio on its track (PCM at
    48 kHz in, Opus packets out, paced)."""

    transport = "webrtc"

    def __init__(self, pc: RTCPeerConnection) -> None:
        self.pc = pc
        self.packetizer = OpusPacketizer()
        self.track = PacedOpusTrack(lambda: self.packetizer.flush())
        self.channel: RTCDataChannel | None = None
        self.inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.opened = asyncio.Event()  # the data channel is open
        self.muted = False  # from a client's cancel to the session's ``cancelled``
        self.ended = False
        self.lost = False  # the peer vanished: no close, no DELETE
        pc.on("datachannel", self._attach)
        pc.on("connectionstatechange", self._state_changed)

    def _attach(self, channel: RTCDataChannel) -> None:
        if channel.label != DATA_CHANNEL or self.channel is not None:
            return
        self.channel = channel
        channel.on("message", self.inbox.put_nowait)
        channel.on("close", lambda: self.inbox.put_nowait(None))
        if channel.readyState == "open":
            self.opened.set()
        else:
            channel.on("open", self.opened.set)

    async def _state_changed(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            # ICE failed, or consent expired, with the data channel still open: the peer vanished
            channel_open = self.channel is not None and self.channel.readyState == "open"
            self.lost = not self.ended and (channel_open or self.pc.connectionState == "failed")
            self.inbox.put_nowait(None)

    @property
    def closed(self) -> bool:
        return self.ended or self.pc.connectionState in ("failed", "closed")

    def shape(self, config: RealtimeConfig) -> RealtimeConfig:
        """PCM at Opus' rate: the track's packetizer takes it as it comes."""
        return config.model_copy(update={"response_format": "pcm", "sample_rate": OPUS_RATE})

    async def receive(self, within: float | None) -> str | None:
        async with asyncio.timeout(within):
            message = await self.inbox.get()
        if message is None:
            return None
        if not isinstance(message, str):
            raise NotText
        if '"cancel"' in message and event_type(message) == "cancel":
            self.track.drop()  # barge-in, heard: what is queued is never sent
            self.packetizer = OpusPacketizer()
            self.muted = True
        return message

    async def send_text(self, text: str) -> None:
        if self.channel is None or self.channel.readyState != "open":
            raise ConnectionError("the data channel is closed")
        kind = event_type(text)
        if kind == "ready":  # what the listener hears: the track
            ready = json.loads(text)
            ready.update(
                response_format="opus",
                sample_rate=OPUS_RATE,
                content_type="audio/opus",
                transport=self.transport,
            )
            text = json.dumps(ready)
        elif kind == "cancelled":
            self.muted = False
        elif kind == "segment.done" and not self.muted:
            self.track.end_talkspurt()
        self.channel.send(text)

    def played_seconds(self, sent: float, since: float | None) -> float:
        """The audio the track has sent on the wire: what the listener's stack has (its jitter
        buffer aside)."""
        return self.track.played_seconds

    async def send_audio(self, data: bytes) -> None:
        if not self.muted:
            self.track.queue(self.packetizer.encode(data))

    async def close(self, reason: str = "") -> None:
        """Once the queued audio has been played out."""
        self.track.end_talkspurt()
        with suppress(TimeoutError):
            async with asyncio.timeout(self.track.queued_seconds + 2.0):
                await self.track.drained()
        await self.hang_up()

    async def end_with(self, event: dict[str, object], retry_later: bool = False) -> None:
        with suppress(ConnectionError):
            await self.send_event(event)
        await self.hang_up()

    async def fail(self, event: dict[str, object]) -> None:
        await self.end_with(event)

    async def hang_up(self) -> None:
        self.ended = True
        self.opened.set()  # a session ended before it connected waits no longer
        self.track.stop()
        if self.channel is not None and self.channel.readyState == "open":
            await asyncio.sleep(0.05)  # the last event leaves before the association closes
        await self.pc.close()
        self.inbox.put_nowait(None)


# --- the sessions of a process --------------------------------------------------------------------


@dataclass
class PeerSession:
    session_id: str
    listener: PeerListener
    key_id: str | None  # who opened it: only they may end it or trickle candidates
    address: str | None = None  # the client's, as the offer came
    task: asyncio.Task[None] | None = None

    async def trickle(self, candidates: list[RTCIceCandidate]) -> None:
        with screening():
            for candidate in candidates:
                await self.listener.pc.addIceCandidate(candidate)

    async def end(self) -> None:
        """Now: its queued audio dropped, its stream freed."""
        self.listener.track.drop()
        await self.listener.hang_up()
        if self.task is not None and self.task is not asyncio.current_task():
            with suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self.task)  # a caller cancelled leaves the ending whole


# what a front end of a host asks the others about a session (``PeerSessions.join``)
HOLDS, TRICKLE_TOPIC, END_TOPIC = "webrtc.holds", "webrtc.trickle", "webrtc.end"
END_TIMEOUT_S = 10.0  # for the holder to end a session handed over (its stream freed first)


@dataclass(frozen=True)
class HeldElsewhere:
    """A session another front end of this host holds: front end ``frontend``'s, opened with
    the key ``key_id``."""

    frontend: int
    session_id: str
    key_id: str | None

    def body(self, **more: str) -> Body:
        return {"session_id": self.session_id, "key_id": self.key_id, **more}


@dataclass
class PeerSessions:
    """This process's WebRTC sessions, by id. The front ends of one host (``--frontends``)
    share its port, so a session's ``DELETE`` or ``PATCH`` may reach another front end than
    the one holding it: that one asks the others over the host's channel (``join``) which of
    them holds it, then hands the request to the holder."""

    settings: Settings
    channel: HostChannel | None = None
    sessions: dict[str, PeerSession] = field(default_factory=dict)
    # answered, waiting for their peer: no data channel and config yet (they hold no stream)
    pending: dict[str, PeerSession] = field(default_factory=dict)

    def join(self, channel: HostChannel) -> None:
        """Answer the host's other front ends about this process's sessions over ``channel``
        (``voicehost.host.channel``), and ask them about theirs."""
        self.channel = channel
        channel.on(HOLDS, self._holds)
        channel.on(TRICKLE_TOPIC, self._trickle)
        channel.on(END_TOPIC, self._end)

    def check_pending(self, key_id: str | None, address: str | None) -> None:
        """Refuse another offer while too many wait for their peers: in all (503), of this
        key or from this address (429), each with when to retry (a pending offer connects or
        ends within the connect timeout)."""
        settings = self.settings
        retry = max(1, math.ceil(settings.webrtc_connect_timeout_seconds))
        waiting = list(self.pending.values())
        if len(waiting) >= settings.webrtc_max_pending:
            raise Refused("at_capacity", "this server has its most WebRTC offers pending", retry)
        if key_id is not None and (
            sum(s.key_id == key_id for s in waiting) >= settings.webrtc_max_pending_per_key
        ):
            what = f"this API key has {settings.webrtc_max_pending_per_key} WebRTC offers pending"
            raise Refused("too_many_pending", what, retry)
        if address is not None and (
            sum(s.address == address for s in waiting) >= settings.webrtc_max_pending_per_address
        ):
            what = f"{settings.webrtc_max_pending_per_address} WebRTC offers from {address} pending"
            raise Refused("too_many_pending", what, retry)

    async def find(
        self, request: web.Request, principal: Principal | None
    ) -> PeerSession | HeldElsewhere:
        """The session the path names, this process's or another front end's of the host; 404
        for none, or another key's; 503 ``frontend_unavailable`` when a front end that might
        hold it does not answer."""
        session_id = request.match_info["session_id"]
        key_id = principal.key_id if principal is not None else None
        if SESSION_ID.fullmatch(session_id):
            if (session := self.sessions.get(session_id)) is not None:
                if session.key_id == key_id:  # another's is as good as none
                    return session
            elif self.channel is not None:
                if (elsewhere := await self._holder(session_id, key_id)) is not None:
                    return elsewhere
        raise ApiError("session_not_found", f"no WebRTC session {session_id!r}")

    async def _holder(self, session_id: str, key_id: str | None) -> HeldElsewhere | None:
        """The other front end holding ``session_id`` for ``key_id``, asked over the channel.
        One not listening holds none (it has ended, its sessions with it, or not started)."""
        assert self.channel is not None
        answers = await self.channel.ask_others(HOLDS, {"session_id": session_id, "key_id": key_id})
        for frontend, answer in answers.items():
            if isinstance(answer, dict) and answer.get("held"):
                return HeldElsewhere(frontend, session_id, key_id)
        for answer in answers.values():
            if isinstance(answer, PeerSilent):
                raise _unavailable(answer)
            if isinstance(answer, ChannelError) and not isinstance(answer, PeerGone):
                raise answer  # its handler failed: a failure of this request (500)
        return None

    async def hand_over(self, elsewhere: HeldElsewhere, topic: str, **more: str) -> None:
        """``topic``'s request to the front end holding the session; 404 if it no longer
        does, 503 ``frontend_unavailable`` if it does not answer."""
        assert self.channel is not None
        within = END_TIMEOUT_S if topic == END_TOPIC else None
        try:
            answer = await self.channel.ask(
                elsewhere.frontend, topic, elsewhere.body(**more), within=within
            )
        except PeerSilent as exc:
            raise _unavailable(exc) from exc
        except PeerGone:
            answer = {"held": False}  # ended, and its sessions with it
        if not answer.get("held"):
            raise ApiError("session_not_found", f"no WebRTC session {elsewhere.session_id!r}")

    def _held(self, body: Body) -> PeerSession | None:
        """This process's session a question from another front end names, if its key's."""
        session = self.sessions.get(str(body.get("session_id")))
        return session if session is not None and session.key_id == body.get("key_id") else None

    async def _holds(self, body: Body) -> Body:
        return {"held": self._held(body) is not None}

    async def _trickle(self, body: Body) -> Body:
        if (session := self._held(body)) is None:
            return {"held": False}
        await session.trickle(read_candidates(str(body["fragment"])))
        return {"held": True}

    async def _end(self, body: Body) -> Body:
        if (session := self._held(body)) is None:
            return {"held": False}
        await session.end()
        return {"held": True}


def _unavailable(exc: ChannelError) -> Refused:
    return Refused("frontend_unavailable", f"{exc}: try again", retry_after=1)


PEERS = web.AppKey("webrtc_sessions", PeerSessions)


async def open_session(
    request: web.Request, principal: Principal | None, work: SessionWork
) -> web.Response:
    """Answer an offer and run ``work`` (a server's session, a gateway's relay) on the peer
    once its data channel opens and its config arrives: until then the session is pending
    (``PeerSessions.check_pending`` bounds those) and holds no stream; ``work`` takes one."""
    key_id = principal.key_id if principal is not None else None
    async with AsyncExitStack() as failing:
        sessions = request.app[PEERS]
        settings = sessions.settings
        metrics = request.app[SERVICE].metrics
        body = await request.content.read(MAX_SDP_BYTES + 1)
        if len(body) > MAX_SDP_BYTES:
            raise ApiError("body_too_large", f"an offer is at most {MAX_SDP_BYTES} bytes")
        if request.content_type != SDP:
            raise ApiError("unsupported_media_type", f"send the SDP offer as {SDP}")
        offer = read_offer(body.decode("utf-8", "replace"), *configured_screen())
        if len(sessions.sessions) >= settings.webrtc_max_sessions:
            raise Refused(
                "at_capacity", "this server holds its most WebRTC sessions", retry_after=1
            )
        sessions.check_pending(key_id, request.remote)
        pc = RTCPeerConnection(ice_configuration(settings.ice_servers))
        failing.push_async_callback(pc.close)
        listener = PeerListener(pc)
        session = PeerSession(uuid.uuid4().hex, listener, key_id, request.remote)
        # pending from now (before the awaits below, so that offers at once count each other)
        sessions.pending[session.session_id] = session
        failing.callback(sessions.pending.pop, session.session_id, None)
        try:
            with screening():
                await pc.setRemoteDescription(offer)
            pc.addTrack(listener.track)
            await pc.setLocalDescription(await pc.createAnswer())
        except (ValueError, KeyError, AttributeError) as exc:  # aiortc's, on an offer it can't take
            raise InvalidOffer(f"the offer cannot be answered: {exc}") from exc
        # found by its DELETE or PATCH from the moment it is answered, on any front end
        sessions.sessions[session.session_id] = session
        metrics.webrtc_sessions.inc()
        session.task = asyncio.create_task(
            run_session(sessions, session, work, metrics), name="webrtc-session"
        )
        failing.pop_all()
    headers = {"Location": f"{WEBRTC_PATH}/{session.session_id}"}
    answer = announced(pc.localDescription.sdp, settings.webrtc_announced_address)
    response = web.Response(status=201, text=answer, content_type=SDP, headers=headers)
    for link in link_headers(settings.ice_servers):
        response.headers.add("Link", link)
    return response


async def run_session(
    sessions: PeerSessions,
    session: PeerSession,
    work: SessionWork,
    metrics: SpeechMetrics,
) -> None:
    """The session from its answer to its end: its data channel opens within the connect
    timeout, then its config arrives and ``work`` runs on it (the session no longer pending);
    at the end its record is removed."""
    listener = session.listener
    settings = sessions.settings

    async def settled(listener: Listener, config: RealtimeConfig) -> None:
        sessions.pending.pop(session.session_id, None)
        await work(listener, config)

    try:
        try:
            async with asyncio.timeout(settings.webrtc_connect_timeout_seconds):
                await listener.opened.wait()
        except TimeoutError:
            state = listener.pc.connectionState
            log.info("webrtc session %s never connected (%s)", session.session_id, state)
            metrics.errors.labels("webrtc_connect_failed").inc()
            return
        if listener.ended:  # ended (DELETE, shutdown) before its data channel opened
            return
        await serve_listener(listener, settings.ws_idle_timeout_seconds, settled)
        if listener.lost:
            log.info("webrtc session %s: its peer vanished", session.session_id)
            metrics.errors.labels("webrtc_peer_lost").inc()
    finally:
        sessions.sessions.pop(session.session_id, None)
        sessions.pending.pop(session.session_id, None)
        metrics.webrtc_sessions.dec()
        with suppress(Exception):
            await listener.hang_up()


async def update_session(request: web.Request) -> web.Response:
    """``PATCH``: the client's trickled ICE candidates (``application/trickle-ice-sdpfrag``)."""
    sessions = request.app[PEERS]
    target = await sessions.find(request, request_principal(request))
    if request.content_type != TRICKLE:
        raise ApiError("unsupported_media_type", f"send trickled candidates as {TRICKLE}")
    body = await request.content.read(MAX_SDP_BYTES + 1)
    if len(body) > MAX_SDP_BYTES:
        raise ApiError("body_too_large", f"a fragment is at most {MAX_SDP_BYTES} bytes")
    try:
        fragment = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidOffer("the trickle-ice-sdpfrag is not UTF-8 text") from exc
    candidates = read_candidates(fragment)
    if isinstance(target, HeldElsewhere):
        await sessions.hand_over(target, TRICKLE_TOPIC, fragment=fragment)
    else:
        await target.trickle(candidates)
    return web.Response(status=204)


async def end_session(request: web.Request) -> web.Response:
    """``DELETE``: the session ends now (its queued audio dropped), its stream freed."""
    sessions = request.app[PEERS]
    target = await sessions.find(request, request_principal(request))
    if isinstance(target, HeldElsewhere):
        await sessions.hand_over(target, END_TOPIC)
    else:
        await target.end()
    return web.Response(status=204)


async def close_sessions(app: web.Application) -> None:
    """On shutdown: every session ends (a drain has let them finish first)."""
    for session in list(app[PEERS].sessions.values()):
        await session.listener.hang_up()


async def speech_webrtc(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech/webrtc`` on a process that speaks: 503 while warming up; the
    stream is admitted as a realtime socket's is (capacity, the key's quota) once the peer's
    config arrives, a refusal then an ``error`` event with ``retry_after`` and the session's
    end, the session counted as a stream until it ends. An offer whose peer never connects
    is not counted."""
    serving = request.app[SERVING]
    principal = request_principal(request)
    synthesizer = serving.require_synthesizer()  # NotReady: 503, as the error middleware says
    speak = speaking(request, serving, synthesizer, principal)

    async def admitted(listener: Listener, config: RealtimeConfig) -> None:
        async with serving.admit(principal):  # Refused: the error event, from serve_listener
            await speak(listener, config)

    return await open_session(request, principal, admitted)


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operations of the WebRTC routes (their error answers: the error table's)."""
    sdp = {"schema": {"type": "string"}}
    description = (
        "The realtime session over WebRTC (the WHIP/WHEP convention). The body is an SDP offer "
        "with an audio section that receives Opus and a data channel labelled `voicehost`; the "
        "answer is the server's SDP, with every candidate in it. The data channel carries the "
        "realtime socket's messages and events (see `speak_realtime`): `config` first; its "
        "`response_format` and `sample_rate` do not apply, the audio is the session's track "
        "(Opus, 48 kHz, 20 ms packets, paced in real time; `ready` says so). `cancel` drops the "
        "audio queued for the track. ICE servers come in `Link` headers (`rel=ice-server`). "
        "The stream is admitted when the config arrives (a refusal: an `error` event with "
        "`retry_after`); until then the offer is pending and holds no stream. No ICE check goes "
        "to a link-local, unspecified, multicast or broadcast candidate, nor to loopback or "
        "private ones unless the service allows them."
    )
    return {
        "speak_webrtc": operation(
            "Realtime speech over WebRTC: an SDP offer in, the answer out",
            {
                "201": {
                    "description": "The SDP answer.",
                    "content": {"application/sdp": sdp},
                    "headers": {
                        "Location": {
                            "description": "The session: DELETE ends it, PATCH trickles ICE.",
                            "schema": {"type": "string"},
                        },
                        "Link": {
                            "description": 'An ICE server, `<url>; rel="ice-server"`.',
                            "schema": {"type": "string"},
                        },
                    },
                },
            },
            tag="speech",
            description=description,
            body={"required": True, "content": {"application/sdp": sdp}},
        ),
        "update_webrtc": operation(
            "Trickled ICE candidates for a WebRTC session",
            {
                "204": {"description": "Added."},
            },
            tag="speech",
            body={
                "required": True,
                "content": {"application/trickle-ice-sdpfrag": {"schema": {"type": "string"}}},
            },
        ),
        "end_webrtc": operation(
            "End a WebRTC session",
            {
                "204": {"description": "Ended; its stream is freed."},
            },
            tag="speech",
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ()
