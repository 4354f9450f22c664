"""A concurrency level's figures: percentiles over its streams, and the highest level that
plays without underruns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from voicehost.model.orpheus import AUDIO_TOKENS_PER_SECOND
from voicehost.tools.bench.playback import StreamResult

PERCENTILES = (50, 95, 99)
UNDERRUN_FREE_SHARE = 0.99  # the share of streams without an underrun that a level must reach


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), rounded; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (pos - low), 4)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """``{"p50": ..., "p95": ..., "p99": ...}``."""
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


@dataclass(slots=True)
class LevelSummary:
    """One concurrency level: percentiles over its successful streams, totals over all."""

    concurrency: int
    stream_count: int
    errors: int  # failed streams, not counting those refused by admission control
    refused: int  # answered 503/429 with Retry-After (the server was full, or a key's quota)
    refused_ms_max: float | None
    wall_s: float
    ttfb_ms: dict[str, float | None]
    first_speech_ms: dict[str, float | None]
    no_speech_streams: int  # successful streams with no window above the speech threshold
    rtf: dict[str, float | None]
    rtf_total: dict[str, float | None]
    underruns: int
    stall_s: float
    underrun_free_streams: int  # successful streams without an underrun
    underrun_free_share: float  # of the admitted streams (a failed one counts as not free)
    audio_s: float
    audio_tokens_per_s: float  # audio tokens of every stream / the level's wall time
    error_messages: list[str] = field(default_factory=list)
    # The server's own time from a stream's text to its first PCM (its
    # voicehost_time_to_first_audio_seconds histogram over this level: given only where the
    # histogram counted exactly this level's streams, ``server_streams_counted``, so that
    # another client's streams are never averaged in), and how much longer
    # the client waited for its first byte on average: parsing, routing, HTTP and the network;
    # "on the wire" counts from each request's last byte sent, leaving out the client's own
    # queue (a burst of requests leaves one client process one at a time).
    server_streams_counted: int | None = None
    server_first_audio_ms_mean: float | None = None
    http_overhead_ms_mean: float | None = None
    http_overhead_on_wire_ms_mean: float | None = None


def summarize(concurrency: int, streams: Sequence[StreamResult], wall_s: float) -> LevelSummary:
    """A level's summary from its streams' figures."""
    ok = [s for s in streams if s.ok]
    refused = [s.refused_ms for s in streams if s.refused_ms is not None]
    audio_s = sum(s.audio_s for s in ok)
    free = sum(1 for s in ok if s.underruns == 0)

    def spread(name: str) -> dict[str, float | None]:
        return percentiles([v for s in ok if (v := getattr(s, name)) is not None])

    rtf = spread("rtf")
    rtf["max"] = max((s.rtf for s in ok if s.rtf is not None), default=None)
    return LevelSummary(
        concurrency=concurrency,
        stream_count=len(streams),
        errors=len(streams) - len(ok) - len(refused),
        refused=len(refused),
        refused_ms_max=max(refused, default=None),
        wall_s=round(wall_s, 3),
        ttfb_ms=spread("ttfb_ms"),
        first_speech_ms=spread("first_speech_ms"),
        no_speech_streams=sum(1 for s in ok if s.first_speech_ms is None),
        rtf=rtf,
        rtf_total=spread("rtf_total"),
        underruns=sum(s.underruns for s in ok),
        stall_s=round(sum(s.stall_s for s in ok), 3),
        underrun_free_streams=free,
        underrun_free_share=round(free / admitted, 4)
        if (admitted := len(streams) - len(refused))
        else 0.0,
        audio_s=round(audio_s, 3),
        audio_tokens_per_s=round(audio_s * AUDIO_TOKENS_PER_SECOND / wall_s, 2) if wall_s else 0.0,
        error_messages=[
            f"stream {s.index} ({s.voice}): {s.error}" for s in streams if s.error and not s.refused
        ],
    )


def max_concurrency_without_underrun(
    levels: Sequence[LevelSummary], share: float = UNDERRUN_FREE_SHARE
) -> int | None:
    """The highest level at which at least ``share`` of the streams had no underrun."""
    passing = [
        lv.concurrency for lv in levels if lv.stream_count and lv.underrun_free_share >= share
    ]
    return max(passing, default=None)
