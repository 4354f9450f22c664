"""ICE for the service's peer connections: the operator's STUN/TURN servers (for the peer and,
as ``Link`` headers, for the client), host candidates bound in ``webrtc_udp_ports`` and
announced at ``webrtc_announced_address``, and the screen that decides which remote candidates
ICE may send checks to (a client writes its candidates' addresses itself, so a check is a
packet this service sends wherever an offer says)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from voicehost.config import IceServer, Settings, is_loopback_host

log = logging.getLogger(__name__)


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


def configured_screen() -> tuple[CandidateScreen, Callable[[str], None]]:
    """The screen ``configure_ice`` set, and what it tells each refused candidate's reason."""
    return _screen, _refused


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
