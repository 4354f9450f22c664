"""Realtime input streaming over a real WebSocket to ``voicehost serve --dev``."""

import asyncio
import json
import random
import time

import aiohttp
import pytest
from helpers import metric, same_audio

WS = "/v1/audio/speech/ws"
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven bright stars shine above "
    "our quiet little town and every neighbour listens to the evening news"
).split()


def paragraph(words: int, seed: int) -> str:
    """``words`` words in sentences of 30 to 45 words (few segments: the dev model says about
    90 frames whatever the text), each with a clause."""
    rng = random.Random(seed)
    sentences, left = [], words
    while left:
        n = min(left, rng.randint(30, 45))
        chosen = [rng.choice(WORDS) for _ in range(n)]
        if n > 6:
            chosen[rng.randint(2, n - 3)] += ","
        sentences.append(" ".join(chosen).capitalize() + rng.choice([".", ".", "!", "?"]))
        left -= n
    return " ".join(sentences)


def pieces(text: str, seed: int) -> list[str]:
    """``text`` cut at random places into pieces of 1 to 12 characters."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 12)
        out.append(text[i : i + n])
        i += n
    return out


async def receive_all(ws, until: str | None = None, wait_s: float = 300):
    """Messages in order as (kind, payload): ("event", dict) or ("audio", bytes), until the
    event of type ``until`` (inclusive) or the close."""
    received = []
    while True:
        message = await ws.receive(timeout=wait_s)
        if message.type == aiohttp.WSMsgType.TEXT:
            event = json.loads(message.data)
            received.append(("event", event))
            if event["type"] == until:
                return received
        elif message.type == aiohttp.WSMsgType.BINARY:
            received.append(("audio", message.data))
        else:
            return received


async def test_text_in_random_pieces_comes_back_as_audio_in_order_covering_the_input_once(
    http, server
):
    text = paragraph(200, seed=3)
    assert len(text.split()) == 200
    async with http.ws_connect(server.url + WS) as ws:
        # without continuity, 8 segments are generated at once (VOICEHOST_SEGMENT_PREFETCH)
        config = {"voice": "dev-a", "response_format": "pcm", "continuity": False}
        await ws.send_json({"type": "config", **config})
        ready = json.loads((await ws.receive(timeout=30)).data)
        assert ready["type"] == "ready" and ready["sample_rate"] == 24000
        for piece in pieces(text, seed=4):
            await ws.send_json({"type": "text", "text": piece})
        await ws.send_json({"type": "end"})
        received = await receive_all(ws)
        assert ws.closed and ws.close_code == 1000

    events = [payload for kind, payload in received if kind == "event"]
    assert events[-1] == {"type": "done"}
    started = [e for e in events if e["type"] == "segment.started"]
    done = [e for e in events if e["type"] == "segment.done"]
    assert (
        [e["segment"] for e in started] == [e["segment"] for e in done] == list(range(len(started)))
    )
    # every segment's span is its text; together they cover each character of the input once
    covered = [0] * len(text)
    for event in started:
        assert text[event["start"] : event["end"]] == event["text"]
        for i in range(event["start"], event["end"]):
            covered[i] += 1
    assert all(n == 1 for n, ch in zip(covered, text, strict=True) if not ch.isspace())
    assert len(started[0]["text"].split()) < 15  # the first segment starts early
    # audio comes inside its segment, in order, and adds up to what each segment reports
    segment, audio_bytes = None, {}
    for kind, payload in received:
        if kind == "audio":
            assert segment is not None
            audio_bytes[segment] = audio_bytes.get(segment, 0) + len(payload)
        elif payload["type"] == "segment.started":
            segment = payload["segment"]
        elif payload["type"] == "segment.done":
            assert payload["segment"] == segment
            assert audio_bytes[segment] == payload["samples"] * 2
            assert audio_bytes[segment] % 4096 == 0  # whole frames of s16le
            segment = None


async def test_cancel_stops_the_audio_and_frees_the_engine_within_a_second(http, server):
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "dev-b", "response_format": "pcm"})
        await receive_all(ws, until="ready")
        await ws.send_json({"type": "text", "text": paragraph(120, seed=5)})
        await ws.send_json({"type": "flush"})
        while (await ws.receive(timeout=120)).type != aiohttp.WSMsgType.BINARY:
            pass  # until audio is playing
        assert await metric(http, server, "voicehost_engine_unfinished_requests") >= 1
        cancelled_at = time.monotonic()
        await ws.send_json({"type": "cancel"})
        await receive_all(ws, until="cancelled", wait_s=5)
        assert time.monotonic() - cancelled_at < 1.0
        while await metric(http, server, "voicehost_engine_unfinished_requests"):
            assert time.monotonic() - cancelled_at < 1.0
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):  # nothing more: no audio, no events
            message = await ws.receive(timeout=1.5)
            pytest.fail(f"after the cancel acknowledgement: {message}")
        # the socket goes on: new text after a barge-in is spoken, with spans counted on
        await ws.send_json({"type": "text", "text": "Right, what next?"})
        await ws.send_json({"type": "end"})
        received = await receive_all(ws)
    events = [payload for kind, payload in received if kind == "event"]
    assert events[0]["type"] == "segment.started" and events[0]["text"] == "Right, what next?"
    assert events[-1] == {"type": "done"}
    assert any(kind == "audio" for kind, _ in received)


async def test_an_idle_socket_is_closed(http, server):
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "dev-a"})
        await receive_all(ws, until="ready")
        started = time.monotonic()
        received = await receive_all(ws, wait_s=30)
        assert ws.closed
    assert received[-1][1]["error"]["code"] == "idle_timeout"
    assert 2.5 < time.monotonic() - started < 10  # VOICEHOST_WS_IDLE_TIMEOUT_SECONDS=3


async def test_a_flushed_segment_is_spoken_to_its_end_however_long_the_client_waits(http, server):
    """A client that flushes and then only listens is not idle while its speech is generated
    (three segments, each hearing the one before, take the dev engine longer than the test
    server's 3 s idle timeout to say); the idle timer starts once the socket has nothing more
    to say."""
    text = (
        "Please read this sentence to me now. Then read this second one to me. "
        "And then a third one, slowly."
    )
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "dev-a", "seed": 3, "continuity": True})
        await receive_all(ws, until="ready")
        await ws.send_json({"type": "text", "text": text})
        await ws.send_json({"type": "flush"})
        started = time.monotonic()
        received = []
        for _ in range(3):
            received += await receive_all(ws, until="segment.done", wait_s=120)
        spoken = time.monotonic() - started
        events = [payload for kind, payload in received if kind == "event"]
        done = [e for e in events if e["type"] == "segment.done"]
        assert len(done) == 3 and events[-1]["type"] == "segment.done", events
        audio = sum(len(payload) for kind, payload in received if kind == "audio")
        assert audio == 2 * sum(e["samples"] for e in done) > 0
        # longer than the idle timeout, so the socket stayed open for the generation itself
        assert spoken > 3, f"the speech took {spoken:.1f} s: too short to show it"
        done = time.monotonic()
        rest = await receive_all(ws, wait_s=30)
        assert rest[-1][1]["error"]["code"] == "idle_timeout"
        assert 2.5 < time.monotonic() - done < 10


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"type": "text", "text": "hi"}, "invalid_message"),
        ({"type": "config"}, "invalid_message"),
        ({"type": "config", "voice": "nobody"}, "voice_not_found"),
        ({"type": "config", "voice": "../etc"}, "invalid_voice_id"),
        ({"type": "config", "voice": "dev-a", "response_format": "xyz"}, "unsupported_format"),
        ({"type": "config", "voice": "dev-a", "sample_rate": 12345}, "unsupported_format"),
    ],
)
async def test_a_bad_config_gets_an_error_event_and_a_close(http, server, config, code):
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json(config)
        received = await receive_all(ws, wait_s=10)
        assert ws.closed and ws.close_code == 1008
    assert received == [("event", {"type": "error", "error": received[0][1]["error"]})]
    assert received[0][1]["error"]["code"] == code


async def test_a_bad_message_mid_stream_gets_an_error_and_the_socket_goes_on(http, server):
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "dev-c", "response_format": "wav"})
        await receive_all(ws, until="ready")
        await ws.send_str("{nope")
        await ws.send_json({"type": "shout"})
        await ws.send_bytes(b"\x00\x01")
        await ws.send_json({"type": "text", "text": "Fine then."})
        await ws.send_json({"type": "end"})
        received = await receive_all(ws)
    errors = [p["error"]["code"] for k, p in received if k == "event" and p["type"] == "error"]
    assert errors == ["invalid_message"] * 3
    audio = b"".join(p for k, p in received if k == "audio")
    assert audio[:4] == b"RIFF" and len(audio) > 44
    assert received[-1] == ("event", {"type": "done"})


async def spoken(http, server, text: str, **config) -> list[tuple[str, object]]:
    async with http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "dev-a", "seed": 12, **config})
        await ws.send_json({"type": "text", "text": text})
        await ws.send_json({"type": "end"})
        return await receive_all(ws)


def segment_audio(received) -> list[bytes]:
    """The audio of each segment, in order."""
    out = []
    for kind, payload in received:
        if kind == "event" and payload["type"] == "segment.started":
            out.append(b"")
        elif kind == "audio":
            out[-1] += payload
    return out


async def test_the_next_segment_hears_the_one_before_only_with_continuity(http, server):
    text = "Hi there. Bye now."
    carried, alone, again = [
        segment_audio(r)
        for r in await asyncio.gather(
            spoken(http, server, text, continuity=True),
            spoken(http, server, text, continuity=False),
            spoken(http, server, text, continuity=True),
        )
    ]
    assert len(carried) == len(alone) == len(again) == 2
    assert same_audio(carried[0], alone[0])  # the first segment is the same request either way
    assert not same_audio(carried[1], alone[1])  # the second one's prompt carries the first
    assert same_audio(again[1], carried[1])  # and that is deterministic


async def test_a_socket_takes_no_more_text_in_all_than_an_http_request(server):
    """The socket's total is capped at VOICEHOST_MAX_INPUT_CHARS (100000), as one request is:
    the piece that would pass it is refused, and the socket goes on."""
    async with aiohttp.ClientSession() as http, http.ws_connect(server.url + WS) as ws:
        await ws.send_json({"type": "config", "voice": "tara", "response_format": "pcm"})
        await ws.send_json({"type": "text", "text": "x" * 60000})
        await ws.send_json({"type": "text", "text": "y" * 40001})  # 100001 in all
        error = None
        while error is None:
            message = await ws.receive(timeout=60)
            if message.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(message.data)
                if event["type"] == "error":
                    error = event["error"]
        assert error["code"] == "input_too_long" and "100000" in error["message"]
        await ws.send_json({"type": "cancel"})  # barge in on the first piece: cheap to end
        kinds = []
        while "cancelled" not in kinds:
            message = await ws.receive(timeout=60)
            if message.type == aiohttp.WSMsgType.TEXT:
                kinds.append(json.loads(message.data)["type"])


async def test_word_timing_points_into_the_text_sent_and_comes_with_the_audio_that_ends_it(
    http, server
):
    """``timestamps: word``: a ``word`` event per word of the text sent, its span in that text
    (``$42.50,`` one word however it is said), and never before the audio it ends in."""
    text = "It costs $42.50, Dr. Smith said. Then he paid the bill and left the shop."
    async with http.ws_connect(server.url + WS) as ws:
        config = {"voice": "dev-a", "response_format": "pcm", "timestamps": "word", "speed": 1.25}
        await ws.send_json({"type": "config", **config})
        ready = json.loads((await ws.receive(timeout=30)).data)
        assert ready["aligner"] == "estimated"
        for piece in pieces(text, seed=6):
            await ws.send_json({"type": "text", "text": piece})
        await ws.send_json({"type": "end"})
        received = await receive_all(ws)
    heard_samples = 0
    words = []
    for kind, payload in received:
        if kind == "audio":
            heard_samples += len(payload) // 2
        elif payload["type"] == "word":
            # its audio has all been sent (at the stream's clock, after speed), give or take
            # the rounding of its times to the millisecond
            assert payload["audio_end"] * 24000 <= heard_samples + 24, (payload, heard_samples)
            words.append(payload)
    assert [text[w["start"] : w["end"]] for w in words] == text.split()
    assert [w["text"] for w in words] == text.split()
    starts = [w["audio_start"] for w in words]
    assert starts == sorted(starts) and all(w["audio_end"] >= w["audio_start"] for w in words)
    total = sum(p["samples"] for k, p in received if k == "event" and p["type"] == "segment.done")
    assert words[-1]["audio_end"] * 24000 <= total + 24  # within the audio, after speed


async def test_a_cancel_with_word_timing_says_which_words_were_heard(http, server):
    """``cancelled`` carries the text up to the last word whose audio the listener had played
    by the server's clock (a socket's client plays from its first audio, in real time): a
    prefix of the words sent, as a span of the text. The text has ended (``end``) before the
    barge-in, as an agent's whole reply has while its last words play: ``cancel`` is still
    taken, and ``done`` follows ``cancelled``."""
    text = paragraph(80, seed=11)
    async with http.ws_connect(server.url + WS) as ws:
        config = {"voice": "dev-b", "response_format": "pcm", "timestamps": "word"}
        await ws.send_json({"type": "config", **config})
        await receive_all(ws, until="ready")
        await ws.send_json({"type": "text", "text": text})
        await ws.send_json({"type": "end"})
        words, started = [], time.monotonic()
        while len(words) < 4:
            message = await ws.receive(timeout=120)
            if (
                message.type == aiohttp.WSMsgType.TEXT
                and json.loads(message.data)["type"] == "word"
            ):
                words.append(json.loads(message.data))
            assert time.monotonic() - started < 120
        await asyncio.sleep(0.5)
        await ws.send_json({"type": "cancel"})
        received = await receive_all(ws, until="cancelled", wait_s=10)
        words += [p for k, p in received if k == "event" and p["type"] == "word"]
        cancelled = received[-1][1]
        after = await receive_all(ws, wait_s=10)  # to the close
    assert [p["type"] for k, p in after if k == "event"] == ["done"], after
    assert not [k for k, _ in after if k == "audio"]  # nothing of what was cancelled
    heard = cancelled["heard"]
    assert heard["start"] == 0 and text[heard["start"] : heard["end"]] == heard["text"]
    played = cancelled["played_seconds"]
    heard_words = [w for w in words if w["end"] <= heard["end"]]
    assert all(w["audio_end"] <= played + 1e-3 for w in heard_words)
    later = [w for w in words if w["end"] > heard["end"]]
    assert all(w["audio_end"] > played for w in later)
    assert heard["text"] == " ".join(w["text"] for w in heard_words)
