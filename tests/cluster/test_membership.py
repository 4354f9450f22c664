"""A gateway's view of the workers, over a real Redis of its own."""

from __future__ import annotations

import asyncio

from voicehost.cluster.ring import choose_worker
from voicehost.cluster.state import Membership, WorkerPresence, member_key
from voicehost.config import Settings
from voicehost.speech.admission import WorkerLoad
from voicehost.voices.validation import AdapterRules


async def join(redis_client, redis_server, *workers: str, model: str = "") -> None:
    settings = Settings(redis_url=redis_server.url, worker_ttl_seconds=60)
    for worker in workers:
        load = lambda: WorkerLoad(0, 0, 8, 8)  # noqa: E731
        rules = (lambda: AdapterRules(model, 16)) if model else None
        presence = WorkerPresence(redis_client, settings, worker, f"http://{worker}", load, rules)
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


async def test_workers_of_each_base_model_make_a_ring_of_their_own(redis_client, redis_server):
    """A voice is placed within its base model's ring: the English workers' voices never land
    on the French one, and a French worker that leaves takes the French ring with it."""
    await join(redis_client, redis_server, "en1", "en2", model="orpheus-3b")
    await join(redis_client, redis_server, "fr1", model="3b-fr-ft")
    membership = Membership(redis_client, 0.1)
    await membership.refresh()
    assert membership.workers["fr1"].base_model == "3b-fr-ft"
    assert {m: r.workers for m, r in membership.rings.items()} == {
        "orpheus-3b": {"en1", "en2"},
        "3b-fr-ft": {"fr1"},
    }
    english = membership.rings["orpheus-3b"]
    assert {choose_worker(english, f"voice-{i}", {}) for i in range(40)} == {"en1", "en2"}
    assert len(membership.ring) == 3  # the whole cluster's, for what no model names
    await redis_client.delete(member_key("fr1"))
    await membership.refresh()
    assert set(membership.rings) == {"orpheus-3b"}
    await join(redis_client, redis_server, "old")  # a worker from before models were said
    await membership.refresh()
    assert membership.rings["orpheus-3b"].workers == {"en1", "en2", "old"}
    assert membership.rings[""].workers == {"old"}
    told: list[set[str]] = []  # a gateway is told each new membership, its voices with it
    membership.on_change = lambda workers: told.append(set(workers))
    presence = WorkerPresence(
        redis_client,
        Settings(redis_url=redis_server.url, worker_ttl_seconds=60),
        "fr2",
        "http://fr2",
        lambda: WorkerLoad(0, 0, 8, 8),
        lambda: AdapterRules("3b-fr-ft", 16, languages=("fr",)),
        {"pierre": "fr"},
    )
    await presence.heartbeat()
    await membership.refresh()
    assert membership.workers["fr2"].voices == {"pierre": "fr"}
    assert told == [set(membership.workers)]
    await membership.refresh()
    assert len(told) == 1  # nothing changed: not told again
