"""The official OpenAI Python SDK, unchanged, pointed at the dev server (``base_url``): what its
users do (no format, an OpenAI voice, ``speed``, listing models) and exactly the calls that
Pipecat's OpenAI TTS plugin makes, and LiveKit Agents' plugin itself (docs/API.md, "OpenAI clients
and voice-agent frameworks")."""

from __future__ import annotations

import io

import aiohttp
import av
import numpy as np
import openai
import pytest

from voicehost.model.orpheus import SAMPLE_RATE, SAMPLES_PER_FRAME

TEXT = "Hi."  # the dev model speaks at most 1.4 s of it (seed 5: 1.45 s), enough to measure
SEED = {"seed": 5}  # voicehost's own field, sent as the SDK sends any extra field
# What an unseeded request is sure to hear: the dev model's stop token follows a whole frame,
# and ends the first one a few percent of the time (CI once got exactly 2048 samples), so more
# than one frame would be a coin that lands wrong once in a few dozen runs.
ONE_FRAME = SAMPLES_PER_FRAME


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def same_audio(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to the float rounding of different decode windows (noise is off)."""
    return a.size == b.size and np.abs(a - b).max() <= 64


def decoded_mp3(data: bytes) -> tuple[int, int]:
    """(sample rate, samples) of an MP3 file, decoded by FFmpeg (PyAV) as a player would."""
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "mp3"
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return stream.codec_context.sample_rate, samples


@pytest.fixture(scope="module")
async def sdk(server):
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


@pytest.fixture(scope="module")
async def tara_pcm(sdk) -> np.ndarray:
    """``TEXT`` by tara, seeded, at speed 1: what the speed is compared with."""
    speech = await sdk.audio.speech.create(
        model="tts-1", voice="tara", input=TEXT, response_format="pcm", extra_body=SEED
    )
    return pcm(speech.content)


async def test_the_sdk_without_a_format_saves_a_playable_mp3(sdk, tmp_path):
    speech = await sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    assert speech.response.headers["content-type"] == "audio/mpeg"
    speech.write_to_file(tmp_path / "speech.mp3")
    rate, samples = decoded_mp3((tmp_path / "speech.mp3").read_bytes())
    assert rate == SAMPLE_RATE and samples >= ONE_FRAME, (rate, samples)


async def test_an_openai_voice_names_the_voice_its_alias_maps_to(server):
    """(It speaks: the SDK tests above and below use alloy and ash.) The voice list shows the
    aliases under their voices, and a socket configured with one is ready with that voice."""
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/v1/audio/voices") as r:
            voices = {v["id"]: v for v in (await r.json())["voices"]}
        async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
            await ws.send_json({"type": "config", "voice": "alloy"})
            ready = await ws.receive_json()
    assert "alloy" in voices["tara"]["aliases"] and "nova" in voices["leah"]["aliases"]
    assert "alloy" not in voices  # an alias is no voice of its own
    assert (ready["type"], ready["voice"]) == ("ready", "tara")


async def test_speed_through_the_sdk_plays_the_same_speech_faster(sdk, tara_pcm):
    speech = await sdk.audio.speech.create(
        model="tts-1", voice="tara", input=TEXT, response_format="pcm", speed=2.0, extra_body=SEED
    )
    ratio = pcm(speech.content).size / tara_pcm.size
    assert ratio == pytest.approx(0.5, rel=0.03)


async def test_the_sdk_lists_and_retrieves_the_models_it_may_send(sdk):
    names = [model.id async for model in sdk.models.list()]
    assert {"orpheus", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(names)
    assert (await sdk.models.retrieve("gpt-4o-mini-tts")).owned_by == "voicehost"
    with pytest.raises(openai.NotFoundError):
        await sdk.models.retrieve("no-such-model")


async def test_pipecats_call_streams_24_khz_pcm(sdk):
    """``pipecat.services.openai.tts.OpenAITTSService.run_tts`` (pipecat-ai 1.14): an OpenAI
    voice (it refuses any other name), ``pcm``, read in its chunk size; ``instructions`` sent
    when set."""
    chunks = []
    async with sdk.audio.speech.with_streaming_response.create(
        input=TEXT,
        model="gpt-4o-mini-tts",
        voice="alloy",
        response_format="pcm",
        instructions="Speak warmly.",
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        async for chunk in r.iter_bytes(4800):
            chunks.append(chunk)
    audio = b"".join(chunks)
    assert len(audio) % 2 == 0 and len(audio) // 2 >= ONE_FRAME


async def test_livekits_openai_plugin_speaks_through_voicehost(server):
    """The plugin itself (livekit-plugins-openai 1.8), as an agent configures it: ``base_url``,
    an OpenAI voice, its defaults otherwise. Its ``ChunkedStream`` sends mp3, ``speed=1.0`` and,
    for its default model gpt-4o-mini-tts, ``stream_format="sse"``, reads the events' ``audio``
    when the answer is text/event-stream, and decodes the mp3 to 24 kHz frames."""
    from livekit.plugins import openai as livekit_openai

    tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key="unused", voice="ash")
    try:
        frames = [event.frame async for event in tts.synthesize(TEXT)]
    finally:
        await tts.aclose()
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(24000, 1)}
    assert sum(f.samples_per_channel for f in frames) >= ONE_FRAME
