"""What a client's offer and its trickled candidates must hold before a peer connection is made
for them (``read_offer``, ``read_candidates``): anything else is an ``InvalidOffer``, refused
before it costs the service a connection, a port or a stream."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from aiortc import RTCIceCandidate, RTCSessionDescription
from aiortc.sdp import SessionDescription, candidate_from_sdp

from voicehost.errors import ServiceError
from voicehost.webrtc.ice import CandidateScreen

DATA_CHANNEL = "voicehost"  # the label of the data channel an offer opens


class InvalidOffer(ServiceError):
    """An offer or a trickled fragment a session cannot take: not SDP (``invalid_sdp``), no
    audio section that receives Opus (``no_audio``), no data channel (``no_data_channel``)."""

    code = "invalid_sdp"


def read_offer(
    body: str, screen: CandidateScreen, refused: Callable[[str], None]
) -> RTCSessionDescription:
    """The client's offer, checked: SDP, with an audio section that receives Opus and a data
    channel section, each section with its DTLS fingerprint, a setup role aiortc takes and ICE
    credentials, and a candidate ``screen`` lets ICE check if it names any (an offer may name
    none and trickle them). ``InvalidOffer`` otherwise (``invalid_sdp``, ``no_audio``,
    ``no_data_channel``); the candidates of an offer refused for having no usable one are told
    to ``refused``."""
    try:
        parsed = SessionDescription.parse(body)
    except Exception as exc:  # aiortc's parser raises what it meets: ValueError, KeyError ...
        raise InvalidOffer(f"the offer is not SDP: {exc!r}") from exc
    if not body.startswith("v=0") or not parsed.media:
        raise InvalidOffer("the offer is not SDP with media sections")
    audio = [m for m in parsed.media if m.kind == "audio"]
    receiving = [m for m in audio if m.direction in (None, "sendrecv", "recvonly")]
    if not receiving:
        raise InvalidOffer("the offer has no audio section that receives", code="no_audio")
    if not any(c.mimeType.lower() == "audio/opus" for m in receiving for c in m.rtp.codecs):
        raise InvalidOffer("the offer's audio does not take Opus", code="no_audio")
    if not any(m.kind == "application" and (m.sctpmap or m.sctp_port) for m in parsed.media):
        missing = f"the offer has no data channel: open one labelled {DATA_CHANNEL!r}"
        raise InvalidOffer(missing, code="no_data_channel")
    for media in parsed.media:
        if media.dtls is None or not media.dtls.fingerprints:
            raise InvalidOffer(f"the offer's {media.kind} has no DTLS fingerprint")
        if media.dtls.role not in ("auto", "client", "server"):
            raise InvalidOffer(f"the offer's DTLS setup role is {media.dtls.role}")
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            missing = "no ICE credentials (a=ice-ufrag, a=ice-pwd)"
            raise InvalidOffer(f"the offer's {media.kind} has {missing}")
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
        raise InvalidOffer(f"the offer has no usable ICE candidate ({listed})")
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
    ``InvalidOffer`` for a fragment with no line, or with a line no fragment holds."""
    mid, found, lines = None, [], 0
    for line in fragment.splitlines():
        line = line.strip()
        if not line:
            continue
        lines += 1
        if not line.startswith(FRAGMENT_LINES):
            raise InvalidOffer(f"not a trickle-ice-sdpfrag line: {line[:80]!r}")
        if line.startswith("a=mid:"):
            mid = line[len("a=mid:") :]
        elif line.startswith("a=candidate:"):
            found.append((mid, line[len("a=candidate:") :]))
    if not lines:
        raise InvalidOffer("the trickle-ice-sdpfrag is empty")
    return found


def read_candidates(fragment: str) -> list[RTCIceCandidate]:
    """The ICE candidates of a trickle-ice-sdpfrag; ``InvalidOffer`` for a line that is
    not one."""
    candidates = []
    for mid, line in trickled_candidates(fragment):
        try:
            candidate = candidate_from_sdp(line)
        except (AssertionError, ValueError, IndexError) as exc:
            raise InvalidOffer(f"not an ICE candidate: {line[:80]!r}") from exc
        candidate.sdpMid = mid
        candidate.sdpMLineIndex = None if mid is not None else 0
        candidates.append(candidate)
    return candidates
