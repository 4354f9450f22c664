"""The realtime session over real WebRTC on the loopback: aiortc as the client (DTLS, SRTP, SCTP
and ICE of its own), ``voicehost serve --dev`` (the shared server) as the peer that speaks."""

import asyncio
import json
import signal
import sys
import time

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from helpers import metric

from voicehost.audio.opus_track import PACKET_SAMPLES, PACKET_SECONDS
from voicehost.client import ApiError, AsyncClient

WEBRTC = "/v1/audio/speech/webrtc"
SDP = {"Content-Type": "application/sdp"}
SENTENCE = "The evening news begins now."  # one segment
# A frame of decoded audio louder than this (of 32767) is speech: the dev model's audio peaks
# in the thousands; the silence the server sends after a talkspurt decodes to near zero.
SPEECH_LEVEL = 200


async def offer(audio: bool = True, channel: bool = True) -> tuple[RTCPeerConnection, str]:
    """A client peer connection and its offer (every candidate in it)."""
    pc = RTCPeerConnection()
    if channel:
        pc.createDataChannel("voicehost")
    if audio:
        pc.addTransceiver("audio", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


class Heard:
    """What a client heard on the track: each decoded 20 ms frame, when it came and whether it
    was speech."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bool]] = []
        self.task: asyncio.Task | None = None

    def listen(self, track) -> None:
        self.task = asyncio.create_task(self._read(track))

    async def _read(self, track) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            level = int(np.abs(frame.to_ndarray()).max())
            self.frames.append((time.monotonic(), level > SPEECH_LEVEL))

    def speech(self) -> list[float]:
        return [at for at, speech in self.frames if speech]

    def last_speech_index(self) -> int:
        return max(index for index, (_, speech) in enumerate(self.frames) if speech)


async def test_text_on_the_data_channel_is_heard_on_the_track_for_as_long_as_its_segment(server):
    """The config, text and ``end`` on the data channel; the segment's audio on the Opus track,
    as long as ``segment.done`` says within one packet; then ``done`` and the session's end."""
    async with AsyncClient(server.url) as client:
        session = client.webrtc("dev-a", seed=3)
        async with session:
            ready = session.ready
            assert (ready["transport"], ready["response_format"]) == ("webrtc", "opus")
            assert ready["sample_rate"] == 48000
            sent = time.monotonic()
            await session.send_text(SENTENCE)
            await session.end()
            events, audio, first_audio = [], [], None
            async for item in session:
                if isinstance(item, bytes):
                    first_audio = first_audio or time.monotonic() - sent
                    audio.append(np.frombuffer(item, "<i2"))
                else:
                    events.append(item)
    kinds = [event["type"] for event in events]
    assert kinds == ["segment.started", "segment.done", "done"], kinds
    assert (events[0]["text"], events[0]["start"], events[0]["end"]) == (SENTENCE, 0, 28)
    samples = events[1]["samples"]  # at the track's 48 kHz
    assert samples > 20 * PACKET_SAMPLES
    assert all(frame.size == PACKET_SAMPLES for frame in audio)
    # from the first sample of speech to the last: the segment's last packet is padded with
    # silence, and silence follows it (the codec's lookahead delays both ends alike)
    heard = np.flatnonzero(np.abs(np.concatenate(audio)) > SPEECH_LEVEL)
    span = heard[-1] - heard[0] + 1
    print(f"heard {span / PACKET_SAMPLES:.2f} packets of speech of {samples / PACKET_SAMPLES:.2f}")
    assert abs(span - samples) <= PACKET_SAMPLES, (span, samples)
    print(f"time to first audio over WebRTC: {first_audio:.3f} s")


async def test_cancel_silences_the_track_within_a_packet_and_the_jitter_buffer(http, server):
    """With seconds of audio generated but not yet played, ``cancel`` on the data channel: no
    speech is heard after one packet time plus this client's jitter buffer (aiortc holds 4
    packets) and scheduling; without the sender dropping its queue, the rest would play."""
    async with AsyncClient(server.url) as client:
        # segments generated side by side; word timing, so that the cancel says what was heard
        session = client.webrtc("dev-b", continuity=False, timestamps="word")
        async with session:
            heard = Heard()
            # the client's own reader decodes to bytes; listen to the raw frames instead
            assert session._reader is not None
            session._reader.cancel()
            heard.listen(session._pc.getReceivers()[0].track)
            for n in range(6):
                await session.send_text(f"{SENTENCE} Sentence number {n}. ")
                await session.flush()
            generated, started = 0.0, time.monotonic()
            async for item in session:
                if isinstance(item, dict) and item["type"] == "segment.done":
                    generated += item["samples"] / 48000
                played = len(heard.frames) * PACKET_SECONDS
                if heard.speech() and generated - played > 2.0:
                    break  # more than 2 s generated ahead of what was heard
                assert time.monotonic() - started < 120
            ahead = generated - len(heard.frames) * PACKET_SECONDS
            cancelled_at = time.monotonic()
            frames_at_cancel = len(heard.frames)
            await session.cancel()
            async for item in session:
                if isinstance(item, dict) and item["type"] == "cancelled":
                    cancelled = item
                    break
            answered = time.monotonic() - cancelled_at  # the cancel's round trip
            await asyncio.sleep(1.5)
            last_speech = max(heard.speech())
            assert await metric(http, server, "voicehost_engine_unfinished_requests") == 0
    # what it says was heard is what the track had sent: at least the frames this client had
    # when it sent the cancel, and at most those it was delivered up to its last speech (the
    # frames on their way at the cancel: the jitter buffer, the data channel's round trip, and
    # on a loaded machine what this client had not yet read), each give or take the silence
    # after a talkspurt
    played = cancelled["played_seconds"]
    had = frames_at_cancel * PACKET_SECONDS
    delivered = (heard.last_speech_index() + 1) * PACKET_SECONDS
    assert had - 0.4 < played < delivered + 0.4, (played, had, delivered, answered)
    sent = "".join(f"{SENTENCE} Sentence number {n}. " for n in range(6))
    assert cancelled["heard"]["start"] == 0
    assert sent.startswith(cancelled["heard"]["text"]) and cancelled["heard"]["text"]
    silenced = last_speech - cancelled_at
    print(f"{ahead:.2f} s of audio was queued; the last speech came {silenced * 1000:.0f} ms later")
    bound = PACKET_SECONDS + 4 * PACKET_SECONDS + 0.15  # a packet, the jitter buffer, scheduling
    assert silenced < bound < ahead


async def test_an_offer_without_a_data_channel_or_audio_or_sdp_is_refused_with_its_code(
    http, server
):
    url = server.url + WEBRTC
    refusals = []
    for audio, channel in ((True, False), (False, True)):
        pc, sdp = await offer(audio, channel)
        await pc.close()
        async with http.post(url, data=sdp, headers=SDP) as response:
            refusals.append((response.status, (await response.json())["error"]["code"]))
    for body, headers in (
        ("v=0\r\nthis is not SDP", SDP),
        ("", SDP),
        ("\x00\xff" * 50, SDP),
        (json.dumps({"sdp": "v=0"}), {"Content-Type": "application/json"}),
    ):
        async with http.post(url, data=body, headers=headers) as response:
            refusals.append((response.status, (await response.json())["error"]["code"]))
    assert refusals == [
        (400, "no_data_channel"),
        (400, "no_audio"),
        (400, "invalid_sdp"),
        (400, "invalid_sdp"),
        (400, "invalid_sdp"),
        (415, "unsupported_media_type"),
    ]
    errors = await metric(http, server, 'voicehost_errors_total{kind="invalid_sdp"}')
    assert errors >= 3
    assert await metric(http, server, "voicehost_webrtc_sessions") == 0


async def test_delete_ends_a_session_and_frees_its_stream_and_patch_takes_candidates(http, server):
    pc, sdp = await offer()
    try:
        async with http.post(server.url + WEBRTC, data=sdp, headers=SDP) as response:
            assert response.status == 201, await response.text()
            assert response.content_type == "application/sdp"
            answer = await response.text()
            location = response.headers["Location"]
        assert location.startswith(WEBRTC + "/")
        assert "a=candidate:" in answer and "m=application" in answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        assert await metric(http, server, "voicehost_webrtc_sessions") == 1
        # a trickled candidate is taken; a line that is not one, or another type, is not
        mid = next(t.mid for t in pc.getTransceivers())
        fragment = f"a=mid:{mid}\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        trickle = {"Content-Type": "application/trickle-ice-sdpfrag"}
        async with http.patch(server.url + location, data=fragment, headers=trickle) as response:
            assert response.status == 204
        bad = "a=candidate:not a candidate\r\n"
        async with http.patch(server.url + location, data=bad, headers=trickle) as response:
            assert (response.status, (await response.json())["error"]["code"]) == (
                400,
                "invalid_sdp",
            )
        async with http.patch(server.url + location, data=fragment, headers=SDP) as response:
            assert response.status == 415
        async with http.delete(server.url + location) as response:
            assert response.status == 204
        assert await metric(http, server, "voicehost_webrtc_sessions") == 0
        for method in (http.delete, http.patch):
            async with method(server.url + location, data=fragment, headers=trickle) as response:
                body = await response.json()
                assert (response.status, body["error"]["code"]) == (404, "session_not_found")
    finally:
        await pc.close()


VANISHING_CLIENT = """
import asyncio, sys
from voicehost.client import ApiError, AsyncClient

async def main():
    async with AsyncClient(sys.argv[1]) as client:
        async with client.webrtc("dev-c") as session:
            await session.send_text("Speak while I vanish. " * 20)
            await session.flush()
            async for item in session:
                if isinstance(item, bytes):
                    print("playing", flush=True)
                    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_peer_that_vanishes_is_reclaimed_within_the_consent_timeout(http, server):
    """A client killed mid-stream (no DTLS close, no DELETE): the server finds it gone when
    ICE consent checks go unanswered (the shared server's ``webrtc_consent_seconds``, 6) and
    frees its stream and engine request."""
    before = await metric(http, server, "voicehost_webrtc_sessions")
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", VANISHING_CLIENT, server.url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert client.stdout is not None
        assert await asyncio.wait_for(client.stdout.readline(), 120) == b"playing\n"
        assert await metric(http, server, "voicehost_webrtc_sessions") == before + 1
        client.send_signal(signal.SIGKILL)
        killed = time.monotonic()
    finally:
        if client.returncode is None:
            client.kill()
        await client.wait()
    while await metric(http, server, "voicehost_webrtc_sessions") > before:
        assert time.monotonic() - killed < 6 * 1.2 + 3, "the session outlived its consent"
        await asyncio.sleep(0.25)
    reclaimed = time.monotonic() - killed
    assert await metric(http, server, "voicehost_engine_unfinished_requests") == 0
    assert await metric(http, server, 'voicehost_errors_total{kind="webrtc_peer_lost"}') >= 1
    print(f"reclaimed {reclaimed:.1f} s after the client was killed")


async def test_a_peer_that_never_connects_is_closed_after_the_connect_timeout(http, server):
    pc, sdp = await offer()
    await pc.close()  # offered, then gone before any ICE
    async with http.post(server.url + WEBRTC, data=sdp, headers=SDP) as response:
        assert response.status == 201
    started = time.monotonic()
    while await metric(http, server, "voicehost_webrtc_sessions"):
        assert time.monotonic() - started < 5 + 3
        await asyncio.sleep(0.25)
    assert await metric(http, server, 'voicehost_errors_total{kind="webrtc_connect_failed"}') >= 1


@pytest.mark.parametrize(
    ("voice", "code"), [("nobody", "voice_not_found"), ("../etc", "invalid_voice_id")]
)
async def test_a_bad_config_on_the_data_channel_ends_the_session_with_its_error(
    http, server, voice, code
):
    async with AsyncClient(server.url) as client:
        with pytest.raises(ApiError) as refused:
            async with client.webrtc(voice):
                pass
    assert refused.value.code == code
    started = time.monotonic()
    while await metric(http, server, "voicehost_webrtc_sessions"):  # and the session ended
        assert time.monotonic() - started < 2
        await asyncio.sleep(0.1)


# --- a browser's edge, as an attacker would try it ------------------------------------------------


async def test_eighty_offers_that_never_connect_leave_speech_on_every_transport_answered(
    http, server
):
    """80 offers at once from one address (127.0.0.2) whose peer never connects: at most
    ``webrtc_max_pending_per_address`` (4) are answered, the rest refused 429
    ``too_many_pending`` with Retry-After, and none is counted as a stream; meanwhile speech from
    another address is answered at once over HTTP, the socket and WebRTC."""
    pc, sdp = await offer()
    await pc.close()  # its candidates answer no check: every session stays pending
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as attacker:

        async def post() -> tuple[int, str | None, str | None]:
            async with attacker.post(server.url + WEBRTC, data=sdp, headers=SDP) as response:
                code = None if response.status == 201 else (await response.json())["error"]["code"]
                return response.status, code, response.headers.get("Retry-After")

        answers = await asyncio.gather(*(post() for _ in range(80)))
    assert sum(status == 201 for status, _, _ in answers) == 4, answers
    refused = [(status, code) for status, code, _ in answers if status != 201]
    assert set(refused) == {(429, "too_many_pending")} and len(refused) == 76
    assert all(int(retry) >= 1 for status, _, retry in answers if status == 429)
    assert await metric(http, server, "voicehost_active_streams") == 0  # pending: not counted
    started = time.monotonic()
    body = {"input": SENTENCE, "voice": "dev-a", "response_format": "pcm"}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200 and await response.content.readany()
    async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
        await ws.send_json({"type": "config", "voice": "dev-a"})
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "ready"
    async with AsyncClient(server.url) as client, client.webrtc("dev-a") as session:
        assert session.ready["transport"] == "webrtc"
    print(f"HTTP, socket and WebRTC answered in {time.monotonic() - started:.2f} s")
    assert time.monotonic() - started < 30


async def test_an_offer_naming_a_metadata_address_is_answered_and_no_check_goes_there(http, server):
    """An offer whose candidates include 169.254.169.254 (a cloud's metadata address) beside
    the client's own: answered, the link-local one refused and counted, never checked (what a
    refused candidate is sent: test_webrtc_offers); one naming nothing else is 400."""
    refused = 'voicehost_webrtc_candidates_refused_total{reason="link_local"}'
    before = await metric(http, server, refused)
    pc, sdp = await offer()
    try:
        metadata = "a=candidate:9 1 udp 2130706431 169.254.169.254 80 typ host"
        hostile = sdp.replace("a=end-of-candidates", metadata + "\r\na=end-of-candidates")
        async with http.post(server.url + WEBRTC, data=hostile, headers=SDP) as response:
            assert response.status == 201, await response.text()
            location = response.headers["Location"]
        assert await metric(http, server, refused) == before + 1  # one ICE transport: a bundle
        only = "\r\n".join(
            line for line in hostile.split("\r\n") if "typ host" not in line or "169.254" in line
        )
        async with http.post(server.url + WEBRTC, data=only, headers=SDP) as response:
            body = await response.json()
        assert (response.status, body["error"]["code"]) == (400, "invalid_sdp")
        assert "no usable ICE candidate" in body["error"]["message"]
        async with http.delete(server.url + location) as response:
            assert response.status == 204
    finally:
        await pc.close()


async def test_hostile_offers_and_patches_get_their_400_and_leave_no_unretrieved_task(http, server):
    """Offers without a fingerprint or ICE credentials are 400 before any peer connection is
    made, a PATCH of garbage is 400, and nothing of theirs ends in an exception nobody awaited
    ("Task exception was never retrieved" in the server's log)."""
    logged = len(server.log_text())
    pc, sdp = await offer()
    await pc.close()
    codes = []
    for missing in ("a=fingerprint:", "a=ice-ufrag:", "a=ice-pwd:"):
        bad = "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith(missing))
        async with http.post(server.url + WEBRTC, data=bad, headers=SDP) as response:
            codes.append((response.status, (await response.json())["error"]["code"]))
    assert codes == [(400, "invalid_sdp")] * 3
    async with http.post(server.url + WEBRTC, data=sdp, headers=SDP) as response:
        assert response.status == 201
        location = response.headers["Location"]
    trickle = {"Content-Type": "application/trickle-ice-sdpfrag"}
    for garbage in (bytes(range(256)) * 4, b"", b"GET / HTTP/1.1\r\nHost: x\r\n"):
        async with http.patch(server.url + location, data=garbage, headers=trickle) as response:
            assert response.status == 400, await response.text()
            assert (await response.json())["error"]["code"] == "invalid_sdp"
    async with http.delete(server.url + location) as response:
        assert response.status == 204
    await asyncio.sleep(1.0)  # a peer connection's tasks end after its close
    log = server.log_text()[logged:]
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, log[-3000:]


async def test_a_thousand_malformed_requests_write_a_line_or_two_and_are_all_counted(http, server):
    """Duplicate Content-Length, folded headers, a 100 KB header line: each refused 400 by the
    HTTP parser, counted in /metrics, and logged once per client address (not a traceback
    each)."""
    logged = len(server.log_text())
    before = await metric(http, server, "voicehost_malformed_requests_total")
    host, port = server.url.removeprefix("http://").split(":")
    malformed = (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Content-Length: 3\r\n\r\n{}",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
    )

    async def send(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request)
            await writer.drain()
            return await asyncio.wait_for(reader.read(64), 10)
        finally:
            writer.close()

    for _ in range(10):
        answers = await asyncio.gather(*(send(malformed[n % 3]) for n in range(100)))
        assert all(answer.split(b" ")[1:2] == [b"400"] for answer in answers), set(answers)
    counted = await metric(http, server, "voicehost_malformed_requests_total") - before
    log = server.log_text()[logged:]
    lines = [line for line in log.splitlines() if "aiohttp.access" not in line]
    assert counted == 1000
    assert "Traceback" not in log and "Error handling request" not in log, lines[:20]
    assert 1 <= sum("malformed HTTP request from 127.0.0.1" in line for line in lines) <= 2
    async with http.get(server.url + "/healthz") as response:
        assert response.status == 200
