"""A gateway's view of the workers, over a real Redis of its own."""

from __future__ import annotations

import asyncio

from voicehost.cluster.state import Membership, WorkerPresence, member_key
from voicehost.config import Settings
from voicehost.speech.admission import WorkerLoad


async def join(redis_client, redis_server, *workers: str) -> None:
    settings = Settings(redis_url=redis_server.url, worker_ttl_seconds=60)
    for worker in workers:
        presence = WorkerPresence(
            redis_client, settings, worker, f"http://{worker}", lambda: WorkerLoad(0, 0, 8, 8)
        )
        await presence.heartbeat()


async def test_a_membership_that_empties_at_once_is_held_for_the_worker_ttl(
    redis_client, redis_server
):
    await join(redis_client, redis_server, "w1", "w2")
    membership = Membership(redis_client, 0.1, hold_empty_seconds=1.0)
    await membership.refresh()
    assert set(membership.workers) == {"w1", "w2"}
    await redis_client.flushall()  # Redis came back empty, before the next heartbeats
    await membership.refresh()
    assert set(membership.workers) == {"w1", "w2"}  # not believed yet
    await join(redis_client, redis_server, "w1")  # a heartbeat re-registers one
    await membership.refresh()
    assert set(membership.workers) == {"w1"}  # a non-empty view is believed at once
    await redis_client.flushall()
    await membership.refresh()
    await asyncio.sleep(1.1)
    await membership.refresh()
    assert membership.workers == {}  # still empty after the TTL: believed


async def test_workers_that_leave_or_expire_are_believed_gone_at_once(redis_client, redis_server):
    await join(redis_client, redis_server, "w1", "w2")
    membership = Membership(redis_client, 0.1, hold_empty_seconds=60.0)
    await membership.refresh()
    await redis_client.delete(member_key("w2"))  # expired
    await membership.refresh()
    assert set(membership.workers) == {"w1"}
    await redis_client.delete(member_key("w1"))  # the last one: Redis kept its data, so believed
    await membership.refresh()
    assert membership.workers == {}
