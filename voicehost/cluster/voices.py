"""The voice directory of a cluster: records in Redis, adapter files in the shared store.

A record (``vh:voice:<id>``) holds the adapter's URI and checksum, owner, tenant, version and
status (``publishing`` while it is claimed, then ``ready`` or ``held`` as its ``voice.json``
says; the record's status is the one that counts, since a worker's cached copy of the files may
predate a publish). It is the live version's: each version has a record of its own
(``vh:voice:<id>@<n>``), and promoting one copies its fields into the voice's record in one
script, so every gateway and worker, which read the record per request, speak the new live
version from their next request on; ``newest`` counts the versions.
Workers fetch the adapter into their local cache; gateways read it in the shared store. Both
validate it (once per checksum) before they use it, so a broken adapter is refused alike (422).
While Redis is down, records seen before still resolve.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.cluster.adapters import (
    AdapterCache,
    AdapterFetchError,
    AdapterStore,
    Owner,
    StoredVoice,
)
from voicehost.cluster.state import (
    REGISTRY_WHOLE,
    VOICES,
    raise_if_cancelled,
    version_key,
    voice_key,
)
from voicehost.ids import now_iso, split_voice_ref, voice_ref
from voicehost.voices import versioning
from voicehost.voices.validation import (
    MANIFEST,
    VERSION,
    AdapterRules,
    InvalidAdapter,
    ServedModels,
    read_json_object,
    validate_adapter,
    voice_status,
    write_manifest,
)
from voicehost.voices.voice import (
    BrokenAdapter,
    LiveVersion,
    NotHeld,
    RegistryIncomplete,
    RegistryRebuilding,
    UnusableVersion,
    Voice,
    VoiceStatus,
    VoiceVersion,
)

log = logging.getLogger(__name__)

PUBLISH_CLAIM_SECONDS = 300
CLAIMED = "publishing"  # a record's status from its claim until it is complete
REGISTRY_WHOLE_TTL_SECONDS = 3600  # refreshed by every reconcile (each process, every 2 s)
# A gateway sends the record of the voice it routes with the request, so that a worker that never
# saw it can serve it while Redis is away (believed only with the internal token).
RECORD_HEADER = "X-Voicehost-Voice-Record"
FORWARDED_FIELDS = (
    "voice_id",
    "name",
    "prompt_style",
    "uri",
    "checksum",
    "tenant",
    "status",
    "version",
    "language",
    "base_model",
)
LISTED = ("ready", "held")  # the statuses of a registered voice (not a claim being published)
# Publish a held version (KEYS[1]): its status and manifest change together, once (the status is
# checked in the same step, so of two publishes only one finds it held), and in the voice's
# record (KEYS[2]) too if it is the live one (ARGV[2]). Returns the status it found.
PUBLISH = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'held' then
  redis.call('HSET', KEYS[1], 'status', 'ready', 'manifest', ARGV[1])
  if redis.call('HGET', KEYS[2], 'version') == ARGV[2] then
    redis.call('HSET', KEYS[2], 'status', 'ready', 'manifest', ARGV[1])
  end
end
return status
"""
# The next version number of a voice (KEYS[1]): versioning.next_version of its newest, counted
# in the same step, so two versions added at once get two numbers; -1 if it is not registered.
NEXT_VERSION = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'ready' and status ~= 'held' then return -1 end
local newest = redis.call('HGET', KEYS[1], 'newest') or redis.call('HGET', KEYS[1], 'version')
newest = (tonumber(newest) or 1) + 1
redis.call('HSET', KEYS[1], 'newest', newest)
return newest
"""
# Add a version's record (KEYS[2], fields as JSON in ARGV[1]) to a registered voice (KEYS[1]),
# and with ARGV[2] == '1' make it live in the same step.
ADD_VERSION = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'ready' and status ~= 'held' then return 'missing' end
local fields = cjson.decode(ARGV[1])
for name, value in pairs(fields) do redis.call('HSET', KEYS[2], name, value) end
if ARGV[2] == '1' then
  for name, value in pairs(fields) do redis.call('HSET', KEYS[1], name, value) end
end
return 'ok'
"""
# Promote a version (KEYS[2]): its fields become the voice's record (KEYS[1]), at once.
PROMOTE = """
local status = redis.call('HGET', KEYS[2], 'status')
if status ~= 'ready' and status ~= 'held' then return 'missing' end
if status == 'held' then return 'held' end
local current = redis.call('HGET', KEYS[1], 'status')
if current ~= 'ready' and current ~= 'held' then return 'missing' end
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do redis.call('HSET', KEYS[1], fields[i], fields[i + 1]) end
return 'ok'
"""
# Delete a version's record (KEYS[2]) unless it is the live one (ARGV[1]) of KEYS[1].
DELETE_VERSION = """
if redis.call('HGET', KEYS[1], 'version') == ARGV[1] then return 'live' end
return redis.call('DEL', KEYS[2])
"""


class RedisVoiceDirectory:
    """``VoiceDirectory`` over Redis records and an ``AdapterStore`` (with a cache on workers)."""

    def __init__(
        self,
        redis: Redis,
        store: AdapterStore,
        builtin: Mapping[str, str] | Iterable[str],
        rules: AdapterRules,
        cache: AdapterCache | None = None,
        owner: str = "local",
    ) -> None:
        self.redis = redis
        self.store = store
        self.cache = cache
        # the models whose adapters this process checks: its own, and a gateway's workers'
        self.models = ServedModels(rules)
        self.owner = owner
        self.builtin = versioning.builtin_voices(builtin, rules.base_model)
        self._records: dict[str, dict[str, str]] = {}  # last seen, for when Redis is down
        self._ready: dict[tuple[str, str], Voice] = {}  # (voice_id, checksum) -> validated voice
        self._broken: dict[str, str] = {}
        self._fetching: dict[tuple[str, str], asyncio.Lock] = {}
        self._missing = 0  # voices in the store without a record, at the last reconcile
        self._lost_seen: set[str] = set()  # and those found so since (by ``find``)
        self._unrestorable: set[str] = set()  # those the last reconcile could not restore
        self._publish = redis.register_script(PUBLISH)
        self._next_version = redis.register_script(NEXT_VERSION)
        self._add_version = redis.register_script(ADD_VERSION)
        self._promote = redis.register_script(PROMOTE)
        self._delete_version = redis.register_script(DELETE_VERSION)

    async def record(self, voice_id: str, version: int | None = None) -> dict[str, str] | None:
        """The voice's record (its live version's), or ``version``'s; while Redis is
        unreachable, the last one seen (or the error)."""
        ref = voice_ref(voice_id, version)
        try:
            if version is None:
                record = await self.redis.hgetall(voice_key(voice_id))
            else:
                record = await self._version_record(voice_id, version)
        except RedisError:
            if ref in self._records:
                return self._records[ref]
            raise
        if record:
            self._records[ref] = record
        else:
            self._records.pop(ref, None)
        return record or None

    async def _version_record(self, voice_id: str, version: int) -> dict[str, str]:
        """A version's record; for a voice registered before versions had records of their
        own, its record is version 1's."""
        record = await self.redis.hgetall(version_key(voice_id, version))
        if not record:
            main = await self.redis.hgetall(voice_key(voice_id))
            if main and main.get("version", "1") == str(version) and "newest" not in main:
                return main
        return record

    def forwarded_record(self, ref: str) -> str | None:
        """The header value carrying the last record seen of ``ref`` (``anna`` or
        ``anna@2``; a gateway's)."""
        record = self._records.get(ref)
        if record is None:
            return None
        fields = {k: record[k] for k in FORWARDED_FIELDS if k in record}
        fields["ref"] = ref
        return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()

    def offer(self, header: str) -> None:
        """Keep a gateway's copy of a record (``forwarded_record``) for when Redis is away; a
        record read from Redis replaces it. A malformed one is ignored."""
        try:
            record = json.loads(base64.urlsafe_b64decode(header.encode()))
            voice_id, ref = record["voice_id"], record.get("ref", record["voice_id"])
            if not isinstance(ref, str) or not all(
                isinstance(record.get(k), str) for k in FORWARDED_FIELDS
            ):
                return
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if split_voice_ref(ref)[0] != voice_id:
            return
        self._records.setdefault(ref, {k: record[k] for k in FORWARDED_FIELDS})

    def learn_builtin(self, voices: Mapping[str, str], base_model: str) -> list[Voice]:
        """Add the built-in voices of ``base_model`` (``{name: language}``, a worker's record's)
        that no voice of this directory's own is named; the ones added."""
        added = [
            voice
            for name, voice in versioning.builtin_voices(voices, base_model).items()
            if name not in self.builtin
        ]
        self.builtin.update((voice.voice_id, voice) for voice in added)
        return added

    def _validate(self, folder: Path, voice_id: str | None = None) -> Voice:
        """``validate_adapter`` by the rules of the base model the adapter declares."""
        return validate_adapter(folder, self.models.for_adapter(folder), voice_id)

    async def find(self, voice_id: str, version: int | None = None) -> Voice | None:
        if voice_id in self.builtin:
            return versioning.builtin_version(self.builtin[voice_id], version)
        ref = voice_ref(voice_id, version)
        record = await self._found_record(voice_id, version)
        if record is None or record.get("status") not in LISTED:
            return None
        status = record["status"]
        number = int(record.get("version") or 1)
        key = (voice_id, record["checksum"])
        known = self._ready.get(key)
        if (
            self.cache is None
            and known is not None
            and known.status == status
            and known.version == number
        ):
            return known  # a gateway: the store's files, validated
        async with self._fetching.setdefault(key, asyncio.Lock()):  # one download per adapter
            try:
                folder = await asyncio.to_thread(self._adapter_folder, voice_id, record)
                voice = self._ready.get(key)
                if voice is None or voice.adapter_path != folder:
                    voice = await asyncio.to_thread(self._validate, folder, voice_id)
                    if voice.checksum != record["checksum"]:
                        raise AdapterFetchError(
                            f"adapter {voice_id!r} has checksum {voice.checksum}, "
                            f"the record says {record['checksum']}"
                        )
            except (AdapterFetchError, InvalidAdapter) as exc:
                self._broken[ref] = str(exc)
                log.error("voice %s is unusable here: %s", ref, exc)
                return None
        # the model its record says it was published for (a record from before models: any)
        model = record.get("base_model", "")
        if voice.status != status or voice.version != number or voice.base_model != model:
            voice = replace(voice, status=status, version=number, base_model=model)  # type: ignore[arg-type]
        self._broken.pop(ref, None)
        self._ready[key] = voice
        return voice

    def _adapter_folder(self, voice_id: str, record: dict[str, str]) -> Path:
        """Where this process reads the adapter: a worker's verified local copy (every use goes
        through the cache: it marks the adapter used, and fetches it again if it was evicted),
        or, on a gateway, the shared store's files in place."""
        if self.cache is None:
            return self.store.folder(record["uri"])
        return self.cache.fetch(record["uri"], record["checksum"], voice_id)

    def broken(self, voice_id: str, version: int | None = None) -> str | None:
        return self._broken.get(voice_ref(voice_id, version))

    def loaded(self) -> int:
        """Adapters fetched and validated by this process."""
        return len(self._ready)

    async def list_voices(self) -> tuple[list[Voice], list[BrokenAdapter]]:
        if not await self.redis.exists(REGISTRY_WHOLE):
            raise RegistryIncomplete()
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
        voice = await asyncio.to_thread(self._validate, folder)
        if voice_id in self.builtin or not await self._claim(voice_id):
            raise versioning.voice_exists(voice_id)
        try:
            await asyncio.to_thread(_set_manifest, folder, {VERSION: 1})
            checksum = voice.checksum or ""
            uri = await asyncio.to_thread(self.store.publish, folder, voice_id, checksum)
            # live from now, in the store's copy (not the caller's folder: a dev voice's is the
            # dev model's own), so it reads retired, not candidate, once replaced
            manifest = await asyncio.to_thread(_first_version, self.store.folder(uri))
            await self._complete([(voice, uri, manifest)], uri)
        except BaseException:
            with suppress(RedisError):  # otherwise the claim expires by itself
                await self.redis.delete(voice_key(voice_id))
            raise
        return voice

    async def _claim(self, voice_id: str) -> bool:
        """Claim the voice's record (``publishing``); ``False`` if it exists. The claim expires
        if this process dies before ``_complete``."""
        if not await self.redis.hsetnx(voice_key(voice_id), "status", CLAIMED):
            return False
        await self.redis.expire(voice_key(voice_id), PUBLISH_CLAIM_SECONDS)
        return True

    def _fields(self, voice: Voice, uri: str, manifest: str) -> dict[str, str]:
        """The record of one version of ``voice``, published at ``uri``."""
        return {
            "voice_id": voice.voice_id,
            "name": voice.name,
            "prompt_style": voice.prompt_style,
            "uri": uri,
            "checksum": voice.checksum or "",
            "owner": self.owner,
            "tenant": voice.tenant or "",  # "": shared with every tenant
            "version": str(json.loads(manifest).get(VERSION, 1)),
            "created": now_iso(),
            "manifest": manifest,
            "status": voice.status,  # its voice.json's: a held clone stays held in the cluster
            "language": voice.language,
            "base_model": voice.base_model,
        }

    async def _complete(self, versions: list[tuple[Voice, str, str]], live: str) -> None:
        """Write the claimed record of a voice, each of its ``versions`` (the voice, its URI,
        its manifest) and which is live (by URI), and list it."""
        records = [self._fields(*entry) for entry in versions]
        (main,) = [r for r in records if r["uri"] == live]
        voice_id = main["voice_id"]
        newest = max(int(r["version"]) for r in records)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(voice_key(voice_id), mapping={**main, "newest": str(newest)})
            pipe.persist(voice_key(voice_id))
            for record in records:
                pipe.hset(version_key(voice_id, int(record["version"])), mapping=record)
            pipe.sadd(VOICES, voice_id)
            await pipe.execute()

    # --- versions ----------------------------------------------------------------------------

    async def _registered(self, voice_id: str) -> dict[str, str]:
        """The voice's record: ``ReadOnlyVoice`` for a built-in voice, ``NoSuchVersion`` if it
        is not registered."""
        if voice_id in self.builtin:
            raise versioning.builtin_voice(voice_id)
        record = await self.redis.hgetall(voice_key(voice_id))
        if not record or record.get("status") not in LISTED:
            raise versioning.no_such_voice(voice_id)
        return record

    async def _version_records(self, voice_id: str, main: dict[str, str]) -> dict[int, dict]:
        live = int(main.get("version") or 1)
        newest = versioning.newest_version(
            live, int(main["newest"]) if main.get("newest") else None
        )
        async with self.redis.pipeline(transaction=False) as pipe:
            for number in range(1, newest + 1):
                pipe.hgetall(version_key(voice_id, number))
            found = await pipe.execute()
        records = {n: r for n, r in enumerate(found, start=1) if r}
        if live not in records:  # registered before versions had records of their own
            records[live] = main
        return records

    async def add_version(self, voice_id: str, folder: Path, promote: bool) -> Voice:
        staged = await asyncio.to_thread(self._validate, folder, voice_id)
        main = await self._registered(voice_id)
        existing = await self._version_records(voice_id, main)
        versioning.refuse_duplicate(
            voice_id, staged.checksum, [r.get("checksum") for r in existing.values()]
        )
        number = int(await self._next_version(keys=[voice_key(voice_id)]))
        if number < 0:
            raise versioning.no_such_voice(voice_id)
        tenant = main.get("tenant") or None
        staged_manifest = await asyncio.to_thread(_manifest_of, folder)
        manifest, promote = versioning.new_version_manifest(
            staged_manifest, number, tenant, promote
        )
        await asyncio.to_thread(write_manifest, folder, manifest)
        voice = replace(staged, tenant=tenant, version=number, status=voice_status(manifest))
        uri = await asyncio.to_thread(self.store.publish, folder, voice_id, voice.checksum or "")
        fields = self._fields(voice, uri, await asyncio.to_thread(_manifest_text, folder))
        result = await self._add_version(
            keys=[voice_key(voice_id), version_key(voice_id, number)],
            args=[json.dumps(fields), "1" if promote else "0"],
        )
        if result != "ok":  # deleted meanwhile
            await asyncio.to_thread(self.store.delete, uri)
            raise versioning.no_such_voice(voice_id)
        if promote:
            await asyncio.to_thread(self.store.set_live, uri)
        return voice

    async def promote(self, voice_id: str, version: int) -> Voice:
        main = await self._registered(voice_id)
        record = (await self._version_records(voice_id, main)).get(version)
        versioning.check_promotable(voice_id, version, None if record is None else _gate(record))
        assert record is not None
        promoted = versioning.first_promotion(json.loads(record.get("manifest") or "{}"))
        if promoted is not None:
            await self.redis.hset(version_key(voice_id, version), "manifest", json.dumps(promoted))
            await asyncio.to_thread(self.store.write_manifest, record["uri"], promoted)
        if record is not main:
            result = await self._promote(keys=[voice_key(voice_id), version_key(voice_id, version)])
            if result != "ok":  # held, or deleted, meanwhile: raises
                versioning.check_promotable(voice_id, version, "held" if result == "held" else None)
        await asyncio.to_thread(self.store.set_live, record["uri"])
        voice = await self.find(voice_id, version)
        if voice is None:
            broken = self.broken(voice_id, version) or "the adapter is unusable"
            raise UnusableVersion(f"version {version}: {broken}")
        return voice

    async def remove_version(self, voice_id: str, version: int) -> bool:
        main = await self._registered(voice_id)
        records = await self._version_records(voice_id, main)  # the live one always among them
        if not versioning.removable(
            voice_id, version, int(main.get("version") or 1), version in records
        ):
            return False
        record = records[version]
        # the store's copy first: a reconciler never finds a deleted version's files
        await asyncio.to_thread(self.store.delete, record["uri"])
        result = await self._delete_version(
            keys=[voice_key(voice_id), version_key(voice_id, version)], args=[str(version)]
        )
        if result == "live":
            raise LiveVersion(f"version {version} of {voice_id!r} was promoted meanwhile")
        self._records.pop(voice_ref(voice_id, version), None)
        return True

    async def versions(self, voice_id: str) -> list[VoiceVersion] | None:
        if voice_id in self.builtin:
            return versioning.builtin_versions()
        main = await self.record(voice_id)
        if main is None or main.get("status") not in LISTED:
            return None
        live = int(main.get("version") or 1)
        listed = []
        for number, record in sorted((await self._version_records(voice_id, main)).items()):
            if record.get("status") not in LISTED:
                continue
            listed.append(
                versioning.listed_version(
                    number,
                    _gate(record),
                    live,
                    record.get("checksum"),
                    json.loads(record.get("manifest") or "{}"),
                    self._broken.get(voice_ref(voice_id, number)),
                )
            )
        return listed

    async def remove(self, voice_id: str) -> bool:
        """Delete the store's copy first, then the record: a reconciler never finds a deleted
        voice's files to bring it back (a crash between leaves a record of missing files, which
        is unusable, and deleted again by a retry)."""
        if voice_id in self.builtin:
            raise versioning.builtin_voice(voice_id)
        record = await self.redis.hgetall(voice_key(voice_id))
        if not record:
            return False
        versions = await self._version_records(voice_id, record)
        for uri in {r["uri"] for r in versions.values() if r.get("uri")} | (
            {record["uri"]} if record.get("uri") else set()
        ):
            await asyncio.to_thread(self.store.delete, uri)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(voice_key(voice_id), *(version_key(voice_id, n) for n in versions))
            pipe.srem(VOICES, voice_id)
            await pipe.execute()
        for ref in [r for r in self._records if split_voice_ref(r)[0] == voice_id]:
            self._records.pop(ref, None)
        return True

    # --- Redis is a cache of the store: rebuilding what it lost ---------------------------------

    def missing(self) -> int:
        return max(self._missing, len(self._lost_seen))

    async def health(self) -> dict[str, object]:
        try:
            whole = bool(await self.redis.exists(REGISTRY_WHOLE))
        except RedisError:
            return {"registry": "unknown", "redis": "unavailable"}
        if whole:
            return {"registry": "whole", "redis": "up"}
        return {"registry": "rebuilding", "missing_voices": self.missing(), "redis": "up"}

    async def _found_record(self, voice_id: str, version: int | None) -> dict[str, str] | None:
        """The voice's record; ``RegistryRebuilding`` while Redis has lost it and the store
        holds it. A record the reconciler restored between the read and the check is read
        again: that voice was never "not found"."""
        record = await self.record(voice_id, version)
        claimed = record is not None and record.get("status") == CLAIMED
        if record is None or claimed:  # a claim: a reconcile may be restoring it right now
            owner = await self._lost(voice_id, claimed)
            if owner is None:  # restored meanwhile, or claimed meanwhile: read it again
                record = await self.record(voice_id, version)
                if record is not None and record.get("status") == CLAIMED:
                    owner = await self._lost(voice_id, claimed=True)
            if owner is not None:
                raise RegistryRebuilding(voice_id, owner.tenant, owner.held)
        return record

    async def _lost(self, voice_id: str, claimed: bool = False) -> Owner | None:
        """Whose ``voice_id`` is, if it has no record (or only a claim on one: ``claimed``)
        but the store holds it (deleting a voice removes its files first): Redis lost it, the
        next reconcile restores it (or is restoring it). Noted for ``missing``, so health says
        so at once. One a reconcile could not restore (its files are broken) is not waited
        for: it is missing, not coming."""
        if voice_id in self._unrestorable:
            return None
        if not claimed and await self.redis.exists(voice_key(voice_id)):
            return None
        owner = await asyncio.to_thread(self.store.owner, voice_id)
        if owner is not None:
            self._lost_seen.add(voice_id)
        return owner

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
        self._lost_seen = set()
        self._unrestorable = set(left)
        if not left:  # what the store holds is recorded: lists and health may say so
            await self.redis.set(REGISTRY_WHOLE, self.owner, ex=REGISTRY_WHOLE_TTL_SECONDS)
        return len(left)

    async def _restore(self, voice_id: str, stored: StoredVoice) -> bool:
        """Rebuild one voice's records (each version's, and which is live) from the store;
        ``False`` if its live version cannot be."""
        versions: list[tuple[Voice, str, str]] = []
        for uri in stored.adapters:
            try:
                folder = self.store.folder(uri)
                if uri == stored.live and not await asyncio.to_thread(self.models.serves, folder):
                    log.info(
                        "voice %s is another model's: a process serving it restores it", voice_id
                    )
                    return True  # not missing here: this process could never speak it
                voice = await asyncio.to_thread(self._validate, folder, voice_id)
                manifest = await asyncio.to_thread(_manifest_text, folder)
            except (AdapterFetchError, InvalidAdapter, OSError) as exc:
                log.warning("voice %s in the store (%s) cannot be restored: %s", voice_id, uri, exc)
                if uri == stored.live:
                    return False
                continue
            versions.append((voice, uri, manifest))
        if not await self._claim(voice_id):
            return True  # restored by another process, or registered meanwhile
        try:
            await self._complete(versions, stored.live)
        except BaseException:
            with suppress(RedisError):
                await self.redis.delete(voice_key(voice_id))
            raise
        if not await asyncio.to_thread(self.store.folder(stored.live).is_dir):
            await self.remove(voice_id)  # deleted while it was restored
            return True
        log.info(
            "voice %s restored from the shared store (tenant %s)", voice_id, versions[0][0].tenant
        )
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

    async def manifest(self, voice_id: str, version: int | None = None) -> dict | None:
        if voice_id in self.builtin:
            return {} if versioning.builtin_version(self.builtin[voice_id], version) else None
        record = await self._found_record(voice_id, version)
        if record is None or record.get("status") not in LISTED:
            return None
        return json.loads(record.get("manifest") or "{}")

    async def publish(
        self, voice_id: str, published: dict[str, object], version: int | None = None
    ) -> Voice | None:
        """The records first (what every process reads), then the store's ``voice.json`` (what
        a rebuild of the record reads): a crash between leaves the store saying held, so a
        lost record comes back held, never wrongly ready."""
        if voice_id in self.builtin:
            raise versioning.builtin_voice(voice_id, NotHeld)
        main = await self.redis.hgetall(voice_key(voice_id))
        if not main or main.get("status") not in LISTED:
            return None
        number = int(main.get("version") or 1) if version is None else version
        record = (await self._version_records(voice_id, main)).get(number)
        if record is None or record.get("status") not in LISTED:
            return None
        versioning.check_publishable(voice_id, record["status"])
        manifest = versioning.published_manifest(
            json.loads(record.get("manifest") or "{}"), published
        )
        key = version_key(voice_id, number) if record is not main else voice_key(voice_id)
        found = await self._publish(
            keys=[key, voice_key(voice_id)], args=[json.dumps(manifest), str(number)]
        )
        if found not in LISTED:
            return None  # deleted meanwhile
        versioning.check_publishable(voice_id, found)
        await asyncio.to_thread(self.store.write_manifest, record["uri"], manifest)
        return await self.find(voice_id, number)


def _manifest_text(folder: Path) -> str:
    path = folder / MANIFEST
    return path.read_text() if path.exists() else "{}"


def _manifest_of(folder: Path) -> dict:
    path = folder / MANIFEST
    return read_json_object(path) if path.exists() else {}


def _set_manifest(folder: Path, values: dict[str, object]) -> None:
    write_manifest(folder, {**_manifest_of(folder), **values})


def _first_version(folder: Path) -> str:
    """A new voice's published ``voice.json``, made version 1 and live from now (so it reads
    ``retired``, not ``candidate``, once another version replaces it), as a voice folder's
    first version; returns its text."""
    manifest = {**_manifest_of(folder), VERSION: 1}
    write_manifest(folder, versioning.first_promotion(manifest) or manifest)
    return _manifest_text(folder)


def _gate(record: dict[str, str]) -> VoiceStatus:
    """A listed record's gate status (``LISTED``: ready or held)."""
    return "held" if record.get("status") == "held" else "ready"


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
        int(record.get("version") or 1),
        record.get("language") or "en",  # a record from before languages: English
        record.get("base_model") or "",  # "": any worker's (a record from before models)
    )
