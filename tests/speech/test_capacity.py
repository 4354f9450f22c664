"""Measured capacity (voicehost.speech.capacity): the per-request rate by batch size, the step-time
line that predicts an unseen size, and the admission decision and headroom built on them."""

from __future__ import annotations

import pytest

from voicehost.host.board import HostBoard
from voicehost.model import orpheus
from voicehost.speech.capacity import DecodeCost, RateMeter, Realtime, step_line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(meter: RateMeter, clock: Clock, batch: int, rate: float, seconds: float) -> None:
    """``batch`` requests generate ``rate`` tokens/s each for ``seconds``, sampled as a worker
    samples (every interval)."""
    for _ in range(batch):
        meter.begin()
    steps = round(seconds / meter.interval)
    for _ in range(steps):
        clock.now += meter.interval
        meter.tokens += round(batch * rate * meter.interval)
        meter.sample()
    for _ in range(batch):
        meter.end()
    clock.now += meter.interval
    meter.sample()  # an idle interval: no observation


def meter_with(clock: Clock) -> RateMeter:
    return RateMeter(interval=0.5, half_life=2.0, memory=60.0, clock=clock)


@pytest.mark.unit
def test_the_rate_per_request_is_measured_at_each_batch_size():
    clock = Clock()
    meter = meter_with(clock)
    run(meter, clock, batch=1, rate=200, seconds=3)
    run(meter, clock, batch=4, rate=120, seconds=3)
    assert meter.measured() == pytest.approx({1: 200, 4: 120}, rel=0.01)
    assert meter.generating == 0


@pytest.mark.unit
def test_a_size_not_measured_is_read_off_the_step_time_line():
    clock = Clock()
    meter = meter_with(clock)
    # step time 1/200 s at 1 and 1/100 s at 3: 2.5 ms fixed + 2.5 ms per request
    run(meter, clock, batch=1, rate=200, seconds=3)
    run(meter, clock, batch=3, rate=100, seconds=3)
    assert meter.predict(5) == pytest.approx(1 / (0.0025 + 5 * 0.0025), rel=0.02)
    assert meter.predict(2) == pytest.approx(1 / 0.0075, rel=0.02)


@pytest.mark.unit
def test_from_one_size_a_quarter_of_the_step_is_taken_to_grow_with_the_batch():
    intercept, slope = step_line({2: (0.01, 1.0)})
    assert (intercept, slope) == pytest.approx((0.0075, 0.00125))
    # a rate that rises with the batch (noise) gives no negative cost per request
    intercept, slope = step_line({1: (0.01, 1.0), 4: (0.008, 1.0)})
    assert slope == 0 and intercept == pytest.approx(0.009)


@pytest.mark.unit
def test_observations_older_than_the_memory_are_forgotten():
    clock = Clock()
    meter = meter_with(clock)
    run(meter, clock, batch=2, rate=150, seconds=2)
    assert meter.predict(2) == pytest.approx(150, rel=0.01)
    clock.now += 61
    assert meter.measured() == {} and meter.predict(2) is None


@pytest.mark.unit
def test_every_request_in_its_prefill_is_no_observation_of_a_stall():
    clock = Clock()
    meter = meter_with(clock)
    meter.begin()
    clock.now += 1.0
    meter.sample()
    assert meter.measured() == {}


@pytest.mark.unit
def test_one_more_stream_is_refused_once_it_would_fall_under_the_margin():
    clock = Clock()
    meter = meter_with(clock)
    # compute-bound: 2 streams get 100 each, 1 stream 200
    run(meter, clock, batch=1, rate=200, seconds=3)
    run(meter, clock, batch=2, rate=100, seconds=3)
    realtime = Realtime(meter, tokens_per_second=70, margin=1.2)  # needs 84 per stream
    assert realtime.refusal(1) is None  # 2 streams: 100 each
    reason = realtime.refusal(2)  # 3 streams: about 67 each
    assert reason is not None and "1.2 x 70 tokens/s" in reason
    assert realtime.headroom(0, limit=10) == 2 and realtime.headroom(2, limit=10) == 0
    assert realtime.headroom(0, limit=1) == 1  # the static capacity bounds it


@pytest.mark.unit
def test_an_idle_process_admits_a_stream_it_cannot_keep_real_time():
    clock = Clock()
    meter = meter_with(clock)
    run(meter, clock, batch=1, rate=20, seconds=3)
    realtime = Realtime(meter, tokens_per_second=82, margin=1.2)
    assert realtime.refusal(0) is None  # it slows nobody down
    assert realtime.refusal(1) is not None
    assert realtime.headroom(0, limit=8) == 1


@pytest.mark.unit
def test_before_any_measurement_one_stream_at_a_time_and_when_off_the_static_capacity():
    clock = Clock()
    meter = meter_with(clock)
    cold = Realtime(meter, 82, 1.2)
    assert cold.refusal(0) is None and cold.headroom(0, limit=3) == 1
    reason = cold.refusal(1)  # a burst at a cold start: the rest wait for a measurement
    assert reason is not None and "nothing is measured yet" in reason
    assert cold.headroom(1, limit=3) == 0
    run(meter, clock, batch=1, rate=10, seconds=3)
    off = Realtime(meter, tokens_per_second=0, margin=1.2)
    assert off.refusal(5) is None and off.headroom(5, limit=3) == 3


@pytest.mark.unit
def test_the_decode_cost_is_its_recent_batches_seconds_per_audio_second():
    clock = Clock()
    cost = DecodeCost(window=10.0, clock=clock)
    cost.record(busy=0.1, audio=1.0)
    assert cost.per_audio_second() is None  # 1 s of audio: too little to go by
    clock.now = 2.0
    cost.record(busy=0.5, audio=1.0)
    assert cost.per_audio_second() == pytest.approx(0.3)
    clock.now = 11.0  # the first batch is older than the window
    assert cost.per_audio_second() is None
    cost.record(busy=0.2, audio=2.0)
    assert cost.per_audio_second() == pytest.approx(0.7 / 3.0)


def decoding(clock: Clock, seconds_per_audio_second: float) -> DecodeCost:
    cost = DecodeCost(clock=clock)
    cost.record(busy=4 * seconds_per_audio_second, audio=4.0)
    return cost


@pytest.mark.unit
def test_one_more_stream_is_refused_once_the_front_ends_decoder_could_not_keep_up():
    """The engine keeps 5 streams or more real time; this front end's decoding takes 0.3 s per
    second of audio, so it keeps 3 (at the margin's 1.2 x real time: 0.36 a stream, 2). Its own
    streams count, not the host's: another front end decodes its own."""
    clock = Clock()
    meter = meter_with(clock)
    run(meter, clock, batch=1, rate=600, seconds=3)
    run(meter, clock, batch=5, rate=120, seconds=3)
    rate = orpheus.AUDIO_TOKENS_PER_SECOND
    exact = Realtime(meter, rate, 1.0, decoding(clock, 0.3))
    assert exact.refusal(2, here=2) is None  # a third: 0.9 of the decoder
    reason = exact.refusal(3, here=3)
    assert reason is not None and "0.30 s per second of audio" in reason
    assert exact.refusal(3, here=1) is None  # the host's others decode elsewhere
    assert exact.headroom(0, limit=10) == 3 and exact.headroom(3, limit=10, here=3) == 0
    margin = Realtime(meter, rate, 1.2, decoding(clock, 0.3))
    assert margin.refusal(1, here=1) is None and margin.refusal(2, here=2) is not None
    assert margin.headroom(0, limit=10) == 2
    without = Realtime(meter, rate, 1.0)  # the engine alone keeps more (5 measured at 120)
    assert without.refusal(3, here=3) is None and without.headroom(0, limit=10) >= 5
    slow = Realtime(meter, rate, 1.0, decoding(clock, 2.0))  # not even one in real time
    assert slow.refusal(0) is None and slow.headroom(0, limit=10) == 1  # an idle one takes one
    assert slow.refusal(1, here=1) is not None
    off = Realtime(meter, 0, 1.2, decoding(clock, 2.0))
    assert off.refusal(5, here=5) is None


@pytest.mark.unit
def test_streams_admitted_but_not_yet_generating_count_as_the_batch():
    clock = Clock()
    meter = meter_with(clock)
    run(meter, clock, batch=1, rate=200, seconds=3)
    run(meter, clock, batch=2, rate=100, seconds=3)
    realtime = Realtime(meter, tokens_per_second=70, margin=1.2)
    # a burst: two streams admitted, neither has reached the engine yet
    assert meter.generating == 0 and realtime.refusal(2) is not None


@pytest.mark.unit
def test_a_front_end_measures_its_requests_rate_at_the_batch_of_the_whole_host(tmp_path):
    """Two front ends share one engine core: one has 1 request generating, the other 3. The
    first measures its request's rate at batch 4 (the engine's), not 1, and admission reads
    the host's 4 requests generating; a front end with none of its own measures nothing."""
    path = tmp_path / "board"
    HostBoard.create(path, 2, 4)
    clock = Clock()
    one, three = (
        RateMeter(interval=0.5, clock=clock, board=HostBoard(path, 2, index, 4))
        for index in range(2)
    )
    one.begin()
    for _ in range(3):
        three.begin()
    assert one.batch() == three.batch() == 4 and one.generating == 1
    for _ in range(6):
        clock.now += one.interval
        one.tokens += round(90 * one.interval)
        three.tokens += round(3 * 90 * one.interval)
        one.sample()
        three.sample()
    assert one.measured() == pytest.approx({4: 90}) and three.measured() == pytest.approx({4: 90})
    for _ in range(3):
        three.end()
    clock.now += one.interval
    one.tokens += 45
    one.sample()
    three.sample()  # nothing of its own generated: no observation at batch 1
    assert one.batch() == 1 and set(three.measured()) == {4}
