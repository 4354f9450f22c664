"""Soak: steady load for minutes; is the server's memory and its asyncio task count flat?

Against a running server (``--url``, its process found by its port or given with ``--pid``) or
its own ``voicehost serve --dev`` (``--start-server``), ``--streams`` clients each run streams
back to back for ``--minutes``, cycling through: HTTP speech read to the end, a WebSocket
session to ``done``, HTTP speech dropped after its first chunk, and a WebSocket ``cancel``
(barge-in) after its first audio. Every ``--sample-seconds`` it samples the server's RSS (its
own and with its child processes, vLLM's engine included) and ``voicehost_asyncio_tasks`` from
``/metrics``.

Flat means: over the second half of the run, the least-squares slope of RSS stays under
``--rss-slope-mb-per-min``, and once the load has stopped and its streams have wound down, the
server holds at most ``--task-tolerance`` more asyncio tasks than at rest before it (under load
the count follows the streams in flight; its slope is reported). The means of the first and
last minute (a third of the run if shorter) are reported beside them. Prints a
summary, then one JSON line as the last line of output, and writes the full report with every
sample to ``--json``. Exits 1 if not flat or if any stream failed.

    python scripts/soak.py --start-server --minutes 10 --streams 4
    python scripts/soak.py --url http://127.0.0.1:8080 --minutes 10 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import psutil

from voicehost.tools.bench.load import served_voices
from voicehost.tools.devserver import served

TASKS_METRIC = "voicehost_asyncio_tasks"
ACTIVE_METRIC = "voicehost_active_streams"
KINDS = ("http", "ws", "http_dropped", "ws_cancelled")
SENTENCES = (
    "The river was quiet this morning.",
    "We walked along the old stone bridge and talked about the weather.",
    "Please call me back when you get this message.",
    "A few boats drifted slowly past the harbour lights.",
)


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss_mb: float  # the server process
    tree_rss_mb: float  # the server and its children (vLLM's engine process)
    tasks: float | None  # asyncio tasks alive in the server


@dataclass
class Tally:
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def fail(self, kind: str, why: str) -> None:
        self.failed[kind] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{kind}: {why}")


# --- load ------------------------------------------------------------------------------------


async def http_stream(
    session: aiohttp.ClientSession, url: str, voice: str, text: str, drop: bool
) -> None:
    """One speech request: read to the end, or drop the connection after the first chunk."""
    body = {"input": text, "voice": voice, "response_format": "pcm"}
    async with session.post(url + "/v1/audio/speech", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        if drop:
            await response.content.readany()
            response.close()  # the client goes away mid-stream: the server aborts the request
            return
        await response.read()


async def ws_stream(
    session: aiohttp.ClientSession, url: str, voice: str, text: str, cancel: bool
) -> None:
    """One realtime session to ``done``; with ``cancel``, barge in after the first audio."""
    async with session.ws_connect(url.replace("http", "ws", 1) + "/v1/audio/speech/ws") as ws:
        await ws.send_json({"type": "config", "voice": voice, "response_format": "pcm"})
        await ws.send_json({"type": "text", "text": text})
        await ws.send_json({"type": "end" if not cancel else "flush"})
        cancelled = False
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                if cancel and not cancelled:
                    await ws.send_json({"type": "cancel"})
                    cancelled = True
                continue
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            event = message.json()
            if event["type"] == "error":
                raise RuntimeError(f"ws error {event['error']}")
            if event["type"] == "cancelled":
                await ws.send_json({"type": "end"})
            if event["type"] == "done":
                return
        raise RuntimeError(f"ws closed before done (code {ws.close_code})")


async def client(
    index: int, session: aiohttp.ClientSession, url: str, voices: list[str], until: float
) -> Tally:
    """Streams back to back until ``until``, cycling through ``KINDS``."""
    tally = Tally()
    rng = random.Random(index)
    turn = index
    while time.monotonic() < until:
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        voice, text = rng.choice(voices), rng.choice(SENTENCES)
        try:
            if kind.startswith("http"):
                await http_stream(session, url, voice, text, drop=kind == "http_dropped")
            else:
                await ws_stream(session, url, voice, text, cancel=kind == "ws_cancelled")
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            tally.fail(kind, f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1)  # a failing server is not hammered in a tight loop
        else:
            tally.done[kind] += 1
    return tally


# --- sampling --------------------------------------------------------------------------------


def server_process(url: str, pid: int | None) -> psutil.Process:
    """The server: ``pid``, or the process listening on the URL's port."""
    if pid is not None:
        return psutil.Process(pid)
    port = urlparse(url).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise RuntimeError(f"no local process listens on port {port}; pass --pid")


def rss_mb(process: psutil.Process) -> tuple[float, float]:
    own = process.memory_info().rss
    tree = own
    for child in process.children(recursive=True):
        try:
            tree += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return own / 2**20, tree / 2**20


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float | None:
    """A gauge's value from ``/metrics`` (``None`` if the server has no such gauge)."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


async def at_rest(session: aiohttp.ClientSession, url: str, within: float = 60.0) -> None:
    """Wait until the server has no stream in progress (aborted ones wind down too)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not await metric(session, url, ACTIVE_METRIC):
            await asyncio.sleep(1)  # the handlers' last tasks end just after their streams
            return
        await asyncio.sleep(0.5)


async def sample(
    session: aiohttp.ClientSession, url: str, process: psutil.Process, started: float
) -> Sample:
    own, tree = rss_mb(process)
    tasks = await metric(session, url, TASKS_METRIC)
    return Sample(round(time.monotonic() - started, 2), own, tree, tasks)


# --- analysis --------------------------------------------------------------------------------


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def trend(samples: list[Sample], name: str, duration: float) -> dict[str, float | None]:
    points = [(s.t, v) for s in samples if (v := getattr(s, name)) is not None]
    if not points:
        return {"second_half_slope_per_min": None, "first_mean": None, "last_mean": None}
    edge = min(60.0, duration / 3)
    first = [v for t, v in points if t <= edge] or [points[0][1]]
    last = [v for t, v in points if t >= duration - edge] or [points[-1][1]]
    slope = slope_per_minute([(t, v) for t, v in points if t >= duration / 2])
    return {
        "second_half_slope_per_min": None if slope is None else round(slope, 3),
        "first_mean": round(statistics.fmean(first), 2),
        "last_mean": round(statistics.fmean(last), 2),
        "min": round(min(v for _, v in points), 2),
        "max": round(max(v for _, v in points), 2),
    }


def is_flat(series: dict[str, float | None], limit: float) -> bool | None:
    slope = series["second_half_slope_per_min"]
    return None if slope is None else slope <= limit


# --- run -------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace, url: str, process: psutil.Process) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=args.streams + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        voices = [args.voice] if args.voice else (await served_voices(session, url))[:3]
        await at_rest(session, url)
        before = await sample(session, url, process, time.monotonic())
        started = time.monotonic()
        until = started + args.minutes * 60
        clients = [
            asyncio.create_task(client(i, session, url, voices, until)) for i in range(args.streams)
        ]
        samples = [await sample(session, url, process, started)]
        while time.monotonic() < until:
            await asyncio.sleep(min(args.sample_seconds, max(0.0, until - time.monotonic())))
            samples.append(await sample(session, url, process, started))
            last = samples[-1]
            print(
                f"t={last.t:6.0f}s rss={last.rss_mb:8.1f} MB tree={last.tree_rss_mb:8.1f} MB "
                f"tasks={last.tasks}",
                file=sys.stderr,
                flush=True,
            )
        tallies = await asyncio.gather(*clients)
        await at_rest(session, url)
        after = await sample(session, url, process, started)
    duration = samples[-1].t
    done, failed, errors = Counter[str](), Counter[str](), []
    for tally in tallies:
        done.update(tally.done)
        failed.update(tally.failed)
        errors += tally.errors
    memory = trend(samples, "rss_mb", duration)
    tree = trend(samples, "tree_rss_mb", duration)
    tasks = trend(samples, "tasks", duration)
    left_over = None
    if before.tasks is not None and after.tasks is not None:
        left_over = after.tasks - before.tasks
    flat = {
        "rss": is_flat(memory, args.rss_slope_mb_per_min),
        "tree_rss": is_flat(tree, args.rss_slope_mb_per_min),
        "tasks": None if left_over is None else left_over <= args.task_tolerance,
    }
    return {
        "url": url,
        "minutes": args.minutes,
        "streams": args.streams,
        "voices": voices,
        "duration_s": duration,
        "streams_done": dict(done),
        "streams_failed": dict(failed),
        "errors": errors[:20],
        "rss_mb": memory,
        "tree_rss_mb": tree,
        "asyncio_tasks": {
            **tasks,
            "at_rest_before": before.tasks,
            "at_rest_after": after.tasks,
            "left_over": left_over,
        },
        "at_rest_rss_mb": {"before": round(before.rss_mb, 1), "after": round(after.rss_mb, 1)},
        "limits": {
            "rss_slope_mb_per_min": args.rss_slope_mb_per_min,
            "task_tolerance": args.task_tolerance,
        },
        "flat": flat,
        "ok": all(v is not False for v in flat.values()) and not failed,
        "samples": [asdict(s) for s in samples],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server")
    parser.add_argument("--pid", type=int, help="the server's pid (default: found by its port)")
    parser.add_argument("--start-server", action="store_true", help="start a dev server")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=4, help="concurrent clients")
    parser.add_argument("--voice", help="speak with this voice (default: up to 3 served ones)")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--rss-slope-mb-per-min", type=float, default=2.0)
    parser.add_argument(
        "--task-tolerance", type=float, default=2.0, help="tasks left over at rest, at most"
    )
    parser.add_argument("--json", type=Path, default=Path("soak.json"), help="full report")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if not args.url and not args.start_server:
        parser.error("give --url or --start-server")
    with served(None if args.start_server else args.url) as (url, proc):
        process = server_process(url, proc.pid if proc is not None else args.pid)
        report = asyncio.run(soak(args, url, process))
    args.json.write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k != "samples"}
    for key in ("streams_done", "streams_failed", "rss_mb", "tree_rss_mb", "asyncio_tasks"):
        print(f"{key}: {summary[key]}")
    print(f"flat: {summary['flat']}  ok: {summary['ok']}  (samples in {args.json})")
    print(json.dumps(summary))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
