"""``/v1/audio/speech`` beyond one sentence of WAV: every format, long-form input, text
normalisation, continuity between segments and the leading-silence trim, on the real server."""

import asyncio
import io
import random
import time

import aiohttp
import av
import numpy as np
import pytest
from helpers import metric

from voicehost.speech.synthesis import LeadingSilenceTrim

SPEECH = "/v1/audio/speech"
SENTENCE_WORDS = "we walked along the river and talked about the weather for a while".split()


async def post(http, server, **body):
    async with http.post(server.url + SPEECH, json={"voice": "dev-a", **body}) as response:
        assert response.status == 200, await response.text()
        return response.headers["Content-Type"], await response.read()


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def same_audio(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to the float rounding of different decode windows (noise is off)."""
    return a.size == b.size and np.abs(a - b).max() <= 64


def decoded(data: bytes, fmt: str) -> tuple[int, float]:
    """(sample rate, seconds) of ``data`` as PyAV decodes it."""
    raw = {"pcm": "s16le", "mulaw": "mulaw", "alaw": "mulaw"}
    options = {"sample_rate": "24000", "channels": "1"} if fmt == "pcm" else {}
    if fmt in ("mulaw", "alaw"):
        raw["alaw"] = "alaw"
        options = {"sample_rate": "8000", "channels": "1"}
    with av.open(io.BytesIO(data), format=raw.get(fmt), options=options) as container:
        frames = list(container.decode(audio=0))
    rates = {frame.sample_rate for frame in frames}
    assert len(rates) == 1
    rate = rates.pop()
    return rate, sum(frame.samples for frame in frames) / rate


FORMATS = [  # format, sample_rate asked, content type, rate decoded, duration slack
    ("wav", 16000, "audio/wav", 16000, 0.001),
    ("mp3", None, "audio/mpeg", 24000, 0.2),  # mp3 and aac decoders add codec priming
    ("opus", None, "audio/ogg; codecs=opus", 48000, 0.001),
    ("flac", 44100, "audio/flac", 44100, 0.001),
    ("aac", 48000, "audio/aac", 48000, 0.2),
    ("mulaw", None, "audio/basic", 8000, 0.001),
    ("alaw", 8000, "audio/x-alaw-basic", 8000, 0.001),
]


async def test_every_format_decodes_to_the_duration_of_the_pcm_at_its_rate(http, server):
    said = {"input": "Hi.", "seed": 9}

    async def ask(fmt, rate):
        return await post(http, server, **said, response_format=fmt, sample_rate=rate)

    (_, reference), *answers = await asyncio.gather(
        ask("pcm", None), *(ask(fmt, rate) for fmt, rate, *_ in FORMATS)
    )
    seconds = len(reference) / 2 / 24000
    for (fmt, _, content_type, decoded_rate, slack_s), (kind, data) in zip(
        FORMATS, answers, strict=True
    ):
        assert kind == content_type
        got_rate, got_seconds = decoded(data, fmt)
        assert got_rate == decoded_rate, fmt
        assert seconds - 0.001 <= got_seconds <= seconds + slack_s, fmt


async def test_a_ten_thousand_character_input_streams_to_completion(http, server):
    """Without continuity, segments are generated 8 at a time (VOICEHOST_SEGMENT_PREFETCH)."""
    rng = random.Random(8)
    sentences = []
    while sum(len(s) + 1 for s in sentences) < 10_000:
        words = [rng.choice(SENTENCE_WORDS) for _ in range(rng.randint(6, 18))]
        sentences.append(" ".join(words).capitalize() + ".")
    text = " ".join(sentences)[:10_000]
    assert len(text) == 10_000
    segments_before = await metric(http, server, "voicehost_segments_total")
    body = {"voice": "dev-b", "input": text, "response_format": "pcm", "continuity": False}
    in_flight, looked = [], 0.0
    async with http.post(server.url + SPEECH, json=body) as response:
        assert response.status == 200
        audio = 0
        async for chunk in response.content.iter_any():
            audio += len(chunk)
            if time.monotonic() - looked >= 0.1:  # /metrics at most ten times a second
                looked = time.monotonic()
                in_flight.append(await metric(http, server, "voicehost_engine_unfinished_requests"))
    spoken = await metric(http, server, "voicehost_segments_total") - segments_before
    assert spoken >= 10_000 / 900  # every segment of at most 900 characters was spoken
    assert audio % 4096 == 0 and audio >= spoken * 4096  # whole frames, some from each
    assert 2 <= max(in_flight) <= 8
    assert await metric(http, server, "voicehost_engine_unfinished_requests") == 0


async def test_numbers_are_spoken_as_words_unless_normalisation_is_off(http, server):
    said = {"input": "$5.", "seed": 4, "response_format": "pcm"}
    spelt = {**said, "input": "five dollars."}
    (_, normalised), (_, words), (_, raw) = await asyncio.gather(
        post(http, server, **said),
        post(http, server, **spelt),
        post(http, server, **said, normalize=False),
    )
    assert same_audio(pcm(normalised), pcm(words))
    assert not same_audio(pcm(raw), pcm(words))


@pytest.mark.unit
def test_the_leading_silence_trim_drops_quiet_audio_up_to_the_first_sound_and_no_further():
    rng = np.random.default_rng(0)
    quiet = rng.normal(0, 10 ** (-70 / 20), 24000 // 2).astype(np.float32)
    tone = (0.3 * np.sin(np.arange(24000) * 2 * np.pi * 220 / 24000)).astype(np.float32)
    audio = np.concatenate([quiet, tone, quiet])
    trim = LeadingSilenceTrim(-45.0)
    kept = np.concatenate([trim(audio[i : i + 2048]) for i in range(0, audio.size, 2048)])
    assert trim.done and 12000 - 480 <= trim.dropped <= 12000  # 10-20 ms of run-up
    assert np.array_equal(kept, audio[trim.dropped :])
    silence = LeadingSilenceTrim(-45.0)
    long_quiet = np.concatenate([quiet, quiet, quiet, tone])
    kept = np.concatenate([silence(long_quiet[i : i + 2048]) for i in range(0, 60000, 2048)])
    assert silence.dropped == 24000  # never beyond the first second
    assert kept.size == 60000 - 24000


async def test_trimming_drops_only_the_start_and_is_counted(http, server):
    body = {"input": "Quiet.", "seed": 31, "response_format": "pcm"}
    before = await metric(http, server, "voicehost_trimmed_leading_seconds_total")
    (_, whole), (_, trimmed) = await asyncio.gather(
        post(http, server, **body), post(http, server, **body, trim_silence=True)
    )
    dropped = await metric(http, server, "voicehost_trimmed_leading_seconds_total") - before
    w, t = pcm(whole), pcm(trimmed)
    assert t.size and same_audio(w[w.size - t.size :], t)
    assert dropped == pytest.approx((len(whole) - len(trimmed)) / 2 / 24000, abs=1e-6)


async def test_speed_stretches_the_socket_as_it_does_http(http, server):
    """The same seeded speech at speed 2 over the realtime socket lasts half as long as at
    speed 1 over HTTP, and ``segment.done`` counts what was sent."""
    said = {"seed": 5, "response_format": "pcm"}
    _, reference = await post(http, server, input="Hi.", voice="tara", **said)
    audio, events = bytearray(), []
    async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
        await ws.send_json({"type": "config", "voice": "tara", "speed": 2.0, **said})
        await ws.send_json({"type": "text", "text": "Hi."})
        await ws.send_json({"type": "end"})
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                audio += message.data
            else:
                events.append(message.json())
    assert events[0]["type"] == "ready" and events[0]["speed"] == 2.0
    assert len(audio) / len(reference) == pytest.approx(0.5, rel=0.03)
    (done,) = [e for e in events if e["type"] == "segment.done"]
    assert done["samples"] == pytest.approx(len(audio) / 2, rel=0.03)
