"""The voice directory of a cluster: records in Redis, adapter files in the shared store.

A record (``vh:voice:<id>``) holds the adapter's URI and checksum, owner, tenant, version and
status (``publishing`` while it is claimed, then ``ready`` or ``held`` as its ``voice.json``
says; the record's status is the one that counts, since a worker's cached copy of the files may
predate a publish).
Workers fetch the adapter into their local cache; gateways read it in the shared store. Both
validate it (once per checksum) before they use it, so a broken adapter is refused alike (422).
While Redis is down, records seen before still resolve.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.adapter_validation import (
    MANIFEST,
    STATUS,
    AdapterRules,
    InvalidAdapter,
    validate_adapter,
)
from voicehost.cluster.adapters import AdapterCache, AdapterFetchError, AdapterStore
from voicehost.cluster.state import VOICES, raise_if_cancelled, voice_key
from voicehost.voices import BrokenAdapter, NotHeld, ReadOnlyVoice, Voice, VoiceExists

log = logging.getLogger(__name__)

PUBLISH_CLAIM_SECONDS = 300
# A gateway sends the record of the voice it routes with the request, so that a worker that never
# saw it can serve it while Redis is away (believed only with the internal token).
RECORD_HEADER = "X-Voicehost-Voice-Record"
FORWARDED_FIELDS = ("voice_id", "name", "prompt_style", "uri", "checksum", "tenant", "status")
LISTED = ("ready", "held")  # the statuses of a registered voice (not a claim being published)
# Publish a held voice: its status and manifest change together, once (the status is checked
# in the same step, so of two publishes only one finds it held). Returns the status it found.
PUBLISH = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'held' then
  redis.call('HSET', KEYS[1], 'status', 'ready', 'manifest', ARGV[1])
end
return status
"""


class RedisVoiceDirectory:
    """``VoiceDirectory`` over Redis records and an ``AdapterStore`` (with a cache on workers)."""

    def __init__(
        self,
        redis: Redis,
        store: AdapterStore,
        builtin: Iterable[str],
        rules: AdapterRules,
        cache: AdapterCache | None = None,
        owner: str = "local",
    ) -> None:
        self.redis = redis
        self.store = store
        self.cache = cache
        self.rules = rules
        self.owner = owner
        self.builtin = {v: Voice(voice_id=v, name=v.capitalize()) for v in builtin}
        self._records: dict[str, dict[str, str]] = {}  # last seen, for when Redis is down
        self._ready: dict[tuple[str, str], Voice] = {}  # (voice_id, checksum) -> validated voice
        self._broken: dict[str, str] = {}
        self._fetching: dict[tuple[str, str], asyncio.Lock] = {}
        self._missing = 0  # voices in the store without a record, at the last reconcile
        self._publish = redis.register_script(PUBLISH)

    async def record(self, voice_id: str) -> dict[str, str] | None:
        """The voice's record; while Redis is unreachable, the last one seen (or the error)."""
        try:
            record = await self.redis.hgetall(voice_key(voice_id))
        except RedisError:
            if voice_id in self._records:
                return self._records[voice_id]
            raise
        if record:
            self._records[voice_id] = record
        else:
            self._records.pop(voice_id, None)
        return record or None

    def forwarded_record(self, voice_id: str) -> str | None:
        """The header value carrying the last record seen of ``voice_id`` (a gateway's)."""
        record = self._records.get(voice_id)
        if record is None:
            return None
        fields = {k: record[k] for k in FORWARDED_FIELDS if k in record}
        return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()

    def offer(self, header: str) -> None:
        """Keep a gateway's copy of a record (``forwarded_record``) for when Redis is away; a
        record read from Redis replaces it. A malformed one is ignored."""
        try:
            record = json.loads(base64.urlsafe_b64decode(header.encode()))
            voice_id = record["voice_id"]
            if not isinstance(voice_id, str) or not all(
                isinstance(record.get(k), str) for k in FORWARDED_FIELDS
            ):
                return
        except (ValueError, KeyError, TypeError):
            return
        self._records.setdefault(voice_id, {k: record[k] for k in FORWARDED_FIELDS})

    async def find(self, voice_id: str) -> Voice | None:
        if voice_id in self.builtin:
            return self.builtin[voice_id]
        record = await self.record(voice_id)
        if record is None or record.get("status") not in LISTED:
            return None
        status = record["status"]
        key = (voice_id, record["checksum"])
        known = self._ready.get(key)
        if self.cache is None and known is not None and known.status == status:
            return known  # a gateway: the store's files, validated
        async with self._fetching.setdefault(key, asyncio.Lock()):  # one download per adapter
            try:
                folder = await asyncio.to_thread(self._adapter_folder, voice_id, record)
                voice = self._ready.get(key)
                if voice is None or voice.adapter_path != folder:
                    voice = await asyncio.to_thread(validate_adapter, folder, self.rules, voice_id)
                    if voice.checksum != record["checksum"]:
                        raise AdapterFetchError(
                            f"adapter {voice_id!r} has checksum {voice.checksum}, "
                            f"the record says {record['checksum']}"
                        )
            except (AdapterFetchError, InvalidAdapter) as exc:
                self._broken[voice_id] = str(exc)
                log.error("voice %s is unusable here: %s", voice_id, exc)
                return None
        if voice.status != status:
            voice = replace(voice, status=status)  # type: ignore[arg-type]
        self._broken.pop(voice_id, None)
        self._ready[key] = voice
        return voice

    def _adapter_folder(self, voice_id: str, record: dict[str, str]) -> Path:
        """Where this process reads the adapter: a worker's verified local copy (every use goes
        through the cache: it marks the adapter used, and fetches it again if it was evicted),
        or, on a gateway, the shared store's files in place."""
        if self.cache is None:
            return self.store.folder(record["uri"])
        return self.cache.fetch(record["uri"], record["checksum"], voice_id)

    def broken(self, voice_id: str) -> str | None:
        return self._broken.get(voice_id)

    def loaded(self) -> int:
        """Adapters fetched and validated by this process."""
        return len(self._ready)

    async def list_voices(self) -> tuple[list[Voice], list[BrokenAdapter]]:
        ids = sorted(await self.redis.smembers(VOICES))
        async with self.redis.pipeline(transaction=False) as pipe:
            for voice_id in ids:
                pipe.hgetall(voice_key(voice_id))
            records = await pipe.execute()
        ready = [r for r in records if r and r.get("status") in LISTED]
        voices = [_record_voice(r) for r in ready if r["voice_id"] not in self._broken]
        broken = [
            BrokenAdapter(r["voice_id"], Path(r["uri"]), self._broken[r["voice_id"]])
            for r in ready
            if r["voice_id"] in self._broken
        ]
        return sorted([*self.builtin.values(), *voices], key=lambda v: v.voice_id), broken

    async def exists(self, voice_id: str) -> bool:
        return voice_id in self.builtin or bool(await self.redis.exists(voice_key(voice_id)))

    async def add(self, voice_id: str, folder: Path) -> Voice:
        voice = await asyncio.to_thread(validate_adapter, folder, self.rules)
        if voice_id in self.builtin or not await self._claim(voice_id):
            raise VoiceExists(f"voice {voice_id!r} already exists")
        try:
            checksum = voice.checksum or ""
            uri = await asyncio.to_thread(self.store.publish, folder, voice_id, checksum)
            await self._complete(voice, uri, _manifest_text(folder))
        except BaseException:
            with suppress(RedisError):  # otherwise the claim expires by itself
                await self.redis.delete(voice_key(voice_id))
            raise
        return voice

    async def _claim(self, voice_id: str) -> bool:
        """Claim the voice's record (``publishing``); ``False`` if it exists. The claim expires
        if this process dies before ``_complete``."""
        if not await self.redis.hsetnx(voice_key(voice_id), "status", "publishing"):
            return False
        await self.redis.expire(voice_key(voice_id), PUBLISH_CLAIM_SECONDS)
        return True

    async def _complete(self, voice: Voice, uri: str, manifest: str) -> None:
        """Write the claimed record of ``voice``, published at ``uri``, and list it."""
        record = {
            "voice_id": voice.voice_id,
            "name": voice.name,
            "prompt_style": voice.prompt_style,
            "uri": uri,
            "checksum": voice.checksum or "",
            "owner": self.owner,
            "tenant": voice.tenant or "",  # "": shared with every tenant
            "version": str(json.loads(manifest).get("version", 1)),
            "created": str(time.time()),
            "manifest": manifest,
            "status": voice.status,  # its voice.json's: a held clone stays held in the cluster
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(voice_key(voice.voice_id), mapping=record)
            pipe.persist(voice_key(voice.voice_id))
            pipe.sadd(VOICES, voice.voice_id)
            await pipe.execute()

    async def remove(self, voice_id: str) -> bool:
        """Delete the store's copy first, then the record: a reconciler never finds a deleted
        voice's files to bring it back (a crash between leaves a record of missing files, which
        is unusable, and deleted again by a retry)."""
        if voice_id in self.builtin:
            raise ReadOnlyVoice(f"voice {voice_id!r} is a built-in voice")
        record = await self.redis.hgetall(voice_key(voice_id))
        if not record:
            return False
        if record.get("uri"):
            await asyncio.to_thread(self.store.delete, record["uri"])
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(voice_key(voice_id))
            pipe.srem(VOICES, voice_id)
            await pipe.execute()
        self._records.pop(voice_id, None)
        return True

    # --- Redis is a cache of the store: rebuilding what it lost ---------------------------------

    def missing(self) -> int:
        return self._missing

    async def reconcile(self) -> int:
        """Restore the records of voices that the shared store holds and Redis lacks (Redis
        came back empty, or was flushed), from the store's own files (``voice.json`` holds the
        tenant and version). Idempotent: every worker and gateway runs it, and a record is
        claimed before it is written. Returns the voices still missing."""
        published = await asyncio.to_thread(self.store.published)
        ids = [v for v in published if v not in self.builtin]
        async with self.redis.pipeline(transaction=False) as pipe:
            for voice_id in ids:
                pipe.exists(voice_key(voice_id))
            found = await pipe.execute()
        raise_if_cancelled()
        lost = [v for v, exists in zip(ids, found, strict=True) if not exists]
        left = [v for v in lost if not await self._restore(v, published[v])]
        self._missing = len(left)
        return len(left)

    async def _restore(self, voice_id: str, uri: str) -> bool:
        """Rebuild one voice's record from the store; ``False`` if it cannot be."""
        try:
            folder = self.store.folder(uri)
            voice = await asyncio.to_thread(validate_adapter, folder, self.rules, voice_id)
            manifest = await asyncio.to_thread(_manifest_text, folder)
        except (AdapterFetchError, InvalidAdapter, OSError) as exc:
            log.warning("voice %s in the store cannot be restored: %s", voice_id, exc)
            return False
        if not await self._claim(voice_id):
            return True  # restored by another process, or registered meanwhile
        try:
            await self._complete(voice, uri, manifest)
        except BaseException:
            with suppress(RedisError):
                await self.redis.delete(voice_key(voice_id))
            raise
        if not await asyncio.to_thread(folder.is_dir):  # deleted while it was restored
            await self.remove(voice_id)
            return True
        log.info("voice %s restored from the shared store (tenant %s)", voice_id, voice.tenant)
        return True

    async def reconcile_forever(self, interval: float) -> None:
        """``reconcile`` every ``interval`` seconds (run as a task); quiet while Redis is away."""
        while True:
            try:
                await self.reconcile()
            except RedisError:
                pass  # the loops that need Redis say when it goes and returns
            except Exception:
                log.exception("reconciling the voice registry failed; retrying")
            raise_if_cancelled()
            await asyncio.sleep(interval)

    async def manifest(self, voice_id: str) -> dict | None:
        if voice_id in self.builtin:
            return {}
        record = await self.record(voice_id)
        if record is None or record.get("status") not in LISTED:
            return None
        return json.loads(record.get("manifest") or "{}")

    async def publish(self, voice_id: str, published: dict[str, object]) -> Voice | None:
        """The record first (what every process reads), then the store's ``voice.json`` (what
        a rebuild of the record reads): a crash between leaves the store saying held, so a
        lost record comes back held, never wrongly ready."""
        if voice_id in self.builtin:
            raise NotHeld(f"voice {voice_id!r} is a built-in voice")
        record = await self.redis.hgetall(voice_key(voice_id))
        if not record or record.get("status") not in LISTED:
            return None
        if record["status"] != "held":
            raise NotHeld(f"voice {voice_id!r} is not held")
        manifest = {
            **json.loads(record.get("manifest") or "{}"),
            STATUS: "ready",
            "published": published,
        }
        found = await self._publish(keys=[voice_key(voice_id)], args=[json.dumps(manifest)])
        if found not in LISTED:
            return None  # deleted meanwhile
        if found != "held":
            raise NotHeld(f"voice {voice_id!r} is not held")
        await asyncio.to_thread(self.store.write_manifest, record["uri"], manifest)
        return await self.find(voice_id)


def _manifest_text(folder: Path) -> str:
    path = folder / MANIFEST
    return path.read_text() if path.exists() else "{}"


def _record_voice(record: dict[str, str]) -> Voice:
    """The voice a registry record describes (a gateway needs no adapter files)."""
    return Voice(
        record["voice_id"],
        record["name"],
        record["prompt_style"],  # type: ignore[arg-type]
        None,
        record["checksum"],
        record.get("tenant") or None,
        record["status"],  # type: ignore[arg-type]
    )
