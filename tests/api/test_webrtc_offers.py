"""The WebRTC endpoint's parts that need no server: offers checked, ICE servers announced,
trickled candidates read, host candidates announced at a public address, and ICE bound in the
operator's UDP port range (two real aiortc peers on this machine)."""

import asyncio

import pytest
from aiortc import RTCPeerConnection
from pydantic import ValidationError

from voicehost.api.edge import ApiError
from voicehost.api.webrtc import (
    announced,
    configure_ice,
    ice_configuration,
    link_headers,
    read_offer,
    trickled_candidates,
)
from voicehost.config import IceServer, Settings

pytestmark = pytest.mark.unit


class Offered:
    """What ``read_offer`` reads of a request: its content type."""

    def __init__(self, content_type: str = "application/sdp") -> None:
        self.content_type = content_type


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
    assert read_offer(Offered(), await make_offer()).type == "offer"
    refusals = {}
    for name, sdp in {
        "sendonly": await make_offer(audio="sendonly"),
        "no audio": await make_offer(audio=None),
        "no channel": await make_offer(channel=False),
        "garbage": "v=0\r\nm=audio x",
        "no media": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n",
    }.items():
        with pytest.raises(ApiError) as refused:
            read_offer(Offered(), sdp)
        refusals[name] = (refused.value.status, refused.value.code)
    assert refusals == {
        "sendonly": (400, "no_audio"),
        "no audio": (400, "no_audio"),
        "no channel": (400, "no_data_channel"),
        "garbage": (400, "invalid_sdp"),
        "no media": (400, "invalid_sdp"),
    }
    with pytest.raises(ApiError) as refused:
        read_offer(Offered("application/json"), await make_offer())
    assert (refused.value.status, refused.value.code) == (415, "unsupported_media_type")


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


async def test_ice_binds_in_the_port_range_and_connects():
    """Two aiortc peers on this machine, ICE bound in 41000-41009: every candidate's port is in
    the range, and the data channel opens."""
    configure_ice(Settings(webrtc_udp_ports="41000-41009"))
    try:
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
    finally:
        configure_ice(Settings())
