"""What a run prints and writes: the table, the JSON reports and the chart."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from voicehost.model.orpheus import AUDIO_TOKENS_PER_SECOND
from voicehost.tools.bench.levels import (
    UNDERRUN_FREE_SHARE,
    LevelSummary,
    max_concurrency_without_underrun,
)
from voicehost.tools.bench.load import BenchResult, Plan


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(levels: Sequence[LevelSummary]) -> str:
    """A fixed-width table of the level summaries, with their streams' errors under them."""
    head = (
        f"{'conc':>5} {'n':>4} {'ttfb p50':>9} {'p95':>7} {'p99':>7} {'speech p50':>11} "
        f"{'p95':>7} {'p99':>7} {'rtf p50':>8} {'rtf max':>8} {'no underrun':>12} "
        f"{'stall s':>8} {'tok/s':>8} {'server ms':>9} {'http ms':>8} {'wire ms':>8} "
        f"{'errors':>6} {'refused':>7}"
    )
    lines = [head]
    for lv in levels:
        t, s = lv.ttfb_ms, lv.first_speech_ms
        lines.append(
            f"{lv.concurrency:>5} {lv.stream_count:>4} {_fmt(t['p50'], '.0f'):>9} "
            f"{_fmt(t['p95'], '.0f'):>7} {_fmt(t['p99'], '.0f'):>7} {_fmt(s['p50'], '.0f'):>11} "
            f"{_fmt(s['p95'], '.0f'):>7} {_fmt(s['p99'], '.0f'):>7} "
            f"{_fmt(lv.rtf['p50'], '.2f'):>8} {_fmt(lv.rtf['max'], '.2f'):>8} "
            f"{f'{lv.underrun_free_streams}/{lv.stream_count}':>12} {lv.stall_s:>8.2f} "
            f"{lv.audio_tokens_per_s:>8.1f} {_fmt(lv.server_first_audio_ms_mean, '.1f'):>9} "
            f"{_fmt(lv.http_overhead_ms_mean, '.1f'):>8} "
            f"{_fmt(lv.http_overhead_on_wire_ms_mean, '.1f'):>8} {lv.errors:>6} {lv.refused:>7}"
        )
        lines += [f"      error: {message}" for message in lv.error_messages[:5]]
    return "\n".join(lines)


def summary_report(plan: Plan, result: BenchResult) -> dict[str, Any]:
    """The run's settings and level summaries (the last stdout line)."""
    return {
        "url": result.url,
        "text": plan.text,
        "voices": result.voices,
        "rounds": plan.rounds,
        "jitter_buffer_ms": round(plan.analysis.jitter_buffer_s * 1000, 3),
        "speech_threshold_dbfs": plan.analysis.speech_threshold_dbfs,
        "audio_tokens_per_audio_second": round(AUDIO_TOKENS_PER_SECOND, 4),
        "max_concurrency_without_underrun": max_concurrency_without_underrun(result.levels),
        "warmup_errors": [f"{w.voice}: {w.error}" for w in result.warmup if w.error],
        "levels": [asdict(lv) for lv in result.levels],
    }


def full_report(plan: Plan, result: BenchResult) -> dict[str, Any]:
    """The summary report with every stream's figures under its level (for ``--json``)."""
    report = summary_report(plan, result)
    for level in report["levels"]:
        level["streams"] = [asdict(s) for s in result.streams[level["concurrency"]]]
    report["warmup"] = [asdict(w) for w in result.warmup]
    return report


def _series(levels: Sequence[LevelSummary], pick: Any) -> list[float]:
    return [math.nan if (v := pick(lv)) is None else v for lv in levels]


def write_plot(levels: Sequence[LevelSummary], path: Path, max_ok: int | None) -> None:
    """First byte / first speech percentiles, underrun share and tokens/s against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [lv.concurrency for lv in levels]
    fig, (latency, underrun, tokens) = plt.subplots(1, 3, figsize=(15, 4.5))
    for key, style in zip(("p50", "p95", "p99"), ("o-", "s--", "^:"), strict=True):
        latency.plot(x, _series(levels, lambda lv, k=key: lv.ttfb_ms[k]), style, color="C0")
        speech = _series(levels, lambda lv, k=key: lv.first_speech_ms[k])
        latency.plot(x, speech, style, color="C1", markerfacecolor="none", markersize=9)
    latency.plot([], [], "-", color="C0", label="first byte")
    latency.plot([], [], "-", color="C1", label="first speech")
    latency.set(title="latency (p50 o, p95 s, p99 ^)", xlabel="concurrent streams", ylabel="ms")
    latency.legend()
    share = [100 * (1 - lv.underrun_free_share) for lv in levels]
    underrun.plot(x, share, "o-", color="C3")
    underrun.axhline(100 * (1 - UNDERRUN_FREE_SHARE), color="grey", linestyle="--", label="1%")
    underrun.set(
        title=f"streams with an underrun (max ok: {max_ok})",
        xlabel="concurrent streams",
        ylabel="% of streams",
        ylim=(-2, 102),
    )
    underrun.legend(loc="center right")
    tokens.plot(x, [lv.audio_tokens_per_s for lv in levels], "o-", color="C2", label="served")
    tokens.plot(
        x, [c * AUDIO_TOKENS_PER_SECOND for c in x], "--", color="grey", label="real time x c"
    )
    tokens.set(title="audio tokens/s, all streams", xlabel="concurrent streams", ylabel="tokens/s")
    tokens.legend()
    for ax in (latency, underrun, tokens):
        if len(x) > 1 and max(x) >= 4 * min(x):
            ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(c) for c in x])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
