"""A clone job runs once and finishes, whatever stops around it: Redis losing the job queue,
then kill -9 of the runner mid-training. Real parts: a Redis server of this module's own (the
test flushes it), a shared jobs folder, real training of the dev model, and two runners as
processes of their own (``clone_runner.py``: a worker's queue, registry and audit trail, without
its engine). Not the cluster module's workers: a flush and a kill -9 would take their state with
them in the middle of that module, and a runner without an engine starts in seconds where a
worker's engine takes a minute. (The evaluation stage outlasting the lease is that module's
clone; the lease's rules are test_job_leases'.)"""

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import RedisServer, dev_env, free_port, launch, no_registry, stop
from redis.asyncio import Redis

from voicehost.cloning.intake import CloneRequest, queue_clone
from voicehost.cloning.jobs import FINISHED, CloneJobs
from voicehost.cluster.jobs import RedisJobQueue
from voicehost.config import Settings
from voicehost.tenancy.audit import verify
from voicehost.tools.devcorpus import build_corpus

LEASE = 3.0  # seconds; renewed every second
SLACK = 4.0  # two busy cores
EPOCHS = 4  # a checkpoint after each: the kill lands between two


@pytest.fixture
def fleet(tmp_path, dev_model):
    """Redis, the shared store and two runners, r1 and r2."""
    redis = RedisServer(free_port(), tmp_path)
    redis.start()
    env = dev_env(
        VOICEHOST_DEV="true",
        VOICEHOST_REDIS_URL=redis.url,
        VOICEHOST_SHARED_DIR=str(tmp_path / "shared"),
        VOICEHOST_JOB_LEASE_SECONDS=str(LEASE),
        VOICEHOST_CLONE_EPOCHS=str(EPOCHS),
        VOICEHOST_MIN_SPEECH_SECONDS="10",
    )
    script = str(Path(__file__).with_name("clone_runner.py"))
    runners = {
        name: launch([sys.executable, script], {**env, "VOICEHOST_WORKER_ID": name}, log)
        for name, log in ((n, tmp_path / f"{n}.log") for n in ("r1", "r2"))
    }
    try:
        yield redis, runners, env
    finally:
        for process in runners.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # the test may have paused it
            stop(process)
        redis.stop()


async def test_a_job_whose_runner_dies_after_redis_lost_the_queue_is_taken_over_and_done_once(
    fleet, tmp_path
):
    redis_server, runners, env = fleet
    settings = Settings(
        dev=True,
        dev_dir=Path(env["VOICEHOST_DEV_DIR"]),
        shared_dir=tmp_path / "shared",
        clone_epochs=EPOCHS,
        min_speech_seconds=10,
    )
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    gateway = CloneJobs(
        settings.shared_dir / "jobs", no_registry, RedisJobQueue(redis, "gateway"), "gateway"
    )
    corpus = build_corpus(tmp_path / "corpus", count=10)
    job_id, inputs = gateway.new_job_dir()
    for clip in (*corpus.good, corpus.folder / "metadata.csv"):
        shutil.copy(clip, inputs)
    request = CloneRequest("runner-voice", "Runner Voice", tenant=None)
    await queue_clone(gateway, settings, job_id, request)
    folder = gateway.job_dir(job_id)

    # training, past its first checkpoint: Redis loses the queue, then the runner is killed
    deadline = time.monotonic() + 300
    while not list((folder / "work").glob("run-*/checkpoint/state.pt")):
        job = gateway.get(job_id)
        assert time.monotonic() < deadline and job.status not in FINISHED, job
        await asyncio.sleep(0.1)
    print(f"the first checkpoint {time.time() - job.created:.1f} s after the job was queued")
    job = gateway.get(job_id)
    assert job.status == "training" and job.runner in runners, job
    dead = job.runner
    (survivor,) = set(runners) - {dead}
    await redis.flushall()
    # the survivor paused, so that the gap a caller sees is long enough to be seen (an idle
    # runner takes the job within a third of the lease of its lapse: once in 0.1 s polls)
    os.kill(runners[survivor].pid, signal.SIGSTOP)
    os.kill(runners[dead].pid, signal.SIGKILL)
    killed = time.monotonic()
    while (job := gateway.get(job_id)).status != "runner_lost":
        assert time.monotonic() - killed < LEASE + SLACK, job
        await asyncio.sleep(0.1)
    lost_after = time.monotonic() - killed
    assert (job.runner, job.stage) == (dead, "training"), job
    os.kill(runners[survivor].pid, signal.SIGCONT)
    resumed = time.monotonic()
    while (job := gateway.get(job_id)).runner != survivor:
        assert time.monotonic() - resumed < LEASE / 3 + SLACK, job
        await asyncio.sleep(0.1)
    taken_after = time.monotonic() - resumed
    print(f"runner_lost {lost_after:.2f} s after the kill; taken {taken_after:.2f} s after SIGCONT")
    assert job.runners_lost == [dead]
    while (job := gateway.get(job_id)).status not in FINISHED:
        assert time.monotonic() - resumed < 300, job
        await asyncio.sleep(0.2)
    assert job.status == "done", job
    assert job.runners_lost == [dead] and job.runner is None
    assert (job.progress, job.error) == (1.0, None)
    # resumed from the checkpoint, not trained again from the start
    trained = (folder / "worker.log").read_text()
    assert "resumed after epoch" in trained, trained[-3000:]
    assert "taking it over from " + dead in (tmp_path / f"{survivor}.log").read_text()

    # ended once: one voice, one version, one job.done, by the survivor
    versions = list((settings.shared_dir / "adapters" / "runner-voice").iterdir())
    assert len(versions) == 1, versions
    assert await redis.exists("vh:voice:runner-voice")
    lines = (settings.shared_dir / "audit" / "audit.jsonl").read_text().splitlines()
    assert verify(lines).ok
    events = [json.loads(line) for line in lines]
    ends = [(e["action"], e["actor"]["runner"]) for e in events if e.get("job") == job_id]
    assert ends == [("voice.created", survivor), ("job.done", survivor)], ends
    await redis.aclose()
