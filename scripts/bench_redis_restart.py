"""Answers through a gateway while Redis is killed and restarted empty, under a steady load.

Starts its own Redis, ``--workers`` dev workers (one by default: what the gateway and the worker
do is then apart from two busy CPU engines' contention) and ``--gateways`` gateways, runs
``--clients`` clients that each speak a short sentence back to back through the gateways in
turn, and at ``--kill-at`` seconds kills Redis (SIGKILL) and starts an empty one on the same
port. Meanwhile it samples the first gateway's ``/v1/cluster`` (the workers on its ring and
their load figures, as the heartbeats report them) and ``/healthz``. Prints, per ``--window``
seconds, the answers' statuses and their time to first byte and to the end (p50/p95), when the
ring had its workers back with their load figures, and one JSON object as the last line.

    python scripts/bench_redis_restart.py [--clients 2] [--seconds 80] [--kill-at 20]
        [--workers 1] [--gateways 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

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


async def speak(session: aiohttp.ClientSession, url: str, started: float) -> dict[str, float]:
    sent = time.monotonic()
    body = {"input": TEXT, "voice": "tara", "response_format": "pcm"}
    first = None
    try:
        async with session.post(f"{url}/v1/audio/speech", json=body) as response:
            status = response.status
            async for _ in response.content.iter_any():
                first = first or time.monotonic()
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    done = time.monotonic()
    return {
        "t": sent - started,
        "status": status,
        "ttfb": (first or done) - sent,
        "total": done - sent,
    }


async def load(
    urls: list[str], clients: int, seconds: float, started: float
) -> list[dict[str, float]]:
    answers: list[dict[str, float]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client(index: int) -> None:
            turn = index
            while time.monotonic() - started < seconds:
                answers.append(await speak(session, urls[turn % len(urls)], started))
                turn += 1

        await asyncio.gather(*(client(i) for i in range(clients)))
    return answers


async def watch(url: str, seconds: float, started: float) -> list[dict[str, object]]:
    """The gateway's ring and health every 0.25 s."""
    samples: list[dict[str, object]] = []
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() - started < seconds:
            sample: dict[str, object] = {"t": round(time.monotonic() - started, 2)}
            try:
                async with session.get(url + "/v1/cluster") as r:
                    workers = (await r.json())["workers"]
                sample["workers"] = {w["id"]: (w["capacity"], w["headroom"]) for w in workers}
                async with session.get(url + "/healthz") as r:
                    health = await r.json()
                sample["redis"], sample["registry"] = health.get("redis"), health.get("registry")
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                sample["error"] = type(exc).__name__
            samples.append(sample)
            await asyncio.sleep(0.25)
    return samples


async def restart_redis(
    redis: list[subprocess.Popen[bytes]], port: int, folder: Path, at: float, started: float
) -> float:
    await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
    redis[0].kill()
    redis[0].wait()
    killed = time.monotonic() - started
    redis[0] = launch_redis(port, folder / "redis-2.log")
    return killed


def windows(answers: list[dict[str, float]], width: float) -> list[dict[str, object]]:
    rows = []
    end = max(a["t"] for a in answers)
    start = 0.0
    while start <= end:
        chunk = [a for a in answers if start <= a["t"] < start + width]
        ok = [a for a in chunk if a["status"] == 200]
        row: dict[str, object] = {
            "from_s": start,
            "answers": len(chunk),
            "statuses": dict(Counter(int(a["status"]) for a in chunk)),
        }
        if ok:
            row["ttfb_p50_ms"] = round(statistics.median(a["ttfb"] for a in ok) * 1000)
            row["ttfb_p95_ms"] = round(percentile([a["ttfb"] for a in ok], 95) * 1000)
            row["total_p50_ms"] = round(statistics.median(a["total"] for a in ok) * 1000)
        rows.append(row)
        start += width
    return rows


async def run(args: argparse.Namespace, folder: Path) -> dict[str, object]:
    redis_port = free_port()
    redis = [launch_redis(redis_port, folder / "redis.log")]
    env = dev_env(
        VOICEHOST_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        VOICEHOST_SHARED_DIR=str(folder / "shared"),
        VOICEHOST_ADAPTER_CACHE_DIR=str(folder / "cache"),
    )
    workers, gateways = {}, {}
    for index in range(args.workers):
        port, name = free_port(), f"w{index + 1}"
        command = voicehost_command("worker", "--dev", "--port", str(port), "--worker-id", name)
        log = folder / f"{name}.log"
        workers[name] = (launch(command, {**env, **engine_core_env()}, log), port, log)
    for index in range(args.gateways):
        port, name = free_port(), f"g{index + 1}"
        command = voicehost_command("gateway", "--dev", "--port", str(port))
        log = folder / f"{name}.log"
        gateways[name] = (launch(command, env, log), port, log)
    urls = [f"http://127.0.0.1:{port}" for _, port, _ in gateways.values()]
    try:
        for process, port, log in workers.values():
            wait_ready(process, f"http://127.0.0.1:{port}", log, 600)
        for process, port, log in gateways.values():
            wait_ready(process, f"http://127.0.0.1:{port}", log, 60)
        started = time.monotonic()
        answers, samples, killed = await asyncio.gather(
            load(urls, args.clients, args.seconds, started),
            watch(urls[0], args.seconds, started),
            restart_redis(redis, redis_port, folder, args.kill_at, started),
        )
    finally:
        for process, _, _ in (*gateways.values(), *workers.values()):
            stop(process, grace=30)
        for process in redis:
            stop(process)
    after = [s for s in samples if float(s["t"]) > killed]  # type: ignore[arg-type]
    back = next(
        (s["t"] for s in after if s.get("workers") and s.get("redis") == "up"),
        None,
    )
    gone = [s["t"] for s in after if not s.get("workers")]
    before = [a for a in answers if a["t"] < killed and a["status"] == 200]
    later = [a for a in answers if a["t"] > killed + 5 and a["status"] == 200]
    return {
        "workers": args.workers,
        "gateways": args.gateways,
        "clients": args.clients,
        "killed_at_s": round(killed, 2),
        "ring_back_with_load_at_s": back,
        "ring_empty_samples_after_kill": len(gone),
        "ttfb_p50_ms_before": round(statistics.median(a["ttfb"] for a in before) * 1000),
        "ttfb_p50_ms_from_5s_after": round(statistics.median(a["ttfb"] for a in later) * 1000)
        if later
        else None,
        "windows": windows(answers, args.window),
        "samples_after_kill": after[:12],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=80.0)
    parser.add_argument("--kill-at", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        summary = asyncio.run(run(args, Path(tmp)))
    for row in summary["windows"]:  # type: ignore[union-attr]
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
