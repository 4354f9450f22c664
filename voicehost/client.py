"""A small client of the speech API: one ``aiohttp`` session reused for every request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from voicehost.evaluation import Sample, Speak


@dataclass(frozen=True, slots=True)
class SpeechResult:
    """What a client saw: bytes written and when the first audio byte arrived."""

    bytes: int
    first_byte_seconds: float
    total_seconds: float


async def download_speech(
    session: aiohttp.ClientSession,
    url: str,
    text: str,
    voice: str,
    out: Path,
    response_format: str = "wav",
    seed: int | None = None,
) -> SpeechResult:
    """POST to ``{url}/v1/audio/speech`` and stream the audio into ``out`` as it arrives."""
    body: dict[str, object] = {"input": text, "voice": voice, "response_format": response_format}
    if seed is not None:
        body["seed"] = seed
    started = time.monotonic()
    first: float | None = None
    written = 0
    async with session.post(f"{url.rstrip('/')}/v1/audio/speech", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await _message(response)}")
        with out.open("wb") as sink:
            async for chunk in response.content.iter_any():
                if first is None:
                    first = time.monotonic() - started
                sink.write(chunk)
                written += len(chunk)
    if response_format == "wav":
        _fix_wav_sizes(out)
    return SpeechResult(written, first or 0.0, time.monotonic() - started)


def http_speaker(session: aiohttp.ClientSession, url: str, seed: int | None = None) -> Speak:
    """A ``Speak`` over ``{url}/v1/audio/speech`` (24 kHz pcm): the evaluation's way to a
    running server. A refused request raises ``RuntimeError`` with the server's message."""

    async def speak(voice: str, sentence: str) -> Sample:
        body: dict[str, object] = {"input": sentence, "voice": voice, "response_format": "pcm"}
        if seed is not None:
            body["seed"] = seed
        started = time.monotonic()
        async with session.post(f"{url.rstrip('/')}/v1/audio/speech", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await _message(response)}")
            pcm = await response.read()
        samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float32) / 32768
        return Sample(voice, sentence, samples, time.monotonic() - started)

    return speak


async def builtin_voices(session: aiohttp.ClientSession, url: str) -> list[str]:
    """The ids of the server's built-in (base model) voices, in its order."""
    async with session.get(f"{url.rstrip('/')}/v1/audio/voices") as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await _message(response)}")
        voices = (await response.json())["voices"]
    return [v["id"] for v in voices if v.get("kind") == "builtin"]


async def _message(response: aiohttp.ClientResponse) -> str:
    try:
        return (await response.json())["error"]["message"]
    except (aiohttp.ContentTypeError, KeyError, TypeError, ValueError):
        return await response.text()


def _fix_wav_sizes(path: Path) -> None:
    """Replace the streaming header's "unknown" sizes with the real ones, for strict players."""
    size = path.stat().st_size
    with path.open("r+b") as wav:
        wav.seek(4)
        wav.write((size - 8).to_bytes(4, "little"))
        wav.seek(40)
        wav.write((size - 44).to_bytes(4, "little"))
