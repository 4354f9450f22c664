"""A cluster's usage: every worker's counts summed in Redis, per minute.

A worker's ledger (``voicehost.tenancy.usage.UsageLedger``) flushes its buckets about once a second,
in one transaction: ``HINCRBY`` / ``HINCRBYFLOAT`` into ``vh:usage:<minute>`` (fields
``<key>|<tenant>|<voice>|c`` for characters and ``...|s`` for seconds; ids never hold ``|``),
and the minute into the index ``vh:usage:minutes``. Any gateway sums the minutes asked for.
"""

from __future__ import annotations

import time
from collections import defaultdict

from redis.asyncio import Redis

from voicehost.cluster.state import USAGE_MINUTES, usage_key
from voicehost.tenancy.usage import Amount, Buckets, UsageKey, minute_of


class RedisUsageStore:
    """``UsageStore`` over Redis, buckets kept ``retention_days``."""

    def __init__(self, redis: Redis, retention_days: float) -> None:
        self.redis = redis
        self.retention_seconds = int(retention_days * 86400)

    async def add(self, buckets: Buckets) -> None:
        oldest = minute_of(time.time() - self.retention_seconds)
        async with self.redis.pipeline(transaction=True) as pipe:
            for (minute, key), amount in buckets.items():
                bucket = usage_key(minute)
                field = f"{key.key_id}|{key.tenant}|{key.voice}"
                if amount.characters:
                    pipe.hincrby(bucket, f"{field}|c", amount.characters)
                pipe.hincrbyfloat(bucket, f"{field}|s", amount.audio_seconds)
                pipe.expire(bucket, self.retention_seconds)
                pipe.zadd(USAGE_MINUTES, {str(minute): minute})
            pipe.zremrangebyscore(USAGE_MINUTES, 0, oldest - 1)
            pipe.expire(USAGE_MINUTES, self.retention_seconds)
            await pipe.execute()

    async def totals(self, since_minute: int, tenant: str | None) -> dict[UsageKey, Amount]:
        minutes = await self.redis.zrangebyscore(USAGE_MINUTES, since_minute, "+inf")
        async with self.redis.pipeline(transaction=False) as pipe:
            for minute in minutes:
                pipe.hgetall(usage_key(int(minute)))
            buckets = await pipe.execute()
        sums: dict[UsageKey, Amount] = defaultdict(Amount)
        for bucket in buckets:
            for field, value in bucket.items():
                key_id, key_tenant, voice, kind = field.split("|")
                if tenant is not None and key_tenant != tenant:
                    continue
                amount = sums[UsageKey(key_id, key_tenant, voice)]
                if kind == "c":
                    amount.add(int(value), 0.0)
                else:
                    amount.add(0, float(value))
        return dict(sums)
