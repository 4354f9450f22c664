"""A cluster's usage in a real Redis of the test's own, mirrored to a shared folder: each flush
counts once, whoever sends it and however often, and a Redis that lost its data is refilled."""

from __future__ import annotations

import asyncio
import json

from voicehost.cluster.usage import ClusterUsageStore
from voicehost.tenancy.usage import Amount, UsageKey, UsageLedger, minute_of

A = UsageKey("key-a", "acme", "tara")
B = UsageKey("key-b", "globex", "dev-a")


def store(redis_client, tmp_path, name: str) -> ClusterUsageStore:
    return ClusterUsageStore(redis_client, tmp_path / "usage", name, retention_days=400)


async def count(ledger: UsageLedger, key: UsageKey, characters: int, seconds: float) -> None:
    ledger.add(key, characters, seconds)
    await ledger.flush()


def figures(totals: dict[UsageKey, Amount]) -> dict[UsageKey, tuple[int, float]]:
    return {key: (a.characters, round(a.audio_seconds, 6)) for key, a in totals.items()}


async def test_two_workers_flushes_are_summed_once_and_refilled_after_redis_lost_them(
    redis_client, tmp_path
):
    w1, w2 = (UsageLedger(store(redis_client, tmp_path, w), None) for w in ("w1", "w2"))
    for _ in range(3):
        await count(w1, A, 10, 0.5)
        await count(w2, A, 1, 0.25)
        await count(w2, B, 7, 1.5)
    gateway = UsageLedger(store(redis_client, tmp_path, "gateway"), None)
    expected = {A: (33, 2.25), B: (21, 4.5)}
    assert figures(await gateway.totals(0, None)) == expected
    assert figures(await gateway.totals(0, "globex")) == {B: (21, 4.5)}
    # each process's flushes are in a file of its own on the shared store, one line each
    files = sorted((tmp_path / "usage").glob("*.jsonl"))
    assert [f.name.split("-")[0] for f in files] == ["w1", "w2"]
    assert [len(f.read_text().splitlines()) for f in files] == [3, 6]

    await redis_client.flushall()  # Redis restarted without its data
    again = UsageLedger(store(redis_client, tmp_path, "gateway"), None)
    first, second = await asyncio.gather(again.totals(0, None), gateway.totals(0, None))
    assert figures(first) == figures(second) == expected  # two refills at once: counted once
    await count(w1, A, 10, 0.5)  # and the workers go on counting, each flush once
    assert figures(await gateway.totals(0, None)) == {A: (43, 2.75), B: (21, 4.5)}


async def test_a_workers_next_flush_refills_redis_and_counts_itself_once(redis_client, tmp_path):
    w1, w2 = (UsageLedger(store(redis_client, tmp_path, w), None) for w in ("w1", "w2"))
    await count(w1, A, 5, 1.0)
    await count(w2, B, 3, 2.0)
    await redis_client.flushall()
    await count(w1, A, 5, 1.0)  # w1 finds Redis lacking its first flush: all is refilled
    assert await redis_client.hlen("vh:usage:applied") == 2
    reader = store(redis_client, tmp_path, "gateway")
    assert figures(await reader.totals(0, None)) == {A: (10, 2.0), B: (3, 2.0)}


async def test_flushes_redis_refused_wait_in_the_mirror_and_count_once_it_is_back(
    redis_client, redis_server, tmp_path, caplog
):
    w1 = UsageLedger(store(redis_client, tmp_path, "w1"), None)
    await count(w1, A, 1, 0.5)
    redis_server.stop()  # away, its data kept (append-only file)
    await count(w1, A, 2, 0.5)  # mirrored; Redis refused: no error for the ledger
    await count(w1, A, 4, 0.5)
    assert w1.store.waiting
    assert "usage mirrored, not yet in Redis (1 flushes)" in caplog.text  # said once
    assert len(w1.store.mirror.read_text().splitlines()) == 3
    redis_server.start()
    await w1.flush()  # nothing new counted: what waits is sent all the same
    assert not w1.store.waiting
    assert figures(await w1.totals(0, None)) == {A: (7, 1.5)}


async def test_a_line_cut_by_a_crash_is_skipped_and_the_rest_is_refilled(redis_client, tmp_path):
    w1 = UsageLedger(store(redis_client, tmp_path, "w1"), None)
    await count(w1, A, 1, 0.5)
    await count(w1, A, 2, 0.5)
    mirror = w1.store.mirror
    with mirror.open("a") as file:  # a worker killed half-way through a line
        file.write(json.dumps({"flush": 3, "buckets": [[str(minute_of(0)), "x|y|z"]]})[:20])
    await redis_client.flushall()
    reader = store(redis_client, tmp_path, "gateway")
    assert figures(await reader.totals(0, None)) == {A: (3, 1.0)}


async def test_buckets_older_than_the_retention_are_not_refilled(redis_client, tmp_path):
    kept = ClusterUsageStore(redis_client, tmp_path / "usage", "w1", retention_days=1)
    old = minute_of(0)  # 1970: long past any retention
    await kept.add({(old, A): Amount(9, 9.0)})
    assert figures(await kept.totals(0, None)) == {}
    assert len(kept.mirror.read_text().splitlines()) == 1  # the mirror keeps all


async def test_a_new_workers_first_flush_after_the_loss_does_not_hide_what_was_lost(
    redis_client, tmp_path
):
    w1 = UsageLedger(store(redis_client, tmp_path, "w1"), None)
    await count(w1, A, 5, 1.0)
    await redis_client.flushall()
    newcomer = UsageLedger(store(redis_client, tmp_path, "w2"), None)  # started after the loss
    await count(newcomer, B, 1, 0.5)  # its flush 1 has no flush before it: Redis is refilled
    reader = store(redis_client, tmp_path, "gateway")
    assert figures(await reader.totals(0, None)) == {A: (5, 1.0), B: (1, 0.5)}
