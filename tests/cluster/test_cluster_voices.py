"""The cluster's voice directory over a real Redis of its own and a shared store on disk: Redis
is a cache of the store, so records it loses are rebuilt from the store's files, tenants and
versions included, and a deleted voice never comes back."""

from __future__ import annotations

import json
import shutil

import pytest

from voicehost.cluster.adapters import AdapterCache, SharedDirStore
from voicehost.cluster.state import voice_key
from voicehost.cluster.voices import RedisVoiceDirectory
from voicehost.voices.validation import AdapterRules, assign_tenant
from voicehost.voices.voice import NotHeld, RegistryIncomplete, RegistryRebuilding


@pytest.fixture
async def redis_directory(redis_client, tmp_path):
    """The cluster's voice directory: records in the test's own Redis, files in a shared store."""
    store = SharedDirStore(tmp_path / "shared")
    rules = AdapterRules("voicehost-dev", 16)
    directory = RedisVoiceDirectory(redis_client, store, ["tara"], rules, owner="test")
    await directory.reconcile()  # as each process's reconciler does when it starts
    return directory


async def register(directory, dev_model, tmp_path, voice_id, tenant=None, version=1, **extra):
    staged = tmp_path / "staging" / voice_id
    shutil.copytree(dev_model.adapters / "dev-a", staged)
    manifest = json.loads((staged / "voice.json").read_text())
    (staged / "voice.json").write_text(json.dumps({**manifest, "version": version, **extra}))
    assign_tenant(staged, tenant)
    return await directory.add(voice_id, staged)


async def test_records_lost_with_redis_are_rebuilt_from_the_store(
    redis_directory, dev_model, tmp_path
):
    """Every version's record, and which one is live, come back from the store."""
    await register(redis_directory, dev_model, tmp_path, "acme-voice", tenant="acme")
    second = tmp_path / "staging" / "acme-voice-2"
    shutil.copytree(dev_model.adapters / "dev-c", second)
    await redis_directory.add_version("acme-voice", second, promote=True)
    await redis_directory.promote("acme-voice", 1)
    await redis_directory.promote("acme-voice", 2)  # the store's live pointer moved twice
    await register(redis_directory, dev_model, tmp_path, "shared-voice")
    before = await redis_directory.redis.hgetall(voice_key("acme-voice"))
    assert await redis_directory.reconcile() == 0
    assert (await redis_directory.health())["registry"] == "whole"
    await redis_directory.redis.flushall()
    # health says so at once, before any lookup or reconcile; a list would omit: refused
    assert await redis_directory.health() == {
        "registry": "rebuilding",
        "missing_voices": 0,
        "redis": "up",
    }
    with pytest.raises(RegistryIncomplete):
        await redis_directory.list_voices()
    with pytest.raises(RegistryRebuilding) as rebuilding:  # a 503 to retry: the voice exists
        await redis_directory.find("acme-voice")
    assert (rebuilding.value.tenant, rebuilding.value.held) == ("acme", False)  # whose: 404 else
    assert redis_directory.missing() == 1  # health says so before the next reconcile
    assert (await redis_directory.health())["missing_voices"] == 1
    assert await redis_directory.find("never-was") is None  # a voice the store lacks: 404
    assert await redis_directory.reconcile() == 0
    assert redis_directory.missing() == 0
    assert (await redis_directory.health())["registry"] == "whole"
    after = await redis_directory.redis.hgetall(voice_key("acme-voice"))
    for field in ("voice_id", "name", "prompt_style", "uri", "checksum", "tenant", "version"):
        assert after[field] == before[field], field
    assert after["tenant"] == "acme" and after["version"] == "2" and after["newest"] == "2"
    assert (await redis_directory.find("acme-voice")).tenant == "acme"
    first = await redis_directory.find("acme-voice", 1)
    assert first.version == 1 and first.checksum != after["checksum"]
    listed = [(v.version, v.status) for v in await redis_directory.versions("acme-voice")]
    assert listed == [(1, "retired"), (2, "ready")]
    assert (await redis_directory.find("shared-voice")).tenant is None
    usable, _ = await redis_directory.list_voices()
    assert {v.voice_id for v in usable} == {"tara", "acme-voice", "shared-voice"}
    assert await redis_directory.reconcile() == 0  # idempotent: nothing to do the second time


async def test_a_voice_another_process_is_restoring_is_rebuilding_not_not_found(
    redis_directory, dev_model, tmp_path
):
    """In the gap a reconciler claims a voice's record before it writes it: a lookup that
    reads the bare claim in between is a 503 to retry (the store holds the voice), never a 404.
    Seen in the cluster's FLUSHALL test: an admin got 404 for dev-a 8 ms before its restore."""
    await register(redis_directory, dev_model, tmp_path, "acme-voice", tenant="acme")
    await redis_directory.redis.flushall()
    other = RedisVoiceDirectory(  # another gateway's or worker's reconciler, half-way
        redis_directory.redis, redis_directory.store, ["tara"], redis_directory.models.own, "other"
    )
    assert await other._claim("acme-voice")
    with pytest.raises(RegistryRebuilding) as rebuilding:
        await redis_directory.find("acme-voice")
    assert rebuilding.value.tenant == "acme"
    # the claim made between a lookup's first read (nothing) and its check: the same 503
    await redis_directory.redis.delete(voice_key("acme-voice"))
    first_read = redis_directory.record

    async def read_then_claimed(voice_id: str, version: int | None = None):
        found = await first_read(voice_id, version)
        await other._claim(voice_id)  # the other reconciler, just after this read
        return found

    redis_directory.record = read_then_claimed
    with pytest.raises(RegistryRebuilding):
        await redis_directory.find("acme-voice")
    redis_directory.record = first_read
    await redis_directory.redis.delete(voice_key("acme-voice"))  # the claim expired unfinished
    assert await redis_directory.reconcile() == 0
    assert (await redis_directory.find("acme-voice")).tenant == "acme"


async def test_a_version_replaced_by_a_new_live_one_is_retired(
    redis_directory, dev_model, tmp_path
):
    """Version 1 was live from its registration: once version 2 is added live, 1 is listed
    ``retired`` (it was live), not ``candidate`` (never was), as on one server."""
    await register(redis_directory, dev_model, tmp_path, "replaced")
    second = tmp_path / "staging" / "replaced-2"
    shutil.copytree(dev_model.adapters / "dev-c", second)
    await redis_directory.add_version("replaced", second, promote=True)
    listed = [(v.version, v.status) for v in await redis_directory.versions("replaced")]
    assert listed == [(1, "retired"), (2, "ready")]


async def test_a_deleted_voice_does_not_come_back(redis_directory, dev_model, tmp_path):
    await register(redis_directory, dev_model, tmp_path, "gone")
    await register(redis_directory, dev_model, tmp_path, "kept")
    assert await redis_directory.remove("gone")
    await redis_directory.redis.flushall()
    assert await redis_directory.find("gone") is None  # its files went first: never "rebuilding"
    await redis_directory.reconcile()
    assert await redis_directory.find("gone") is None
    assert await redis_directory.find("kept") is not None


async def test_a_voice_that_cannot_be_restored_is_counted_missing(
    redis_directory, dev_model, tmp_path
):
    await register(redis_directory, dev_model, tmp_path, "broken")
    (published,) = (tmp_path / "shared" / "adapters" / "broken").iterdir()
    (published / "adapter_config.json").write_text("{not json")
    await redis_directory.redis.flushall()
    assert await redis_directory.reconcile() == 1
    assert redis_directory.missing() == 1
    assert await redis_directory.find("broken") is None


async def test_a_held_voice_is_held_in_its_record_and_published_once_for_every_process(
    redis_directory, dev_model, tmp_path
):
    """The record carries the status: a worker whose cached copy of the files still says held
    serves the voice as ready once it is published, and a rebuilt record has the store's."""
    worker = RedisVoiceDirectory(
        redis_directory.redis,
        redis_directory.store,
        ["tara"],
        redis_directory.models.own,
        cache=AdapterCache(tmp_path / "cache", 1 << 30, redis_directory.store),
        owner="worker",
    )
    await register(redis_directory, dev_model, tmp_path, "held-voice", tenant="A", status="held")
    await register(redis_directory, dev_model, tmp_path, "still-held", status="held")
    assert (await redis_directory.redis.hgetall(voice_key("held-voice")))["status"] == "held"
    assert (await worker.find("held-voice")).status == "held"  # cached: its files say held
    usable, _ = await redis_directory.list_voices()
    assert {v.voice_id: v.status for v in usable}["held-voice"] == "held"

    published = {"reason": "heard it", "by": "key-a", "at": "2026-12-01T10:00:00+00:00"}
    voice = await redis_directory.publish("held-voice", published)
    assert voice.status == "ready" and voice.tenant == "A"
    record = await redis_directory.redis.hgetall(voice_key("held-voice"))
    assert record["status"] == "ready" and record["checksum"] == voice.checksum
    assert json.loads(record["manifest"])["published"] == published
    assert (await worker.find("held-voice")).status == "ready"
    (stored,) = (tmp_path / "shared" / "adapters" / "held-voice").iterdir()
    assert json.loads((stored / "voice.json").read_text())["status"] == "ready"
    with pytest.raises(NotHeld):
        await worker.publish("held-voice", published)
    with pytest.raises(NotHeld):
        await redis_directory.publish("tara", published)
    assert await redis_directory.publish("nobody", published) is None

    await redis_directory.redis.flushall()
    assert await redis_directory.reconcile() == 0
    assert (await redis_directory.find("held-voice")).status == "ready"
    assert (await redis_directory.find("still-held")).status == "held"
