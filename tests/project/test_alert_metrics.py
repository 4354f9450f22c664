"""The metrics the alert rules (deploy/monitoring/) watch move when their event happens: a clone
job's run ends or is taken over from a lapsed lease, an audit append finds its chain broken, a
usage flush fails, a worker leaves a gateway's ring without leaving, a process starts."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers import job_spec, no_directory
from prometheus_client import CollectorRegistry

from voicehost.cloning.jobs import CloneJobs
from voicehost.cluster.audit import RedisAuditTrail
from voicehost.cluster.state import Membership, WorkerPresence, connect, member_key
from voicehost.config import Settings
from voicehost.metrics import RingMetrics, SpeechMetrics
from voicehost.speech.admission import WorkerLoad
from voicehost.tenancy.audit import OPERATOR, AuditLog, Change, FileAuditTrail, verify
from voicehost.tenancy.usage import FileUsageStore, UsageKey, UsageLedger

LEASE = 0.6


def value(metrics: SpeechMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def events(count: int, first: int = 0) -> list[Change]:
    return [Change("job.failed", OPERATOR, job=f"job-{i}") for i in range(first, first + count)]


@pytest.mark.unit
async def test_clone_job_endings_takeovers_and_lapsed_leases_are_counted(tmp_path, dev_model):
    metrics = SpeechMetrics()
    a = CloneJobs(tmp_path, no_directory, runner_id="a", lease_seconds=LEASE)
    b = CloneJobs(tmp_path, no_directory, runner_id="b", lease_seconds=LEASE, metrics=metrics)
    job_id, _ = a.new_job_dir()
    await a.submit(job_id, job_spec(tmp_path, job_id, dev_model))
    assert value(metrics, "voicehost_clone_jobs_ended_total", status="failed") == 0.0
    assert a._claim(job_id) is not None and a._stage(job_id, "training")
    assert b.runners_lost() == 0  # a holds it
    await asyncio.sleep(LEASE + 0.1)  # a stops renewing
    assert b.runners_lost() == 1
    assert value(metrics, "voicehost_clone_jobs_taken_over_total") == 0.0
    assert b._claim(job_id) is not None
    assert value(metrics, "voicehost_clone_jobs_taken_over_total") == 1.0
    assert b.runners_lost() == 0  # b's lease is live
    assert b._finish(job_id, "failed", "the worker exited with 1")
    await b._record_end(job_id)
    assert value(metrics, "voicehost_clone_jobs_ended_total", status="failed") == 1.0
    assert value(metrics, "voicehost_clone_jobs_ended_total", status="done") == 0.0


@pytest.mark.unit
async def test_an_append_onto_a_damaged_last_line_counts_a_chain_break(tmp_path):
    metrics = SpeechMetrics()
    path = tmp_path / "audit.jsonl"
    trail = FileAuditTrail(path, metrics.audit_chain_breaks)
    await trail.record(events(1)[0])
    assert value(metrics, "voicehost_audit_chain_breaks_total") == 0.0
    whole = path.read_text()
    path.write_text(whole + '{"seq": 2, "prev": "cut sh\n')  # a line cut half-way
    await trail.record(events(1, 1)[0])
    assert value(metrics, "voicehost_audit_chain_breaks_total") == 1.0
    assert path.read_text().endswith("cut sh\n")  # nothing chained onto the damage
    path.write_text(whole)  # repaired: the waiting event goes on
    await trail.record(events(1, 2)[0])
    assert value(metrics, "voicehost_audit_chain_breaks_total") == 1.0
    assert verify(path.read_text().splitlines()).head.seq == 3


async def test_a_mirror_the_streams_lines_do_not_continue_counts_a_chain_break(
    redis_server, tmp_path
):
    """A cluster's mirror edited under its writers: the stream's next lines do not chain to it,
    so catching it up stops, and says so on the metrics."""
    metrics = SpeechMetrics()
    mirror = tmp_path / "audit.jsonl"
    client = connect(Settings(redis_url=redis_server.url))
    trail = RedisAuditTrail(client, mirror, metrics.audit_chain_breaks)
    try:
        for change in events(2):
            await trail.record(change)
        assert value(metrics, "voicehost_audit_chain_breaks_total") == 0.0
        lines = mirror.read_text().splitlines()
        first = json.loads(lines[0])
        first["job"] = "job-edited"
        edited = json.dumps(first, sort_keys=True, separators=(",", ":"))
        mirror.write_text(edited + "\n")  # line 1 edited, line 2 not mirrored yet
        await trail.record(events(1, 2)[0])
        assert value(metrics, "voicehost_audit_chain_breaks_total") == 1.0
        assert AuditLog(mirror).head().seq == 1  # the stream's lines 2 and 3 were not added
    finally:
        await client.aclose()


class FailingStore(FileUsageStore):
    """A usage store that cannot be written until ``up``."""

    up = False

    async def add(self, buckets) -> None:  # type: ignore[no-untyped-def]
        if not self.up:
            raise OSError("the store is away")
        await super().add(buckets)


@pytest.mark.unit
async def test_usage_flushes_are_counted_stored_or_failed(tmp_path):
    metrics = SpeechMetrics()
    store = FailingStore(tmp_path / "usage.jsonl")
    ledger = UsageLedger(store, metrics)
    ledger.add(UsageKey("a", "A", "tara"), 5, 1.0)
    await ledger.flush()
    assert value(metrics, "voicehost_usage_flushes_total", outcome="failed") == 1.0
    assert value(metrics, "voicehost_usage_flushes_total", outcome="stored") == 0.0
    store.up = True
    await ledger.flush()
    assert value(metrics, "voicehost_usage_flushes_total", outcome="stored") == 1.0
    assert (await store.totals(0, None))[UsageKey("a", "A", "tara")].characters == 5


@pytest.mark.unit
def test_a_process_says_when_it_started():
    before = time.time()
    metrics = SpeechMetrics()
    started = value(metrics, "voicehost_start_time_seconds")
    assert started is not None and before <= started <= time.time()


async def test_a_gateway_counts_the_workers_on_its_ring_and_those_gone_without_leaving(
    redis_client, redis_server
):
    """A worker whose heartbeat expired is counted lost; one that drained (left) is not."""
    settings = Settings(redis_url=redis_server.url, worker_ttl_seconds=60)
    registry = CollectorRegistry()
    membership = Membership(redis_client, 0.1)
    ring = RingMetrics(registry, lambda: len(membership.workers))

    async def gone(workers: list[str]) -> None:  # as the gateway counts them
        ring.lost.inc(len(workers))

    membership.on_gone = gone
    presences = {
        name: WorkerPresence(
            redis_client, settings, name, f"http://{name}:8080", lambda: WorkerLoad(0, 0, 4, 4)
        )
        for name in ("w1", "w2", "w3")
    }
    for presence in presences.values():
        await presence.heartbeat()
    await membership.refresh()
    assert registry.get_sample_value("voicehost_ring_workers") == 3.0
    await presences["w1"].leave()  # drained
    await membership.refresh()
    assert registry.get_sample_value("voicehost_ring_workers") == 2.0
    assert registry.get_sample_value("voicehost_ring_workers_lost_total") == 0.0
    await redis_client.delete(member_key("w2"))  # its heartbeat expired
    await membership.refresh()
    assert registry.get_sample_value("voicehost_ring_workers") == 1.0
    assert registry.get_sample_value("voicehost_ring_workers_lost_total") == 1.0
