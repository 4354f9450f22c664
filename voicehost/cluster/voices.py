"""The voice directory of a cluster: records in Redis, adapter files in the shared store.

A record (``vh:voice:<id>``) holds the adapter's URI and checksum, owner, tenant, version and
status.
Workers fetch the adapter into their local cache; gateways read it in the shared store. Both
validate it (once per checksum) before they use it, so a broken adapter is refused alike (422).
While Redis is down, records seen before still resolve.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.adapter_validation import MANIFEST, AdapterRules, InvalidAdapter, validate_adapter
from voicehost.cluster.adapters import AdapterCache, AdapterFetchError, AdapterStore
from voicehost.cluster.state import VOICES, voice_key
from voicehost.voices import BrokenAdapter, ReadOnlyVoice, Voice, VoiceExists

log = logging.getLogger(__name__)

PUBLISH_CLAIM_SECONDS = 300


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

    async def find(self, voice_id: str) -> Voice | None:
        if voice_id in self.builtin:
            return self.builtin[voice_id]
        record = await self.record(voice_id)
        if record is None or record.get("status") != "ready":
            return None
        key = (voice_id, record["checksum"])
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
        ready = [r for r in records if r and r.get("status") == "ready"]
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
        if voice_id in self.builtin or not await self.redis.hsetnx(
            voice_key(voice_id), "status", "publishing"
        ):
            raise VoiceExists(f"voice {voice_id!r} already exists")
        # A claim that expires if this process dies before the record is complete.
        await self.redis.expire(voice_key(voice_id), PUBLISH_CLAIM_SECONDS)
        try:
            checksum = voice.checksum or ""
            uri = await asyncio.to_thread(self.store.publish, folder, voice_id, checksum)
            manifest_path = folder / MANIFEST
            manifest = manifest_path.read_text() if manifest_path.exists() else "{}"
            version = json.loads(manifest).get("version", 1)
            record = {
                "voice_id": voice_id,
                "name": voice.name,
                "prompt_style": voice.prompt_style,
                "uri": uri,
                "checksum": checksum,
                "owner": self.owner,
                "tenant": voice.tenant or "",  # "": shared with every tenant
                "version": str(version),
                "created": str(time.time()),
                "manifest": manifest,
                "status": "ready",
            }
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(voice_key(voice_id), mapping=record)
                pipe.persist(voice_key(voice_id))
                pipe.sadd(VOICES, voice_id)
                await pipe.execute()
        except BaseException:
            with suppress(RedisError):  # otherwise the claim expires by itself
                await self.redis.delete(voice_key(voice_id))
            raise
        return voice

    async def remove(self, voice_id: str) -> bool:
        if voice_id in self.builtin:
            raise ReadOnlyVoice(f"voice {voice_id!r} is a built-in voice")
        record = await self.redis.hgetall(voice_key(voice_id))
        if not record:
            return False
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(voice_key(voice_id))
            pipe.srem(VOICES, voice_id)
            await pipe.execute()
        self._records.pop(voice_id, None)
        if record.get("uri"):
            await asyncio.to_thread(self.store.delete, record["uri"])
        return True

    async def manifest(self, voice_id: str) -> dict | None:
        if voice_id in self.builtin:
            return {}
        record = await self.record(voice_id)
        if record is None or record.get("status") != "ready":
            return None
        return json.loads(record.get("manifest") or "{}")


def _record_voice(record: dict[str, str]) -> Voice:
    """The voice a registry record describes (a gateway needs no adapter files)."""
    return Voice(
        record["voice_id"],
        record["name"],
        record["prompt_style"],  # type: ignore[arg-type]
        None,
        record["checksum"],
        record.get("tenant") or None,
    )
