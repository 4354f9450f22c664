"""A cluster's lexicons: the files in the shared store (``<shared>/lexicons/``, the truth, as
``voicehost.tenancy.lexicons.FolderLexicons`` writes them) with Redis in front (one hash per tenant,
``vh:lexicons:<tenant>``: name -> document), read by every worker for each request.

A put or delete first drops the Redis copy (so, with Redis away, nothing changes: 503), then
writes or removes the file, then writes the new copy (or drops one a read put back meanwhile); a
read that finds no copy (Redis lost its data) reads the file and puts it back; while Redis is
away, reads go to the files.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from voicehost.cluster.state import lexicons_key
from voicehost.config import Settings
from voicehost.ids import now_iso
from voicehost.model.languages import DEFAULT_LANGUAGE
from voicehost.tenancy.lexicons import FolderLexicons, LexiconLimits, StoredLexicon, parse_stored
from voicehost.text.lexicon import LexiconEntry

log = logging.getLogger(__name__)


class RedisLexicons:
    """``LexiconStore`` over the shared store's files, with Redis as every process's copy."""

    def __init__(self, redis: Redis, files: FolderLexicons) -> None:
        self.redis = redis
        self.files = files
        self.limits: LexiconLimits = files.limits

    async def get(self, tenant: str | None, name: str) -> StoredLexicon | None:
        key = lexicons_key(tenant)
        try:
            document = await self.redis.hget(key, name)
        except RedisError as exc:
            log.debug("lexicon %s read from the shared store, Redis is away: %s", name, exc)
            return await self.files.get(tenant, name)
        if document is None:
            document = await asyncio.to_thread(self.files.read, tenant, name)
            if document is None:
                return None
            try:
                await self.redis.hsetnx(key, name, document)  # Redis lost it: put it back
            except RedisError:
                pass
        return parse_stored(document)

    async def put(
        self,
        tenant: str | None,
        name: str,
        entries: list[LexiconEntry],
        language: str = DEFAULT_LANGUAGE,
    ) -> bool:
        lexicon = StoredLexicon(name, tuple(entries), now_iso(), language)
        key = lexicons_key(tenant)
        await self.redis.hdel(key, name)  # no process reads the old copy once the file changes
        new = await asyncio.to_thread(self.files.write, tenant, lexicon)
        await self.redis.hset(key, name, lexicon.document())
        return new

    async def delete(self, tenant: str | None, name: str) -> bool:
        key = lexicons_key(tenant)
        copied = await self.redis.hdel(key, name)  # with Redis away: 503, nothing deleted
        removed = await asyncio.to_thread(self.files.remove, tenant, name)
        await self.redis.hdel(key, name)  # a read may have put it back meanwhile
        return removed or bool(copied)

    async def list(self, tenant: str | None) -> list[StoredLexicon]:
        return await self.files.list(tenant)


def shared_lexicons(redis: Redis, settings: Settings) -> RedisLexicons:
    """The cluster's lexicons, the same on every worker and gateway."""
    return RedisLexicons(
        redis,
        FolderLexicons(settings.shared_dir / "lexicons", LexiconLimits.from_settings(settings)),
    )
