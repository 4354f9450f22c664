"""The WebRTC endpoint's parts that need no server: offers checked, ICE servers announced,
trickled candidates read, host candidates announced at a public address, ICE bound in the
operator's UDP port range (two real aiortc peers on this machine), and a session's PATCH and
DELETE handed between the front ends of a host over its channel."""

import asyncio
import logging
import socket
from collections import Counter

import aioice.ice
import pytest
from aiohttp.test_utils import make_mocked_request
from aiortc import RTCPeerConnection
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as Metric
from pydantic import ValidationError

from voicehost.api.edge import ApiError, MalformedRequests
from voicehost.api.errors import kind_of
from voicehost.api.webrtc import END_TOPIC, TRICKLE_TOPIC, HeldElsewhere, PeerSession, PeerSessions
from voicehost.config import IceServer, Settings
from voicehost.host.channel import HostChannel
from voicehost.speech.admission import Refused
from voicehost.tenancy.keys import Principal
from voicehost.webrtc.ice import (
    CandidateScreen,
    announced,
    configure_ice,
    ice_configuration,
    link_headers,
    screening,
)
from voicehost.webrtc.offer import InvalidOffer, read_offer, trickled_candidates

pytestmark = pytest.mark.unit

OPEN = CandidateScreen(loopback=True, private=True)  # this machine's addresses are private ones


def no_count(reason: str) -> None:
    pass


@pytest.fixture
def ice(monkeypatch):
    """``configure_ice`` for one test: aioice as it was afterwards (the process's other tests
    run aiortc clients)."""
    for name in ("get_component_candidates", "_add_remote_candidate"):
        monkeypatch.setattr(aioice.ice.Connection, name, getattr(aioice.ice.Connection, name))
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", aioice.ice.CONSENT_INTERVAL)
    refused: Counter[str] = Counter()
    yield lambda settings: configure_ice(settings, lambda reason: refused.update([reason])), refused


async def make_offer(audio: str | None = "recvonly", channel: bool = True) -> str:
    pc = RTCPeerConnection()
    if channel:
        pc.createDataChannel("voicehost")
    if audio:
        pc.addTransceiver("audio", direction=audio)
    await pc.setLocalDescription(await pc.createOffer())
    await pc.close()
    return pc.localDescription.sdp


async def test_an_offer_needs_receiving_opus_audio_and_a_data_channel():
    assert read_offer(await make_offer(), OPEN, no_count).type == "offer"
    refusals = {}
    for name, sdp in {
        "sendonly": await make_offer(audio="sendonly"),
        "no audio": await make_offer(audio=None),
        "no channel": await make_offer(channel=False),
        "garbage": "v=0\r\nm=audio x",
        "no media": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n",
    }.items():
        with pytest.raises(InvalidOffer) as refused:
            read_offer(sdp, OPEN, no_count)
        refusals[name] = (kind_of(refused.value).status, refused.value.code)
    assert refusals == {
        "sendonly": (400, "no_audio"),
        "no audio": (400, "no_audio"),
        "no channel": (400, "no_data_channel"),
        "garbage": (400, "invalid_sdp"),
        "no media": (400, "invalid_sdp"),
    }


def test_ice_servers_come_from_the_rtcconfiguration_json_and_go_out_as_link_headers():
    settings = Settings(
        ice_servers=[
            {"urls": "stun:stun.example.net:3478"},
            {"urls": ["turn:turn.example.net:3478"], "username": "u", "credential": "p"},
        ]
    )
    assert [s.urls for s in settings.ice_servers] == [
        ["stun:stun.example.net:3478"],
        ["turn:turn.example.net:3478"],
    ]
    assert link_headers(settings.ice_servers) == [
        '<stun:stun.example.net:3478>; rel="ice-server"',
        '<turn:turn.example.net:3478>; rel="ice-server"; username="u"; credential="p"; '
        'credential-type="password"',
    ]
    configuration = ice_configuration(settings.ice_servers)
    assert configuration.iceServers[1].username == "u"
    assert ice_configuration([]).iceServers == []  # none by default: no server contacted
    for bad in ({"urls": "http://example.net"}, {"urls": "stun:x", "password": "p"}):
        with pytest.raises(ValidationError):
            IceServer.model_validate(bad)
    for ports in ("80-90", "5000-4000", "40000"):
        with pytest.raises(ValidationError):
            Settings(webrtc_udp_ports=ports)
    with pytest.raises(ValidationError):
        Settings(webrtc_announced_address="gateway.example.net")


def test_trickled_candidates_are_read_with_their_mid():
    fragment = (
        "a=ice-ufrag:abcd\r\na=ice-pwd:efgh\r\na=mid:0\r\n"
        "a=candidate:1 1 udp 2130706431 192.0.2.7 50000 typ host\r\n"
        "a=mid:1\r\na=candidate:2 1 udp 1694498815 198.51.100.3 50001 typ srflx\r\n"
        "a=end-of-candidates\r\n"
    )
    assert trickled_candidates(fragment) == [
        ("0", "1 1 udp 2130706431 192.0.2.7 50000 typ host"),
        ("1", "2 1 udp 1694498815 198.51.100.3 50001 typ srflx"),
    ]


def test_host_candidates_are_announced_at_the_public_address_with_their_ports():
    sdp = (
        "v=0\r\nm=audio 40000 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 10.1.2.3\r\n"
        "a=candidate:1 1 udp 2130706431 10.1.2.3 40000 typ host\r\n"
        "a=candidate:2 1 udp 1694498815 198.51.100.3 61000 typ srflx raddr 10.1.2.3 rport 40000"
        "\r\n"
    )
    public = announced(sdp, "203.0.113.9")
    assert "a=candidate:1 1 udp 2130706431 203.0.113.9 40000 typ host" in public
    assert "198.51.100.3 61000 typ srflx" in public  # other candidates as they were
    assert "c=IN IP4 203.0.113.9" in public
    assert announced(sdp, None) == sdp


async def test_ice_binds_in_the_port_range_and_connects(ice):
    """Two aiortc peers on this machine, ICE bound in 41000-41009: every candidate's port is in
    the range, and the data channel opens."""
    configure, _ = ice
    configure(Settings(webrtc_udp_ports="41000-41009", webrtc_private_candidates=True))
    offerer, answerer = RTCPeerConnection(), RTCPeerConnection()
    channel = offerer.createDataChannel("voicehost")
    opened = asyncio.Event()
    channel.on("open", opened.set)
    await offerer.setLocalDescription(await offerer.createOffer())
    await answerer.setRemoteDescription(offerer.localDescription)
    await answerer.setLocalDescription(await answerer.createAnswer())
    await offerer.setRemoteDescription(answerer.localDescription)
    await asyncio.wait_for(opened.wait(), 15)
    ports = [
        int(line.split()[5])
        for pc in (offerer, answerer)
        for line in pc.localDescription.sdp.splitlines()
        if line.startswith("a=candidate:")
    ]
    assert ports and all(41000 <= port <= 41009 for port in ports), ports
    await offerer.close()
    await answerer.close()


def without(sdp: str, *prefixes: str) -> str:
    return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith(prefixes))


def with_candidates(sdp: str, *addresses: str) -> str:
    """``sdp`` with its candidates replaced by host candidates at ``addresses``."""
    lines, port = [], 50000
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            continue
        lines.append(line)
        if line.startswith("a=mid:"):
            for address in addresses:
                port += 1
                lines.append(f"a=candidate:{port} 1 udp 2130706431 {address} {port} typ host")
    return "\r\n".join(lines)


async def test_an_offer_without_its_fingerprint_ice_credentials_or_a_usable_candidate_is_400():
    good = await make_offer()
    refused: list[str] = []
    said = {}
    for name, sdp in {
        "no fingerprint": without(good, "a=fingerprint:"),
        "no ice-ufrag": without(good, "a=ice-ufrag:"),
        "no ice-pwd": without(good, "a=ice-pwd:"),
        "holdconn": good.replace("a=setup:actpass", "a=setup:holdconn"),
        "metadata only": with_candidates(good, "169.254.169.254"),
    }.items():
        with pytest.raises(InvalidOffer) as refusal:
            read_offer(sdp, OPEN, refused.append)
        said[name] = (kind_of(refusal.value).status, refusal.value.code, refusal.value.message)
    assert {name: status_code[:2] for name, status_code in said.items()} == {
        name: (400, "invalid_sdp") for name in said
    }
    assert "DTLS fingerprint" in said["no fingerprint"][2]
    assert (
        "ICE credentials" in said["no ice-ufrag"][2] and "ICE credentials" in said["no ice-pwd"][2]
    )
    assert "no usable ICE candidate (1 link_local)" in said["metadata only"][2]
    assert refused == ["link_local"]  # an address once, whatever sections name it
    # one usable candidate beside it is an offer (the other is screened when it is added)
    mixed = with_candidates(good, "169.254.169.254", "198.51.100.7")
    assert read_offer(mixed, OPEN, refused.append).type == "offer"
    # none at all: trickled later
    assert read_offer(without(good, "a=candidate:"), OPEN, no_count).type == "offer"


def test_the_screen_refuses_what_no_check_may_reach_and_private_ranges_unless_allowed():
    closed = CandidateScreen(loopback=False, private=False)
    reasons = {
        address: (closed.refusal(address), OPEN.refusal(address))
        for address in (
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "224.0.0.251",
            "ff02::1",
            "255.255.255.255",
            "127.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "10.0.0.5",
            "192.168.1.20",
            "172.16.3.4",
            "fd00::2",
            "100.64.1.1",
            "198.51.100.7",
            "2001:4860::8888",
            "printer.example.net",
        )
    }
    assert reasons == {
        "169.254.169.254": ("link_local", "link_local"),
        "fe80::1": ("link_local", "link_local"),
        "0.0.0.0": ("unspecified", "unspecified"),
        "::": ("unspecified", "unspecified"),
        "224.0.0.251": ("multicast", "multicast"),
        "ff02::1": ("multicast", "multicast"),
        "255.255.255.255": ("broadcast", "broadcast"),
        "127.0.0.1": ("loopback", None),
        "::1": ("loopback", None),
        "::ffff:127.0.0.1": ("loopback", None),
        "10.0.0.5": ("private", None),
        "192.168.1.20": ("private", None),
        "172.16.3.4": ("private", None),
        "fd00::2": ("private", None),
        "100.64.1.1": ("private", None),
        "198.51.100.7": ("private", None),  # a documentation range: not routed either
        "2001:4860::8888": (None, None),
        "printer.example.net": ("not_an_address", "not_an_address"),
    }
    assert CandidateScreen.from_settings(Settings(host="0.0.0.0")).loopback is False
    assert CandidateScreen.from_settings(Settings(host="127.0.0.1")).loopback is True
    assert CandidateScreen.from_settings(Settings(webrtc_private_candidates=True)).private


async def test_ice_sends_no_check_to_a_refused_candidate_and_one_to_an_allowed_one(ice):
    """A real aioice connection, screened: a UDP socket on loopback named as the remote
    candidate gets no STUN request while loopback is refused (the service binds 0.0.0.0), and
    gets them once it is allowed; each refusal is counted."""
    configure, refused = ice

    async def checks_received(settings: Settings, listen: float) -> int:
        configure(settings)
        listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
        connection = aioice.ice.Connection(ice_controlling=True, components=1)
        connection.remote_username, connection.remote_password = "user", "p" * 22
        await connection.gather_candidates()
        port = listener.getsockname()[1]
        remote = aioice.Candidate("1", 1, "udp", 2130706431, "127.0.0.1", port, "host")
        with screening():  # as the service adds a client's candidates (not a client's own)
            await connection.add_remote_candidate(remote)
        await connection.add_remote_candidate(None)
        attempt = asyncio.ensure_future(connection.connect())
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + listen  # aioice sends its first check within milliseconds
        while loop.time() < deadline and not received:
            try:
                received += bool(await asyncio.wait_for(loop.sock_recv(listener, 2048), 0.1))
            except TimeoutError:
                pass
        attempt.cancel()
        await connection.close()
        listener.close()
        return received

    assert await checks_received(Settings(host="0.0.0.0"), listen=0.6) == 0
    assert refused == Counter({"loopback": 1})
    assert await checks_received(Settings(host="127.0.0.1"), listen=5.0) > 0
    assert refused == Counter({"loopback": 1})


def test_a_trickle_fragment_with_a_line_no_fragment_holds_is_400():
    for fragment in ("", "\x00\x01garbage", "v=0\r\na=candidate:1 1 udp 1 192.0.2.7 5 typ host"):
        with pytest.raises(InvalidOffer) as refused:
            trickled_candidates(fragment)
        assert (kind_of(refused.value).status, refused.value.code) == (400, "invalid_sdp")
    assert trickled_candidates("a=end-of-candidates\r\n") == []


def test_malformed_requests_are_one_warning_line_per_address_and_all_counted():
    counter = Metric("malformed", "test", registry=CollectorRegistry())
    quiet = MalformedRequests(counter, interval=60)
    from aiohttp.http_exceptions import BadHttpMessage

    def record(address: str, error: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            (address,),
            (type(error), error, None),
        )

    kept = [
        r
        for n in range(1000)
        if quiet.filter(
            r := record(f"203.0.113.{n % 2}", BadHttpMessage("Duplicate Content-Length"))
        )
    ]
    assert counter._value.get() == 1000 and len(kept) == 2
    assert kept[0].levelno == logging.WARNING and kept[0].exc_info is None
    assert kept[0].getMessage().startswith("malformed HTTP request from 203.0.113.0: 400")
    failed = record("203.0.113.0", RuntimeError("a handler's own failure"))
    assert quiet.filter(failed) and failed.levelno == logging.ERROR and failed.exc_info


class HeldPeer:
    """What a session's hand-over reaches of its peer: the candidates added, the hang-up."""

    def __init__(self) -> None:
        self.pc = self
        self.track = self
        self.candidates: list[str] = []
        self.ended = False

    async def addIceCandidate(self, candidate) -> None:  # aiortc's name
        self.candidates.append(candidate.ip)

    def drop(self) -> None:
        pass

    async def hang_up(self) -> None:
        self.ended = True


def session_request(method: str, session_id: str):
    return make_mocked_request(
        method, f"/v1/audio/speech/webrtc/{session_id}", match_info={"session_id": session_id}
    )


async def test_a_session_another_front_end_holds_is_found_and_handed_over_only_for_its_key(
    tmp_path,
):
    """Two front ends of a host, each with its ``PeerSessions`` on the host's channel (real
    sockets): the one that does not hold a session finds its holder by asking, and hands it a
    trickle and the end; another key's request, or an unknown session, is the same 404; a
    holder that has gone holds none (404 at once) and one that does not answer is 503."""
    settings = Settings()
    here, there = PeerSessions(settings), PeerSessions(settings)
    ends = [HostChannel(tmp_path, index, 2, timeout=0.5) for index in range(2)]
    here.join(ends[0])
    there.join(ends[1])
    for end in ends:
        await end.open()
    peer, session_id = HeldPeer(), "a" * 32
    there.sessions[session_id] = PeerSession(session_id, peer, "key-a")  # type: ignore[arg-type]
    owner, other = (Principal(key, "acme", frozenset()) for key in ("key-a", "key-b"))
    try:
        found = await here.find(session_request("PATCH", session_id), owner)
        assert found == HeldElsewhere(1, session_id, "key-a")
        for who, asked in ((other, session_id), (owner, "b" * 32), (owner, "not-an-id")):
            with pytest.raises(ApiError) as missing:
                await here.find(session_request("PATCH", asked), who)
            assert (missing.value.status, missing.value.code) == (404, "session_not_found")
        fragment = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        await here.hand_over(found, TRICKLE_TOPIC, fragment=fragment)
        assert peer.candidates == ["127.0.0.1"]
        await here.hand_over(found, END_TOPIC)
        assert peer.ended
        del there.sessions[session_id]  # its task would have removed it
        with pytest.raises(ApiError) as ended:
            await here.hand_over(found, END_TOPIC)
        assert ended.value.status == 404

        async def stuck(body: dict) -> dict:
            await asyncio.sleep(30)
            return {}

        await ends[1].close()
        with pytest.raises(ApiError) as gone:  # gone: its sessions with it
            await here.find(session_request("DELETE", session_id), owner)
        assert gone.value.status == 404
        silent = HostChannel(tmp_path, 1, 2)  # front end 1 again, its handlers blocked
        silent.on("webrtc.holds", stuck)
        await silent.open()
        try:
            with pytest.raises(Refused) as unanswered:
                await here.find(session_request("DELETE", session_id), owner)
            assert unanswered.value.code == "frontend_unavailable"  # 503: the error table's
            assert "front end 1 of this host did not answer" in unanswered.value.message
        finally:
            await silent.close()
    finally:
        for end in ends:
            await end.close()
