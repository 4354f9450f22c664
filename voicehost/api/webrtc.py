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
import ipaddress
import json
import logging
import math
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aioice.ice
from aiohttp import web
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceCandidate,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.sdp import SessionDescription, candidate_from_sdp

from voicehost.api.auth import is_loopback_host, request_principal
from voicehost.api.edge import SERVICE, SERVING
from voicehost.api.errors import ApiError
from voicehost.api.listeners import Listener, NotText
from voicehost.api.openapi import Json, Models, operation
from voicehost.api.realtime import SessionWork, serve_listener, speaking
from voicehost.api.speech import RealtimeConfig
from voicehost.audio.opus_track import OPUS_RATE, OpusPacketizer, PacedOpusTrack
from voicehost.config import IceServer, Settings
from voicehost.host.channel import Body, ChannelError, HostChannel, PeerGone, PeerSilent
from voicehost.metrics import SpeechMetrics
from voicehost.speech.admission import Refused
from voicehost.tenancy.keys import Principal

log = logging.getLogger(__name__)

WEBRTC_PATH = "/v1/audio/speech/webrtc"
SESSION_PATH = WEBRTC_PATH + "/{session_id}"
DATA_CHANNEL = "voicehost"
SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"
MAX_SDP_BYTES = 64 * 1024
SESSION_ID = re.compile(r"[0-9a-f]{32}")


# --- ICE: the servers, the ports ----------------------------------------------------------------


def ice_configuration(servers: list[IceServer]) -> RTCConfiguration:
    """The peer connection's configuration: the operator's STUN/TURN servers, or none (host
    candidates only: no server is contacted unless configured)."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in servers
        ]
    )


def link_headers(servers: list[IceServer]) -> list[str]:
    """The ``Link`` headers of a WHIP answer: each ICE server for the client, TURN's
    credentials with it (RFC 9725, section 4.6)."""
    links = []
    for server in servers:
        for url in server.urls:
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f'; username="{server.username}"'
            if server.credential is not None:
                link += f'; credential="{server.credential}"; credential-type="password"'
            links.append(link)
    return links


def announced(sdp: str, address: str | None) -> str:
    """``sdp`` with its host candidates (and connection lines) at ``address``, their ports
    unchanged: behind a one-to-one NAT or a published port, the address a client can reach."""
    if address is None:
        return sdp
    version = "IP6" if ":" in address else "IP4"
    lines = []
    for line in sdp.split("\r\n"):
        bits = line.split(" ")
        if line.startswith("a=candidate:") and len(bits) >= 8 and bits[7] == "host":
            bits[4] = address
            line = " ".join(bits)
        elif line.startswith("c=IN "):
            line = f"c=IN {version} {address}"
        lines.append(line)
    return "\r\n".join(lines)


# --- ICE: where checks may go ----------------------------------------------------------------


@dataclass(frozen=True)
class CandidateScreen:
    """Which remote candidates ICE may send checks to: a client writes its candidates' addresses
    itself, so a check is a packet this service sends wherever an offer says. Never to
    link-local (a cloud's metadata address), unspecified, multicast or broadcast addresses;
    to loopback only when the service binds a loopback address; to private ranges only when
    ``webrtc_private_candidates`` says the service is on a private network."""

    loopback: bool
    private: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> CandidateScreen:
        return cls(is_loopback_host(settings.host), settings.webrtc_private_candidates)

    def refusal(self, address: str) -> str | None:
        """Why no check may go to ``address`` (the reason counted), or None if one may.
        An mDNS name (``.local``) is screened once it resolves (aioice resolves it)."""
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            return "not_an_address"
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_unspecified:
            return "unspecified"
        if ip.is_multicast:
            return "multicast"
        if ip == ipaddress.IPv4Address("255.255.255.255"):
            return "broadcast"
        if ip.is_link_local:
            return "link_local"
        if ip.is_loopback:
            return None if self.loopback else "loopback"
        if ip.is_private or ip.is_reserved or ip in _SHARED_ADDRESSES:
            return None if self.private else "private"
        return None


_SHARED_ADDRESSES = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
_gather = aioice.ice.Connection.get_component_candidates
_add_remote = aioice.ice.Connection._add_remote_candidate
_ports: tuple[int, int] | None = None
_screen = CandidateScreen(loopback=False, private=False)
_refused: Callable[[str], None] = lambda reason: None  # noqa: E731 (set by configure_ice)


def configure_ice(settings: Settings, refused: Callable[[str], None]) -> None:
    """This process's ICE: host candidates bound in ``webrtc_udp_ports`` (aioice binds each on
    an ephemeral port, and has no setting for a range), loopback where the host has no other
    address, consent checks that find a vanished peer in ``webrtc_consent_seconds``, and
    remote candidates screened (``CandidateScreen``), each refused one told to ``refused``
    with its reason. Every remote candidate, from an offer, a trickle or an mDNS name
    resolved, reaches aioice's connection through ``_add_remote_candidate``: screened there."""
    global _ports, _screen, _refused
    _ports = settings.udp_port_range()
    _screen = CandidateScreen.from_settings(settings)
    _refused = refused
    aioice.ice.CONSENT_INTERVAL = settings.webrtc_consent_seconds / aioice.ice.CONSENT_FAILURES
    aioice.ice.Connection.get_component_candidates = _gather_in_range  # type: ignore[method-assign]
    aioice.ice.Connection._add_remote_candidate = _add_screened  # type: ignore[method-assign]


# set while this service adds a client's candidates (its answer, a trickle): the screen applies
# to the service's own peer connections only, not to a client's in the same process (a test's)
_screening: ContextVar[CandidateScreen | None] = ContextVar("ice_screening", default=None)


@contextmanager
def screening() -> Iterator[None]:
    """Screen the remote candidates added within (tasks started within inherit it)."""
    token = _screening.set(_screen)
    try:
        yield
    finally:
        _screening.reset(token)


def _add_screened(
    connection: aioice.ice.Connection, candidate: aioice.Candidate, host: str
) -> None:
    screen = _screening.get()
    reason = None if screen is None else screen.refusal(host)
    if reason is not None:
        log.debug("ICE candidate %s refused (%s)", host, reason)
        _refused(reason)
        return
    _add_remote(connection, candidate, host)


async def _gather_in_range(
    connection: aioice.ice.Connection,
    component: int,
    addresses: list[str],
    timeout: int = 5,  # noqa: ASYNC109 (aioice's signature)
) -> list[aioice.Candidate]:
    addresses = addresses or ["127.0.0.1"]  # a host with no other address: a local one
    if _ports is None:
        return await _gather(connection, component, addresses, timeout)
    first, last = _ports
    loop = asyncio.get_running_loop()
    bind_any = loop.create_datagram_endpoint

    async def bind_in_range(
        factory: Callable[[], asyncio.DatagramProtocol],
        local_addr: tuple[str, int] | None = None,
        **kwargs: Any,
    ) -> tuple[asyncio.DatagramTransport, asyncio.DatagramProtocol]:
        if local_addr is None or local_addr[1] != 0:
            return await bind_any(factory, local_addr=local_addr, **kwargs)
        for port in range(first, last + 1):
            with suppress(OSError):
                return await bind_any(factory, local_addr=(local_addr[0], port), **kwargs)
        raise OSError(f"no free UDP port in {first}-{last}")

    loop.create_datagram_endpoint = bind_in_range  # type: ignore[method-assign]
    try:
        return await _gather(connection, component, addresses, timeout)
    finally:
        del loop.create_datagram_endpoint


# --- the offer ------------------------------------------------------------------------------------


def read_offer(
    request: web.Request, body: str, screen: CandidateScreen, refused: Callable[[str], None]
) -> RTCSessionDescription:
    """The client's offer, checked: SDP, with an audio section that receives Opus and a data
    channel section, each section with its DTLS fingerprint, a setup role aiortc takes and ICE
    credentials, and a candidate ``screen`` lets ICE check if it names any (an offer may name
    none and trickle them). 415 for another content type, 400 otherwise (``invalid_sdp``,
    ``no_audio``, ``no_data_channel``); the candidates of an offer refused for having no
    usable one are told to ``refused``."""
    if request.content_type != SDP:
        raise ApiError("unsupported_media_type", f"send the SDP offer as {SDP}")
    try:
        parsed = SessionDescription.parse(body)
    except Exception as exc:  # aiortc's parser raises what it meets: ValueError, KeyError ...
        raise ApiError("invalid_sdp", f"the offer is not SDP: {exc!r}") from exc
    if not body.startswith("v=0") or not parsed.media:
        raise ApiError("invalid_sdp", "the offer is not SDP with media sections")
    audio = [m for m in parsed.media if m.kind == "audio"]
    receiving = [m for m in audio if m.direction in (None, "sendrecv", "recvonly")]
    if not receiving:
        raise ApiError("no_audio", "the offer has no audio section that receives")
    if not any(c.mimeType.lower() == "audio/opus" for m in receiving for c in m.rtp.codecs):
        raise ApiError("no_audio", "the offer's audio does not take Opus")
    if not any(m.kind == "application" and (m.sctpmap or m.sctp_port) for m in parsed.media):
        missing = f"the offer has no data channel: open one labelled {DATA_CHANNEL!r}"
        raise ApiError("no_data_channel", missing)
    for media in parsed.media:
        if media.dtls is None or not media.dtls.fingerprints:
            raise ApiError("invalid_sdp", f"the offer's {media.kind} has no DTLS fingerprint")
        if media.dtls.role not in ("auto", "client", "server"):
            raise ApiError("invalid_sdp", f"the offer's DTLS setup role is {media.dtls.role}")
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            missing = "no ICE credentials (a=ice-ufrag, a=ice-pwd)"
            raise ApiError("invalid_sdp", f"the offer's {media.kind} has {missing}")
    # each address once (the sections of a bundle name the same ones); an mDNS name is
    # screened once aioice has resolved it
    addresses = {c.ip for m in parsed.media for c in m.ice_candidates}
    reasons = {ip: screen.refusal(ip) for ip in addresses if not ip.endswith(".local")}
    if addresses and len(reasons) == len(addresses) and None not in reasons.values():
        # none usable (an offer naming none at all trickles them later: not refused)
        for reason in reasons.values():
            refused(reason)
        counts = Counter(reasons.values())
        listed = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
        raise ApiError("invalid_sdp", f"the offer has no usable ICE candidate ({listed})")
    return RTCSessionDescription(sdp=body, type="offer")


# the lines a trickle-ice-sdpfrag holds (RFC 8840, section 9): anything else is not one
FRAGMENT_LINES = (
    "a=ice-lite",
    "a=ice-options:",
    "a=ice-ufrag:",
    "a=ice-pwd:",
    "a=group:",
    "m=",
    "a=mid:",
    "a=candidate:",
    "a=end-of-candidates",
)


def trickled_candidates(fragment: str) -> list[tuple[str | None, str]]:
    """(mid, candidate) of each ``a=candidate`` line of a trickle-ice-sdpfrag (RFC 8840);
    400 ``invalid_sdp`` for a fragment with no line, or with a line no fragment holds."""
    mid, found, lines = None, [], 0
    for line in fragment.splitlines():
        line = line.strip()
        if not line:
            continue
        lines += 1
        if not line.startswith(FRAGMENT_LINES):
            raise ApiError("invalid_sdp", f"not a trickle-ice-sdpfrag line: {line[:80]!r}")
        if line.startswith("a=mid:"):
            mid = line[len("a=mid:") :]
        elif line.startswith("a=candidate:"):
            found.append((mid, line[len("a=candidate:") :]))
    if not lines:
        raise ApiError("invalid_sdp", "the trickle-ice-sdpfrag is empty")
    return found


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


def read_candidates(fragment: str) -> list[RTCIceCandidate]:
    """The ICE candidates of a trickle-ice-sdpfrag; 400 ``invalid_sdp`` for a line that is
    not one."""
    candidates = []
    for mid, line in trickled_candidates(fragment):
        try:
            candidate = candidate_from_sdp(line)
        except (AssertionError, ValueError, IndexError) as exc:
            raise ApiError("invalid_sdp", f"not an ICE candidate: {line[:80]!r}") from exc
        candidate.sdpMid = mid
        candidate.sdpMLineIndex = None if mid is not None else 0
        candidates.append(candidate)
    return candidates


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
        offer = read_offer(request, body.decode("utf-8", "replace"), _screen, _refused)
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
            raise ApiError("invalid_sdp", f"the offer cannot be answered: {exc}") from exc
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
        raise ApiError("invalid_sdp", "the trickle-ice-sdpfrag is not UTF-8 text") from exc
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
