"""Cluster figures: the cost of a routing decision, and the time to first byte the gateway adds
over asking the worker directly.

Routing: a ring of 64 workers (1000 points each), 10k voice ids, random in-flight loads;
``choose_worker`` timed one call at a time (p50/p99 in microseconds).

Gateway overhead: starts its own Redis, one dev worker and one gateway (or uses --worker-url and
--gateway-url), then alternates rounds of N concurrent streams sent straight to the worker and
through the gateway. Each stream is closed at its first audio byte (the engine request is
aborted), so a round measures only time to first byte; levels run at least ``--min-streams``
streams per path. Prints one JSON object as its last line.

    python scripts/bench_cluster.py [--concurrency 1,64] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from voicehost.cluster.ring import WorkerRing, choose_worker
from voicehost.tools.bench.levels import percentile
from voicehost.tools.devserver import (
    dev_env,
    engine_core_env,
    free_port,
    launch,
    launch_redis,
    stop,
    voicehost_command,
    wait_ready,
)

TEXT = "Hello there, how are you today?"


def routing_cost(workers: int = 64, voices: int = 10_000) -> dict[str, float]:
    started = time.perf_counter()
    ring = WorkerRing(f"worker-{i}" for i in range(workers))
    build_ms = (time.perf_counter() - started) * 1000
    rng = random.Random(0)
    loads = {f"worker-{i}": rng.randrange(0, 24) for i in range(workers)}
    timings = []
    for i in range(voices):
        started = time.perf_counter_ns()
        choose_worker(ring, f"voice-{i}", loads, 1.25)
        timings.append((time.perf_counter_ns() - started) / 1000)
    return {
        "workers": workers,
        "voices": voices,
        "ring_build_ms": round(build_ms, 1),
        "p50_us": round(percentile(timings, 50), 1),
        "p99_us": round(percentile(timings, 99), 1),
    }


def start_cluster(folder: Path) -> tuple[str, str, list[subprocess.Popen]]:
    """A Redis of its own, one dev worker and one gateway, each logging under ``folder``;
    the processes are returned gateway first, so that stopping them in order drains cleanly."""
    redis_port, worker_port, gateway_port = free_port(), free_port(), free_port()
    redis = launch_redis(redis_port, folder / "redis.log")
    env = dev_env(
        VOICEHOST_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        VOICEHOST_SHARED_DIR=str(folder / "shared"),
        VOICEHOST_ADAPTER_CACHE_DIR=str(folder / "cache"),
    )
    worker = launch(
        voicehost_command("worker", "--dev", "--port", str(worker_port), "--worker-id", "bench"),
        {**env, **engine_core_env()},
        folder / "worker.log",
    )
    gateway = launch(
        voicehost_command("gateway", "--dev", "--port", str(gateway_port)),
        env,
        folder / "gateway.log",
    )
    processes = [gateway, worker, redis]
    worker_url, gateway_url = f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{gateway_port}"
    try:
        wait_ready(worker, worker_url, folder / "worker.log", 600)
        wait_ready(gateway, gateway_url, folder / "gateway.log", 30)
    except BaseException:
        for process in processes:
            stop(process)
        raise
    return worker_url, gateway_url, processes


async def first_byte_ms(session: aiohttp.ClientSession, url: str, voice: str, seed: int) -> float:
    body = {"input": TEXT, "voice": voice, "response_format": "pcm", "seed": seed}
    started = time.perf_counter()
    async with session.post(f"{url}/v1/audio/speech", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
        await response.content.readany()
        elapsed = (time.perf_counter() - started) * 1000
        response.close()  # stop here: the server aborts the engine request
    return elapsed


async def overhead(
    worker_url: str,
    gateway_url: str,
    levels: list[int],
    rounds: int,
    voice: str,
    min_streams: int,
) -> list[dict[str, object]]:
    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await first_byte_ms(session, gateway_url, voice, 0)  # warm both paths
        await first_byte_ms(session, worker_url, voice, 0)
        for n in levels:
            samples: dict[str, list[float]] = {"direct": [], "gateway": []}
            for round_index in range(max(rounds, -(-min_streams // n))):
                order = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
                for path in order:
                    url = worker_url if path == "direct" else gateway_url
                    samples[path] += await asyncio.gather(
                        *(first_byte_ms(session, url, voice, i) for i in range(n))
                    )
                    await asyncio.sleep(0.5)
            row: dict[str, object] = {"concurrency": n, "streams_per_path": len(samples["direct"])}
            for path, values in samples.items():
                row[f"{path}_p50_ms"] = round(statistics.median(values), 1)
                row[f"{path}_p95_ms"] = round(percentile(values, 95), 1)
            row["added_p50_ms"] = round(row["gateway_p50_ms"] - row["direct_p50_ms"], 1)  # type: ignore[operator]
            row["added_p95_ms"] = round(row["gateway_p95_ms"] - row["direct_p95_ms"], 1)  # type: ignore[operator]
            print(json.dumps(row), flush=True)
            results.append(row)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-streams", type=int, default=30, help="per path and level")
    parser.add_argument("--voice", default="tara")
    parser.add_argument("--worker-url")
    parser.add_argument("--gateway-url")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    routing = routing_cost()
    print(json.dumps({"routing": routing}), flush=True)
    levels = [int(n) for n in args.concurrency.split(",")]
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.worker_url and args.gateway_url:
                worker_url, gateway_url = args.worker_url, args.gateway_url
            else:
                worker_url, gateway_url, processes = start_cluster(Path(tmp))
            rows = asyncio.run(
                overhead(worker_url, gateway_url, levels, args.rounds, args.voice, args.min_streams)
            )
        finally:
            for process in processes:
                stop(process, grace=60)
    summary = {"routing": routing, "gateway_first_byte": rows}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
