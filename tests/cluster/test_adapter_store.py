"""Adapters across machines: published to the shared store, fetched into a worker's cache,
verified against the registry's checksum, evicted least recently used beyond the size cap."""

import os
import shutil
import time

import pytest

from voicehost.cluster.adapters import (
    AdapterCache,
    AdapterFetchError,
    SharedDirStore,
    weights_checksum,
)
from voicehost.voices.validation import ADAPTER_WEIGHTS

pytestmark = pytest.mark.unit


@pytest.fixture
def store(tmp_path):
    return SharedDirStore(tmp_path / "shared")


def publish(store, dev_model, voice_id):
    folder = dev_model.adapters / voice_id
    checksum = weights_checksum(folder)
    return store.publish(folder, voice_id, checksum), checksum


def test_a_fetched_adapter_is_a_verified_copy(tmp_path, store, dev_model):
    uri, checksum = publish(store, dev_model, "dev-a")
    assert uri.startswith("shared:adapters/dev-a/")  # relative: mounts may differ per machine
    cache = AdapterCache(tmp_path / "cache", 10**9, store)
    folder = cache.fetch(uri, checksum, "dev-a")
    assert folder.name == "dev-a" and folder.is_relative_to(tmp_path / "cache")
    assert weights_checksum(folder) == checksum
    assert cache.fetch(uri, checksum, "dev-a") == folder  # cached: no second copy
    assert len(cache.entries()) == 1


def test_a_corrupted_store_copy_is_refused(tmp_path, store, dev_model):
    uri, checksum = publish(store, dev_model, "dev-a")
    stored = store._path(uri) / ADAPTER_WEIGHTS
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    cache = AdapterCache(tmp_path / "cache", 10**9, store)
    with pytest.raises(AdapterFetchError, match="checksum"):
        cache.fetch(uri, checksum, "dev-a")
    assert cache.entries() == []  # nothing unverified is kept


def test_uris_outside_the_store_are_refused(tmp_path, store):
    cache = AdapterCache(tmp_path / "cache", 10**9, store)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for uri in (outside.as_uri(), "s3://bucket/x", "shared:../elsewhere", "shared:adapters/../.."):
        with pytest.raises(AdapterFetchError):
            cache.fetch(uri, "0" * 64, "dev-a")


def test_the_cache_evicts_the_least_recently_used_beyond_its_cap(tmp_path, store, dev_model):
    uris = {v: publish(store, dev_model, v) for v in ("dev-a", "dev-b", "dev-c")}
    one = sum(f.stat().st_size for f in (dev_model.adapters / "dev-a").iterdir())
    cache = AdapterCache(tmp_path / "cache", int(2.5 * one), store, in_use_seconds=0)
    cache.fetch(*uris["dev-a"], "dev-a")
    time.sleep(0.02)
    cache.fetch(*uris["dev-b"], "dev-b")
    time.sleep(0.02)
    cache.fetch(*uris["dev-a"], "dev-a")  # dev-a used again: dev-b is now the oldest
    time.sleep(0.02)
    cache.fetch(*uris["dev-c"], "dev-c")
    kept = {next(e.iterdir()).name for e in cache.entries()}
    assert kept == {"dev-a", "dev-c"}
    assert cache.size() <= 2.5 * one


def test_adapters_in_use_are_not_evicted_and_evicted_ones_come_back(tmp_path, store, dev_model):
    uris = {v: publish(store, dev_model, v) for v in ("dev-a", "dev-b")}
    cache = AdapterCache(tmp_path / "cache", 1, store)  # a tiny cap; both used just now
    first = cache.fetch(*uris["dev-a"], "dev-a")
    cache.fetch(*uris["dev-b"], "dev-b")
    assert len(cache.entries()) == 2  # over the cap rather than pulling one from under the engine
    shutil.rmtree(first.parent)  # evicted meanwhile
    assert cache.fetch(*uris["dev-a"], "dev-a") == first and first.is_dir()


def test_deleting_from_the_store_removes_the_files(store, dev_model):
    uri, _ = publish(store, dev_model, "dev-a")
    path = store._path(uri)
    store.delete(uri)
    assert not path.exists() and not path.parent.exists()


def test_publishing_twice_is_idempotent(store, dev_model):
    first, _ = publish(store, dev_model, "dev-a")
    second, _ = publish(store, dev_model, "dev-a")
    assert first == second
    assert not [p for p in os.scandir(store._path(first).parent) if p.name.startswith(".")]
