"""Measured capacity: how fast this process's engine generates audio tokens for each request, by
how many requests generate at once, and whether one more stream would keep every stream real
time.

The engine gives every running request one token per decode step, so a request's rate is one
over the step time, and the step time grows with the batch: a fixed part (the weights read once
per step) and a part per request. ``RateMeter`` measures the per-request rate at each batch size
it has seen over the last seconds; ``predict`` fits the step time as a line in the batch size
through what it measured and reads the rate at a size it has not seen. The tokens are heard only
once the front end has decoded them to audio: ``DecodeCost`` measures what its SNAC decoding
takes per second of audio, and one more stream is refused too once the front end's decoder
would be busy more than all the time. Admission asks ``Realtime.refusal`` before it admits a
stream; a worker reports ``headroom`` to the gateways.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voicehost.model import orpheus
from voicehost.speech.board import Board, LocalBoard

if TYPE_CHECKING:
    from voicehost.config import Settings


@dataclass(slots=True)
class _Bucket:
    """What was measured at one batch size: the per-request rate (tokens/s, a moving average
    weighted by time), how long it was observed, and when last."""

    rate: float
    seconds: float
    seen: float


class RateMeter:
    """Counts the audio tokens the engine generates and how many requests generate them.

    With ``board`` (front ends sharing one engine core) the per-request rate is measured from
    this process's requests, and the batch it belongs to is the host's: every front end
    publishes its requests generating on the board.

    The engine side calls ``begin``/``end`` around each request's token stream and adds its
    tokens to ``tokens``; ``sample`` (called every ``interval`` seconds, and before each
    decision) turns what happened since the last sample into one observation: the tokens per
    request-second, at the time-averaged number of requests generating. Observations older than
    ``memory`` seconds are forgotten; ``half_life`` sets how fast newer ones outweigh older.
    """

    def __init__(
        self,
        interval: float = 0.5,
        half_life: float = 5.0,
        memory: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        board: Board | None = None,
    ) -> None:
        self.interval = interval
        # the engine requests generating: this process's, or every front end's of the host
        self.board: Board = board if board is not None else LocalBoard()
        self.half_life = half_life
        self.memory = memory
        self.clock = clock
        self.generating = 0  # engine requests whose tokens are still coming
        self.tokens = 0  # audio tokens generated, all requests together
        self._busy = 0.0  # request-seconds: the integral of ``generating`` over time
        self._moved = clock()  # when ``_busy`` was last brought up to date
        # (time, tokens, busy, the host's busy) at the last sample
        self._sampled = (self._moved, 0, 0.0, 0.0)
        self.buckets: dict[int, _Bucket] = {}

    def begin(self) -> None:
        now = self._settle()
        self.generating += 1
        self.board.publish(self.generating, self._busy, now)

    def end(self) -> None:
        now = self._settle()
        self.generating -= 1
        self.board.publish(self.generating, self._busy, now)

    def batch(self) -> int:
        """The engine requests generating now: the host's (every front end's), or this
        process's when it is the host."""
        return self.board.generating(self.clock())[0]

    def _settle(self) -> float:
        now = self.clock()
        self._busy += self.generating * (now - self._moved)
        self._moved = now
        return now

    def sample(self) -> None:
        """Close the observation since the last sample, if it has lasted ``interval``."""
        now = self._settle()
        then, tokens, busy, host_busy = self._sampled
        elapsed = now - then
        if elapsed < self.interval:
            return
        host_now = self.board.generating(now)[1]
        self._sampled = (now, self.tokens, self._busy, host_now)
        request_seconds = self._busy - busy
        # the batch is the host's: every front end's requests share the engine's steps
        batch = round((host_now - host_busy) / elapsed)
        if batch < 1 or self.tokens == tokens or request_seconds <= 0:
            return  # idle, every request still in its prefill, or only other front ends'
        rate = (self.tokens - tokens) / request_seconds
        bucket = self.buckets.get(batch)
        if bucket is None or now - bucket.seen > self.memory:
            self.buckets[batch] = _Bucket(rate, elapsed, now)
            return
        weight = 1 - 0.5 ** (elapsed / self.half_life)
        bucket.rate += weight * (rate - bucket.rate)
        bucket.seconds += elapsed
        bucket.seen = now

    def forget(self) -> None:
        """Drop every observation (a cold engine's warm-up is no measure of its rate)."""
        self.sample()
        self.buckets.clear()

    def measured(self) -> dict[int, float]:
        """Per-request tokens/s by batch size, of the observations still remembered."""
        now = self.clock()
        for batch in [b for b, v in self.buckets.items() if now - v.seen > self.memory]:
            del self.buckets[batch]
        return {batch: bucket.rate for batch, bucket in sorted(self.buckets.items())}

    def predict(self, batch: int) -> float | None:
        """The per-request tokens/s expected with ``batch`` requests generating: what was
        measured at that size, else the step-time line through what was; ``None`` before any
        measurement."""
        line = self.line()
        return None if line is None else line.rate(batch)

    def line(self) -> StepLine | None:
        """What was measured and the step-time line through it (``None``: nothing yet)."""
        measured = self.measured()
        if not measured:
            return None
        points = {b: (1 / r, self.buckets[b].seconds) for b, r in measured.items()}
        return StepLine(measured, *step_line(points))


@dataclass(frozen=True, slots=True)
class StepLine:
    """The per-request rate at each batch size: measured where it was, else off the line."""

    measured: dict[int, float]
    intercept: float
    slope: float

    def rate(self, batch: int) -> float:
        if batch in self.measured:
            return self.measured[batch]
        step = self.intercept + self.slope * batch
        return 1 / step if step > 0 else math.inf

    def largest_batch(self, rate: float) -> float:
        """The largest batch the line keeps at ``rate`` per request (it falls with the batch)."""
        if self.slope <= 0:
            return math.inf if self.intercept <= 1 / rate else 0
        return math.floor((1 / rate - self.intercept) / self.slope)


PER_REQUEST_SHARE = 0.25  # of the step time, when only one batch size has been measured


def step_line(points: dict[int, tuple[float, float]]) -> tuple[float, float]:
    """The decode step's time as ``intercept + slope * batch``, fitted (weighted least squares)
    through ``points`` (batch -> (step seconds, weight)), with neither part below 0.

    From one batch size alone the split is unknown: a quarter of the step is taken to grow with
    the batch (a GPU decoding a 3B model spends nearly all of a step reading the weights once
    for the whole batch; the CPU dev engine measured a fifth per request). The meter learns the
    real slope once a second size has been measured; ``margin`` absorbs the error meanwhile.
    """
    if len(points) == 1:
        ((batch, (step, _)),) = points.items()
        return step * (1 - PER_REQUEST_SHARE), step * PER_REQUEST_SHARE / batch
    total = sum(w for _, w in points.values())
    mean_b = sum(b * w for b, (_, w) in points.items()) / total
    mean_s = sum(s * w for s, w in points.values()) / total
    spread = sum(w * (b - mean_b) ** 2 for b, (_, w) in points.items())
    slope = sum(w * (b - mean_b) * (s - mean_s) for b, (s, w) in points.items()) / spread
    slope = max(0.0, slope)
    intercept = mean_s - slope * mean_b
    if intercept < 0:  # the line through the origin that fits best
        intercept = 0.0
        slope = sum(w * b * s for b, (s, w) in points.items()) / sum(
            w * b * b for b, (_, w) in points.items()
        )
    return intercept, slope


DECODE_WINDOW_SECONDS = 10.0  # the decode batches DecodeCost remembers
DECODE_MIN_AUDIO_SECONDS = 2.0  # audio decoded within it before its cost is taken as measured


class DecodeCost:
    """What this process's audio decoding costs: wall seconds of its SNAC decode batches per
    second of audio they gave, over the last ``window`` seconds (the front end's
    ``voicehost.model.codec.DecodeScheduler`` records each batch). Wall time, not CPU time: a
    decoder short of CPU, or waiting for its GPU, makes its streams wait all the same."""

    def __init__(
        self, window: float = DECODE_WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.clock = clock
        self._batches: deque[tuple[float, float, float]] = deque()  # (when, busy s, audio s)
        self._busy = self._audio = 0.0  # their sums, kept as they come and go

    def record(self, busy: float, audio: float) -> None:
        """A decode batch took ``busy`` seconds and gave ``audio`` seconds of audio."""
        now = self.clock()
        self._batches.append((now, busy, audio))
        self._busy += busy
        self._audio += audio
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._batches and self._batches[0][0] < now - self.window:
            _, busy, audio = self._batches.popleft()
            self._busy -= busy
            self._audio -= audio
        if not self._batches:  # no rounding left over
            self._busy = self._audio = 0.0

    def per_audio_second(self) -> float | None:
        """Decode seconds per second of audio lately; ``None`` until enough audio was decoded
        (``DECODE_MIN_AUDIO_SECONDS`` within the window)."""
        self._forget(self.clock())
        if self._audio < DECODE_MIN_AUDIO_SECONDS:
            return None
        return self._busy / self._audio


@dataclass
class Realtime:
    """Admission from measured capacity: a new stream only while the per-request rate predicted
    with one more request stays at least ``margin`` x ``tokens_per_second`` (the rate that
    plays in real time). ``tokens_per_second`` 0 turns it off."""

    meter: RateMeter
    tokens_per_second: float
    margin: float
    # this process's audio decoding (None: not counted); what one stream keeps it busy for is
    # its cost per audio second times the audio seconds per second a stream needs
    decode: DecodeCost | None = None

    @classmethod
    def from_settings(
        cls, meter: RateMeter, settings: Settings, decode: DecodeCost | None = None
    ) -> Realtime:
        """``realtime_tokens_per_second`` (by default the rate Orpheus' audio plays at; off
        for the dev model) with ``realtime_margin``, and this process's ``decode`` cost."""
        rate = settings.realtime_tokens_per_second
        if rate is None:
            rate = 0.0 if settings.dev else orpheus.AUDIO_TOKENS_PER_SECOND
        return cls(meter, rate, settings.realtime_margin, decode)

    @property
    def needed(self) -> float:
        return self.tokens_per_second * self.margin

    def decode_cost(self) -> float | None:
        """This process's decoding, seconds per audio second (``None``: not measured, or not
        counted)."""
        if self.decode is None or not self.tokens_per_second:
            return None
        return self.decode.per_audio_second() or None

    def decode_room(self, here: int, cost: float | None) -> int | None:
        """Streams more a decoder of ``cost`` keeps real time beside its ``here`` streams."""
        if cost is None:
            return None
        busy = cost * self.needed / orpheus.AUDIO_TOKENS_PER_SECOND  # one stream's share
        # an idle decoder takes one stream whatever it measured: it slows nobody down
        return max(0 if here else 1, math.floor(1 / busy) - here)

    def refusal(self, streams: int, here: int = 0) -> str | None:
        """Why one more stream would slow the others below real time (``None``: admit it).
        ``streams``: those admitted now on the host, ``here`` on this process (its decoder's).
        With none, a stream is always admitted: it slows nobody down, even if this engine
        cannot keep even one real-time. Before the meter has measured anything (a cold start),
        streams are admitted one at a time: a burst would otherwise all be admitted on no
        evidence at all."""
        if not self.tokens_per_second:
            return None
        if here and self.decode_room(here, cost := self.decode_cost()) == 0:
            return (
                f"this front end's audio decoding takes {cost:.2f} s per second of audio: one "
                f"more stream beside its {here} would keep it busy longer than audio made at "
                f"{self.margin:g} x {self.tokens_per_second:g} tokens/s plays"
            )
        self.meter.sample()
        batch = max(streams, self.meter.batch())
        if batch == 0:
            return None
        rate = self.meter.predict(batch + 1)
        if rate is None:
            return "nothing is measured yet: one stream at a time until the engine's rate is"
        if rate >= self.needed:
            return None
        return (
            f"one more stream would generate {rate:.0f} audio tokens/s per stream, under the "
            f"{self.margin:g} x {self.tokens_per_second:g} tokens/s that play in real time"
        )

    def headroom(self, streams: int, limit: int, here: int = 0) -> int:
        """How many more streams this process predicts it keeps real time (at most
        ``limit``, the static capacity's room, and what its decoder keeps beside its ``here``
        streams)."""
        if not self.tokens_per_second:
            return max(0, limit)
        if (decoding := self.decode_room(here, self.decode_cost())) is not None:
            limit = min(limit, decoding)
        self.meter.sample()
        batch = max(streams, self.meter.batch())
        limit = max(0, limit)
        line = self.meter.line()
        if line is None:  # cold: one stream at a time
            return min(limit, 1) if batch == 0 else 0
        room = 0
        top = max(line.measured)
        while room < limit and batch + room < top:  # through the sizes measured
            if batch + room and line.rate(batch + room + 1) < self.needed:
                return room
            room += 1
        if room < limit and batch + room == 0:
            room = 1  # an idle process admits one whatever it measured
        # beyond them, the line: at most as far as it keeps the rate (O(1), whatever the limit)
        beyond = line.largest_batch(self.needed) - batch
        return int(min(limit, max(room, beyond)))
