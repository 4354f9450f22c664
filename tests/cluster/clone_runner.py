"""A cluster worker's clone-job runner on its own, for test_cluster's clone test (the runner
that takes the job and is killed mid-training): the worker's own parts (``WorkerCluster``: the
Redis job queue, the voice registry in Redis and the shared store, the audit trail) and
``CloneJobs`` over the shared jobs folder, as ``voicehost worker`` builds them, without an engine
(it starts in seconds, where a worker's engine takes a minute). Settings come from the
environment (``VOICEHOST_*``).

    python tests/cluster/clone_runner.py
"""

import asyncio
import logging

from voicehost.cloning.jobs import CloneJobs, add_to
from voicehost.cluster.worker import WorkerCluster
from voicehost.config import Settings
from voicehost.model.served import adapter_rules, served_languages


async def main() -> None:
    settings = Settings()
    cluster = WorkerCluster(settings)
    rules = adapter_rules(settings)
    voices = cluster.voice_directory(served_languages(settings).voices, rules)
    jobs = CloneJobs(
        settings.shared_dir / "jobs",
        add_to(voices),
        cluster.job_queue(),
        cluster.worker_id,
        audit=cluster.audit_trail(),
        lease_seconds=settings.job_lease_seconds,
    )
    print("runner", cluster.worker_id, "ready", flush=True)
    await asyncio.gather(jobs.run_forever(), cluster.audit.keep_forever())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main())
