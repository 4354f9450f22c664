"""A clone job's lease: two runners over one jobs folder (as a cluster's workers share one on
the shared store), with a short lease. Who may run a job, what a caller sees when its runner
stops, and that a runner that lost its job writes nothing of it. (The training itself, a
runner killed mid-training and Redis losing the queue: tests/cluster/test_cluster.py's clone.)"""

import asyncio
import json
from pathlib import Path

import pytest
from helpers import job_spec, no_directory

from lora_training.worker import write_progress
from voicehost.cloning.jobs import CloneJobs
from voicehost.ids import parse_iso

pytestmark = pytest.mark.unit

LEASE = 0.6


def runner(root: Path, name: str) -> CloneJobs:
    return CloneJobs(root, on_voice_ready=no_directory, runner_id=name, lease_seconds=LEASE)


async def queued(jobs: CloneJobs, dev_model) -> str:
    job_id, _ = jobs.new_job_dir()
    await jobs.submit(job_id, job_spec(jobs.root, job_id, dev_model))
    return job_id


async def lapse() -> None:
    await asyncio.sleep(LEASE + 0.1)


async def test_a_job_is_one_runners_until_its_lease_lapses_then_the_next_takes_it_over(
    tmp_path, dev_model
):
    a, b = runner(tmp_path, "a"), runner(tmp_path, "b")
    job_id = await queued(a, dev_model)
    assert a.orphans() == b.orphans() == [job_id]
    assert a._claim(job_id) is not None and a._stage(job_id, "preparing")
    assert b._claim(job_id) is None  # a holds it
    assert b.orphans() == [] and a.orphans() == [job_id]  # a's own, after a restart
    seen = b.get(job_id)
    assert (seen.status, seen.runner, seen.runners_lost) == ("preparing", "a", [])
    assert b.is_running(job_id)
    for _ in range(3):  # renewed: a keeps it past the first lease
        await asyncio.sleep(LEASE / 3)
        assert a._renew(job_id)
    assert b._claim(job_id) is None
    await lapse()  # a stops renewing (it died, or stalled)
    seen = b.get(job_id)
    assert (seen.status, seen.runner, seen.stage) == ("runner_lost", "a", "preparing")
    assert not b.is_running(job_id) and b.orphans() == [job_id]
    taken = b._claim(job_id)
    assert taken is not None and taken.runners_lost == ["a"]
    seen = a.get(job_id)
    assert (seen.status, seen.runner, seen.runners_lost) == ("preparing", "b", ["a"])
    assert not a._renew(job_id)  # a, waking up, learns it is no longer its job


async def test_only_the_leases_holder_ends_a_job(tmp_path, dev_model):
    """A runner that lost its job (stalled past its lease) writes no end and no stage; the
    holder's end is written once; the lease is given up after it."""
    a, b = runner(tmp_path, "a"), runner(tmp_path, "b")
    job_id = await queued(a, dev_model)
    a._claim(job_id)
    a._stage(job_id, "training")
    await lapse()
    b._claim(job_id)
    assert not a._finish(job_id, "failed", "a's worker was stopped")
    assert not a._stage(job_id, "evaluating")
    assert b.get(job_id).status == "training"
    assert b._finish(job_id, "done")
    assert b.get(job_id).runner is None  # ended: nobody's run, even before the lease is gone
    assert not b._finish(job_id, "failed", "a second end")  # done is done
    a._let_go(job_id)  # not a's to give up
    assert b.lease(job_id).runner == "b"
    b._let_go(job_id)
    job = a.get(job_id)
    assert (job.status, job.runner, job.error) == ("done", None, None)
    assert b.lease(job_id) is None and not b.is_running(job_id) and a.orphans() == []


async def test_a_queued_job_or_one_whose_runner_was_lost_can_be_retried(tmp_path, dev_model):
    """Nobody runs it: retry queues it again (the queue entry may have been lost with Redis);
    one whose runner holds it is refused, as a finished one is."""
    a, b = runner(tmp_path, "a"), runner(tmp_path, "b")
    job_id = await queued(a, dev_model)
    assert (await b.retry(job_id)).status == "queued"
    a._claim(job_id)
    a._stage(job_id, "training")
    assert (await b.retry(job_id)).status == "training"  # a runs it: not retried
    await lapse()
    retried = await b.retry(job_id)
    assert retried.status == "queued" and retried.runner is None
    assert retried.runners_lost == ["a"]  # every runner that stopped, through a retry
    assert b.orphans() == [job_id]
    taken = b._claim(job_id)
    assert taken is not None and taken.runners_lost == ["a"]
    assert a.get(job_id).runners_lost == ["a"]
    assert b._stage(job_id, "training") and b._finish(job_id, "done")
    assert (await b.retry(job_id)).status == "done"


async def test_a_lease_file_that_cannot_be_read_is_no_lease(tmp_path, dev_model):
    a = runner(tmp_path, "a")
    job_id = await queued(a, dev_model)
    a._claim(job_id)
    (tmp_path / job_id / "lease.json").write_text(json.dumps({"runner": "a"}))  # no expiry
    assert a.lease(job_id) is None and a.get(job_id).status == "queued"
    assert runner(tmp_path, "b")._claim(job_id) is not None


async def test_a_retry_takes_the_job_from_a_runner_that_only_stalled(tmp_path, dev_model):
    """Its runner_lost job retried, a runner that was only stalled wakes to find it is not its
    own: it can neither renew nor end it, and the job waits, queued, for whoever takes it."""
    a, b = runner(tmp_path, "a"), runner(tmp_path, "b")
    job_id = await queued(a, dev_model)
    a._claim(job_id)
    a._stage(job_id, "training")
    await lapse()
    assert (await b.retry(job_id)).status == "queued"
    assert not a._renew(job_id) and not a._finish(job_id, "done")
    assert b.get(job_id).status == "queued" and b.orphans() == [job_id]


async def test_a_job_from_a_newer_version_is_still_read(tmp_path, dev_model):
    """A field a later version adds to job.json is left out, not a job that vanished."""
    a = runner(tmp_path, "a")
    job_id = await queued(a, dev_model)
    path = tmp_path / job_id / "job.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "a_later_field": 1}))
    assert a.get(job_id).status == "queued"


async def test_a_job_is_stored_with_iso_times_and_one_stored_in_unix_seconds_reads_as_iso(
    tmp_path, dev_model
):
    a = runner(tmp_path, "a")
    first, second = await queued(a, dev_model), await queued(a, dev_model)
    path = tmp_path / first / "job.json"
    stored = json.loads(path.read_text())
    assert stored["created"].endswith("+00:00") and stored["updated"].endswith("+00:00")
    assert parse_iso(stored["created"]) <= parse_iso(stored["updated"])
    assert parse_iso(stored["created"]) <= parse_iso(a.get(second).created)
    # the first job as an older version wrote it: Unix seconds
    path.write_text(json.dumps({**stored, "created": 1733061791.5, "updated": 1733061792.0}))
    job = a.get(first)
    assert (job.created, job.updated) == (
        "2024-12-01T14:03:11.500000+00:00",
        "2024-12-01T14:03:12.000000+00:00",
    )
    assert [j.id for j in a.jobs()] == [first, second]  # still oldest first
    later = 4102444800.0  # 2100: now the newer of the two
    path.write_text(json.dumps({**stored, "created": later, "updated": later}))
    assert [j.id for j in a.jobs()] == [second, first]
    assert a._claim(first) is not None  # saved: created as it was, updated now, both ISO
    saved = json.loads(path.read_text())
    assert saved["created"] == "2100-01-01T00:00:00.000000+00:00"
    assert parse_iso(saved["updated"]) >= parse_iso(stored["updated"])


async def test_a_cancelled_job_keeps_what_its_runner_had_reported(tmp_path, dev_model):
    """A cancel ends the job where it stood: the data report, stage, progress and eval loss its
    runner had written stay on the record (a cancel read job.json alone, and they read null)."""
    jobs = runner(tmp_path, "a")
    job_id = await queued(jobs, dev_model)
    assert jobs._claim(job_id) is not None and jobs._stage(job_id, "preparing")
    data = {"speech_seconds": 41.5, "clips": 16}
    write_progress(jobs._dir(job_id), "training", 0.4, [3.5, 3.2], data)  # as its worker does
    seen = jobs.get(job_id)
    assert (seen.status, seen.data) == ("training", data)
    cancelled = await jobs.cancel(job_id)
    for job in (cancelled, jobs.get(job_id), runner(tmp_path, "b").get(job_id)):
        assert job is not None and (job.status, job.error) == ("cancelled", "cancelled by request")
        reported = (job.stage, job.progress, job.eval_loss, job.data)
        assert reported == ("training", 0.4, [3.5, 3.2], data)
