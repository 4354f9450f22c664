"""Benchmark a running voicehost server the way a streaming client experiences it.

For each concurrency level, ``c`` streams start at once (per round) against
``POST /v1/audio/speech`` (raw 24 kHz s16le PCM), all over one reused ``aiohttp`` session, and
every body chunk is timestamped as it arrives. Per stream: time to first byte, time to first
non-silent audio, real-time factor, underruns of a player that starts at the first byte; per
level: their percentiles and the audio tokens/s served. Reports the highest level at which at
least 99% of streams play without an underrun.

Prints a table and, as the last stdout line, one JSON object with the level summaries; writes
every stream's figures with ``--json`` and a chart with ``--plot``. Exits 1 if any stream failed.

    voicehost bench --url http://127.0.0.1:8080 --concurrency 1,4,16 --json bench.json
    voicehost bench --start-server --concurrency 1,2 --plot bench.png
    python scripts/bench.py ...   (the same command)

By role: ``playback`` (one stream: underruns, first speech, its figures), ``levels`` (a level's
percentiles), ``load`` (the driver), ``report`` (table, JSON, chart); this module is the command
line. A server started with ``--start-server`` comes from ``voicehost.tools.devserver``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

from voicehost.tools.bench.load import BenchResult, Plan, bench
from voicehost.tools.bench.playback import Analysis
from voicehost.tools.bench.report import format_table, full_report, summary_report, write_plot
from voicehost.tools.devserver import served

DESCRIPTION = (
    "Drive a server with concurrent streams over one HTTP session; report time to first byte and "
    "to first speech, underruns, real-time factor and tokens/s per concurrency level."
)
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the sun slowly sets."


def _levels(value: str) -> list[int]:
    try:
        levels = [int(c) for c in value.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"want a comma list of positive integers, not {value!r}")
    return levels


def _voices(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options (shared by ``voicehost bench`` and ``scripts/bench.py``)."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server to drive")
    parser.add_argument(
        "--concurrency", type=_levels, default=[1, 4, 16], help="comma list of levels (1,4,16)"
    )
    parser.add_argument(
        "--voices", type=_voices, help="comma list, used in turn (default: every listed voice)"
    )
    parser.add_argument("--text", default=DEFAULT_TEXT, help="what every stream says")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds per level, each of c streams started at once"
    )
    parser.add_argument("--seed", type=int, default=0, help="stream i of a level uses seed + i")
    parser.add_argument("--warmup", type=int, default=1, help="streams run first, not counted")
    parser.add_argument(
        "--jitter-buffer-ms",
        type=float,
        default=0.0,
        help="the modelled player starts this long after the first byte",
    )
    parser.add_argument(
        "--speech-threshold-dbfs",
        type=float,
        default=-50.0,
        help="first speech: the first 20 ms window whose RMS exceeds this",
    )
    parser.add_argument("--json", type=Path, help="write every stream's figures here")
    parser.add_argument("--plot", type=Path, help="write a PNG chart here")
    parser.add_argument(
        "--start-server", action="store_true", help="start a dev server (ignores --url)"
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds, with --start-server"
    )
    parser.add_argument("--read-timeout", type=float, default=600.0, help="seconds without a byte")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    add_arguments(parser)
    return parser


def plan_from(args: argparse.Namespace) -> Plan:
    return Plan(
        url=args.url.rstrip("/"),
        levels=args.concurrency,
        voices=args.voices or None,
        text=args.text,
        rounds=max(1, args.rounds),
        seed=args.seed,
        warmup=max(0, args.warmup),
        read_timeout_s=args.read_timeout,
        analysis=Analysis(
            jitter_buffer_s=args.jitter_buffer_ms / 1000,
            speech_threshold_dbfs=args.speech_threshold_dbfs,
        ),
    )


def execute(plan: Plan, start: bool, ready_timeout: float) -> BenchResult:
    """Run the plan, against a dev server started for it when ``start``."""
    with served(None if start else plan.url, ready_timeout) as (url, _):
        return asyncio.run(bench(replace(plan, url=url)))


def run(args: argparse.Namespace) -> int:
    """Run the bench for parsed arguments; the exit status."""
    import aiohttp

    plan = plan_from(args)
    try:
        result = execute(plan, args.start_server, args.ready_timeout)
    except (RuntimeError, OSError, aiohttp.ClientError, ValueError) as exc:
        message = f"{type(exc).__name__}: {exc}"
        print(f"voicehost bench: {message}", file=sys.stderr)
        print(json.dumps({"error": message, "levels": []}))
        return 1
    print(format_table(result.levels))
    summary = summary_report(plan, result)
    if args.json:
        args.json.write_text(json.dumps(full_report(plan, result), indent=1) + "\n")
    if args.plot:
        write_plot(result.levels, args.plot, summary["max_concurrency_without_underrun"])
    print(json.dumps(summary))
    failed = any(lv.errors for lv in result.levels) or summary["warmup_errors"]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python scripts/bench.py [args]``: the exit status."""
    return run(build_parser().parse_args(argv))
