"""How fast admission control answers: a dev server admitting 2 streams (1 per API key) holds
2 streams in flight while refused requests are timed, each from sending the request to the end
of its answer: 429 for a key over its quota, then 503 from a third key once the server is full.

    python scripts/bench_admission.py [--requests 50]

The last line of output is one JSON object with the refusal times (ms: p50, p95, max).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from voicehost.tools.bench.levels import percentile
from voicehost.tools.devserver import dev_server

KEYS = {name: f"vh_bench_admission_{name}_0123456789" for name in ("a", "b", "c")}
SPEECH = "/v1/audio/speech"
LONG_TEXT = "A long sentence that keeps the engine busy for a good while. " * 3


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


async def timed(http: aiohttp.ClientSession, url: str, key: str) -> tuple[int, float]:
    started = time.perf_counter()
    async with http.post(
        url + SPEECH, json={"input": "Hello there.", "voice": "tara"}, headers=bearer(key)
    ) as response:
        await response.read()
        assert response.status == 200 or "Retry-After" in response.headers
        return response.status, 1000 * (time.perf_counter() - started)


def spread(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values)}


async def bench(url: str, requests: int) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        held = []
        for key in ("a", "b"):
            response = await http.post(
                url + SPEECH, json={"input": LONG_TEXT, "voice": "tara"}, headers=bearer(key)
            )
            assert response.status == 200 and await response.content.readany()
            held.append(response)
        quota = [await timed(http, url, "a") for _ in range(requests)]
        full = [await timed(http, url, "c") for _ in range(requests)]
        for response in held:
            response.close()
    assert {s for s, _ in quota} == {429} and {s for s, _ in full} == {503}, (quota, full)
    return {
        "requests": requests,
        "quota_429_ms": spread([ms for _, ms in quota]),
        "full_503_ms": spread([ms for _, ms in full]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="voicehost-admission-"))
    keys = [
        {
            "id": name,
            "tenant": "bench",
            "scopes": ["synthesize"],
            "sha256": hashlib.sha256(key.encode()).hexdigest(),
        }
        for name, key in KEYS.items()
    ]
    with dev_server(
        root,
        ready_timeout=600,
        VOICEHOST_API_KEYS=json.dumps(keys),
        VOICEHOST_WORKER_CAPACITY="2",
        VOICEHOST_KEY_MAX_STREAMS="1",
    ) as server:
        result = asyncio.run(bench(server.url, args.requests))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
