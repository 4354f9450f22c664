"""Key quotas for the whole cluster: leases in a real Redis of the test's own."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio

from voicehost.cluster.leases import KeyLeases, release_owners
from voicehost.speech.admission import Refused


async def test_a_key_holds_its_limit_across_workers_and_each_end_gives_one_back(redis_client):
    w1, w2 = KeyLeases(redis_client, "w1"), KeyLeases(redis_client, "w2")
    async with w1.hold("app", 2), w2.hold("app", 2):
        for worker in (w1, w2):  # per worker it would be 1 of 2: the cluster says 2 of 2
            with pytest.raises(Refused) as refused:
                async with worker.hold("app", 2):
                    pass
            assert refused.value.code == "quota_exceeded"
            assert "2 streams in progress in the cluster" in refused.value.message
        async with w1.hold("other-key", 2):  # another key has its own leases
            pass
    async with w2.hold("app", 2), w2.hold("app", 2):  # both given back
        pass
    assert await redis_client.zcard("vh:lease:app") == 0


async def test_a_crashed_workers_leases_expire_and_a_live_ones_are_kept(redis_client):
    crashed = KeyLeases(redis_client, "crashed", lease_seconds=0.5)
    await crashed.hold("app", 1).__aenter__()  # never released, never refreshed
    live = KeyLeases(redis_client, "live", lease_seconds=0.5)
    with pytest.raises(Refused):
        async with live.hold("app", 1):
            pass
    await asyncio.sleep(0.6)
    async with live.hold("app", 1):  # the crashed one's lease has expired
        refresher = asyncio.create_task(live.refresh_forever(interval=0.1))
        try:
            await asyncio.sleep(1.0)  # twice the lease: kept alive by the refreshes
            with pytest.raises(Refused):
                async with KeyLeases(redis_client, "third").hold("app", 1):
                    pass
        finally:
            refresher.cancel()


async def test_a_gone_workers_leases_are_dropped_at_once_and_the_others_kept(redis_client):
    """What a gateway does for a worker it found gone without leaving: its leases on every key
    are dropped (its key's quota whole again at once, not in 15 s); another worker's stay,
    and so does a worker whose name only begins with the gone one's."""
    gone, other, longer = (KeyLeases(redis_client, name) for name in ("w1", "w2", "w1b"))
    held = [  # kept: a lease's context collected unfinished would give its lease back
        leases.hold(key, 4)
        for leases, key in [(gone, "app"), (gone, "app"), (gone, "other"), (other, "app")]
    ]
    held.append(longer.hold("app", 4))
    for lease in held:
        await lease.__aenter__()  # never left: as if its process had died holding it
    assert await release_owners(redis_client, ["w1"]) == 3
    owners = [m.rsplit(":", 1)[0] for m in await redis_client.zrange("vh:lease:app", 0, -1)]
    assert sorted(owners) == ["w1b", "w2"]
    assert await redis_client.zcard("vh:lease:other") == 0
    async with gone.hold("app", 4), gone.hold("app", 4):  # the quota: 2 held of 4
        pass
    assert await release_owners(redis_client, ["w9"]) == 0


async def test_without_redis_the_process_count_alone_holds_and_the_log_says_so_once(
    redis_server, caplog
):
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=0.5)
    redis_server.stop()
    leases = KeyLeases(client, "w1")
    try:
        with caplog.at_level(logging.WARNING, logger="voicehost.cluster.leases"):
            for _ in range(3):
                async with leases.hold("app", 1), leases.hold("app", 1):  # no cluster count
                    pass
        assert sum("key quotas count this process only" in m for m in caplog.messages) == 1
    finally:
        await client.aclose()
        redis_server.start()
