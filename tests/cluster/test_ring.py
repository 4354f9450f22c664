"""Routing: the consistent-hash ring moves few voices when workers come and go, and bounded
loads keep every worker within c x the average under skewed popularity."""

import math
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from voicehost.cluster.ring import WorkerRing, choose_worker, load_bound, stable_hash

pytestmark = pytest.mark.unit

IDS = [f"voice-{i}" for i in range(100_000)]
WORKERS = [f"worker-{i}" for i in range(8)]


def owners(ring: WorkerRing) -> dict[str, str]:
    return {voice: ring.owner(voice) for voice in IDS}


def test_removing_a_worker_moves_only_the_voices_it_held():
    before = owners(WorkerRing(WORKERS))
    after = owners(WorkerRing(WORKERS[1:]))
    moved = {v for v in IDS if before[v] != after[v]}
    assert moved == {v for v in IDS if before[v] == "worker-0"}
    assert 0.08 < len(moved) / len(IDS) < 0.17  # about 1/8


def test_adding_a_worker_moves_only_voices_onto_it():
    before = owners(WorkerRing(WORKERS))
    after = owners(WorkerRing([*WORKERS, "worker-new"]))
    moved = {v for v in IDS if before[v] != after[v]}
    assert all(after[v] == "worker-new" for v in moved)
    assert 0.07 < len(moved) / len(IDS) < 0.15  # about 1/9


def test_each_worker_owns_about_an_equal_share():
    shares = Counter(owners(WorkerRing(WORKERS)).values())
    assert set(shares) == set(WORKERS)
    for count in shares.values():
        assert abs(count / len(IDS) - 1 / 8) < 0.125 * 0.15


def test_the_hash_is_stable_across_processes_and_hash_seeds():
    script = (
        "from voicehost.cluster.ring import WorkerRing;"
        f"r = WorkerRing({WORKERS!r});"
        "print(','.join(r.owner(f'voice-{i}') for i in range(10000)))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    # Pinned: a new hash would move every voice at once during a rolling upgrade.
    assert stable_hash("voice-1") == 0xA7E9B299DEEB8ABF


def simulate(choose, steps: int = 20_000, seed: int = 0) -> tuple[int, list[tuple[int, int]]]:
    """Streams arrive for Zipf-popular voices and end at random; returns the worst load seen
    against its bound at each arrival."""
    rng = random.Random(seed)
    voices = [f"voice-{i}" for i in range(2000)]
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(voices))]
    loads: Counter[str] = Counter()
    open_streams: list[str] = []
    checks = []
    for _ in range(steps):
        if open_streams and rng.random() < 0.5:
            worker = open_streams.pop(rng.randrange(len(open_streams)))
            loads[worker] -= 1
            continue
        voice = rng.choices(voices, weights)[0]
        bound = math.ceil(1.25 * (sum(loads.values()) + 1) / len(WORKERS))
        worker = choose(voice, loads)
        loads[worker] += 1
        open_streams.append(worker)
        checks.append((loads[worker], bound))
    return max(load - bound for load, bound in checks), checks


def test_bounded_loads_keep_every_worker_within_c_times_the_average():
    ring = WorkerRing(WORKERS)
    excess, checks = simulate(lambda voice, loads: choose_worker(ring, voice, loads, 1.25))
    assert excess <= 0, "a worker went over ceil(1.25 x average)"
    assert len(checks) > 5000


def test_plain_consistent_hashing_would_overload_the_hot_voices_worker():
    ring = WorkerRing(WORKERS)
    excess, _ = simulate(lambda voice, loads: ring.owner(voice))
    assert excess > 0  # why the bound is needed: Zipf traffic piles onto one worker


def test_a_hot_voice_spreads_over_its_first_successors():
    ring = WorkerRing(WORKERS)
    successors = list(ring.successors("hot"))[:3]
    loads: Counter[str] = Counter()
    for _ in range(30):
        loads[choose_worker(ring, "hot", loads, factor=100.0, replicas=3)] += 1
    assert set(loads) == set(successors)
    assert max(loads.values()) - min(loads.values()) <= 1


def test_failed_workers_are_skipped():
    ring = WorkerRing(WORKERS)
    owner = ring.owner("voice-7")
    second = list(ring.successors("voice-7"))[1]
    assert choose_worker(ring, "voice-7", {}, exclude=frozenset({owner})) == second
    assert choose_worker(WorkerRing([]), "voice-7", {}) is None


def test_load_bound():
    assert load_bound(0, 8, 1.25) == 1
    assert load_bound(79, 8, 1.25) == 13  # ceil(1.25 * 80 / 8) = 12.5 -> 13


# --- the bound's edges and the walk's order -----------------------------------------------------


@pytest.mark.unit
def test_load_bound_counts_the_stream_being_admitted():
    # 7 streams on 8 workers, the 8th arriving: 8 / 8 = 1 each; the 9th may make it 2
    assert load_bound(7, 8, 1.0) == 1
    assert load_bound(8, 8, 1.0) == 2  # ceil(9 / 8): without the +1 it would be ceil(8 / 8) = 1
    assert load_bound(3, 1, 1.0) == 4  # one worker takes everything
    assert load_bound(5, 0, 1.25) == 8  # no live worker: no division by zero


@pytest.mark.unit
def test_successors_are_each_worker_once_in_failover_order():
    """The n-th successor is the key's owner once the n - 1 before it are gone."""
    ring = WorkerRing(WORKERS)
    for key in (f"voice-{i}" for i in range(20)):
        walk = list(ring.successors(key))
        assert sorted(walk) == sorted(WORKERS)
        for n in range(1, len(WORKERS)):
            assert WorkerRing(set(WORKERS) - set(walk[:n])).owner(key) == walk[n]


@pytest.mark.unit
def test_an_empty_ring_has_no_owner_and_no_successors():
    assert WorkerRing([]).owner("voice-1") is None
    assert list(WorkerRing([]).successors("voice-1")) == []


@pytest.mark.unit
def test_by_default_a_worker_takes_up_to_1_25_times_the_average_and_no_more():
    ring = WorkerRing(WORKERS[:4])
    owner, second = list(ring.successors("voice-1"))[:2]
    # 1 stream in flight, a 2nd arriving on 4 workers: ceil(1.25 * 2 / 4) = 1 per worker
    assert choose_worker(ring, "voice-1", {owner: 1}) == second
    assert choose_worker(ring, "voice-1", {owner: 1}, factor=2.25) == owner


@pytest.mark.unit
def test_by_default_a_voice_stays_with_its_owner_while_the_owner_is_within_the_bound():
    ring = WorkerRing(WORKERS)
    owner, second = list(ring.successors("voice-1"))[:2]
    loads = {w: 1 for w in WORKERS} | {second: 0}  # bound ceil(1.25 * 8 / 8) = 2
    assert choose_worker(ring, "voice-1", loads) == owner
    assert choose_worker(ring, "voice-1", loads, replicas=2) == second


@pytest.mark.unit
def test_a_worker_missing_from_the_loads_is_idle():
    ring = WorkerRing(WORKERS)
    owner, second = list(ring.successors("voice-1"))[:2]
    assert choose_worker(ring, "voice-1", {owner: 1}, replicas=2) == second
    assert choose_worker(ring, "voice-1", {owner: 1}, factor=100.0, replicas=3) == second


@pytest.mark.unit
def test_when_every_worker_is_at_the_bound_the_owner_takes_the_stream():
    ring = WorkerRing(WORKERS)
    loads = dict.fromkeys(WORKERS, 1)  # factor 0.5: a bound of 1, which every worker has reached
    assert choose_worker(ring, "voice-1", loads, factor=0.5) == ring.owner("voice-1")
