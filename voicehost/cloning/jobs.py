"""Clone jobs: uploaded audio in, a trained voice out, trained in a separate process.

Each job lives in ``<jobs_dir>/<job_id>/``: ``job.json`` (its state, owned by this process),
``spec.json`` (what the training worker runs), ``inputs/`` (the uploaded files, kept until the
job is deleted so a failed job can be retried), and the worker's ``progress.json``/``error.txt``.
The worker writes the voice into ``out/``; when it succeeds the voice is measured against the
speaker (``evaluate``, through this process's engine; the job is ``evaluating``) and handed to
the voice registry, ready (the job is ``done``) or held by the gate (``held``, with its
reasons): as a new voice, or as the next version of one (``new_version``; live at once if it
passed the gate, unless ``promote`` is off), with its consent record
(``voicehost.cloning.consent``). Which job runs next comes from a ``JobQueue``: the jobs folder
itself for one server (one job at a time, oldest first; on restart a job that was running is queued
again and resumes from its last checkpoint), or a Redis stream shared by a cluster's workers
(``voicehost.cluster.jobs``). A runner watches ``job.json`` while its worker runs, so a cancel
written by any process stops the job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from lora_training.recipe import VoiceJob, job_to_json
from lora_training.worker import ERROR, PROGRESS, SPEC
from voicehost.cloning import consent
from voicehost.ids import child, is_job_id
from voicehost.tenancy.audit import Action, AuditTrail, Change, service_actor
from voicehost.voices.validation import assign_tenant
from voicehost.voices.voice import Voice, VoiceDirectory

log = logging.getLogger(__name__)

JobStatus = Literal[
    "queued", "preparing", "training", "evaluating", "done", "held", "failed", "cancelled"
]
RUNNING: tuple[JobStatus, ...] = ("preparing", "training", "evaluating")
FINISHED: tuple[JobStatus, ...] = ("done", "held", "failed", "cancelled")
OUTPUT = "out"
CANCEL_POLL_SECONDS = 0.5
KEEP_SECONDS = 10.0


@dataclass
class CloneJob:
    """What ``GET /v1/jobs/{id}`` reports."""

    id: str
    voice_id: str
    status: JobStatus
    created: float
    updated: float
    progress: float = 0.0
    stage: str | None = None
    error: str | None = None
    eval_loss: list[float] = field(default_factory=list)
    runner: str | None = None  # who runs the job's worker process right now
    tenant: str | None = None  # whose job it is (and whose the voice); None: no keys configured
    data: dict[str, object] | None = None  # the data report, from the end of prepare on
    eval: dict[str, object] | None = None  # the evaluation, once the voice has been measured
    held_reason: str | None = None  # why the gate held the voice (status "held")
    new_version: bool = False  # the next version of an existing voice, not a new voice
    promote: bool = True  # a new version that passes the gate goes live
    version: int | None = None  # the version it became, once registered


@dataclass(frozen=True, slots=True)
class Verdict:
    """A trained voice measured: ready or held, what fell short, and the figures (as written
    into its ``voice.json``'s ``eval``)."""

    status: Literal["ready", "held"]
    reasons: list[str]
    eval: dict[str, object]


# Measure a trained voice (its id, its folder) before it is registered; the verdict is already
# in its voice.json when this returns.
Evaluate = Callable[[str, Path], Awaitable[Verdict]]


class JobQueue(Protocol):
    """Hands queued jobs to runners."""

    async def put(self, job_id: str) -> None: ...

    async def take(self, jobs: CloneJobs) -> tuple[str, str]:
        """The next job to run and a receipt for ``done``; waits until there is one."""
        ...

    async def keep(self, receipt: str) -> None:
        """Called now and then while the job runs (a claim that must not go stale)."""
        ...

    async def done(self, receipt: str) -> None: ...


class FolderQueue:
    """One host's queue: the queued jobs in the jobs folder, oldest first. A job this process
    queues wakes its runner at once; one that another front end of the host queued is seen
    within ``POLL_SECONDS``."""

    POLL_SECONDS = 1.0

    def __init__(self) -> None:
        self._wake = asyncio.Event()

    async def put(self, job_id: str) -> None:
        self._wake.set()

    async def take(self, jobs: CloneJobs) -> tuple[str, str]:
        while True:
            queued = [j for j in await asyncio.to_thread(jobs.jobs) if j.status == "queued"]
            if queued:
                return queued[0].id, queued[0].id
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.POLL_SECONDS)
            except TimeoutError:
                pass

    async def keep(self, receipt: str) -> None:
        return None

    async def done(self, receipt: str) -> None:
        return None


# Register a trained voice (the job, its folder); returns the voice (or version) it became.
VoiceReady = Callable[[CloneJob, Path], Awaitable[object]]


def registrar(voices: VoiceDirectory) -> VoiceReady:
    """What registers a job's trained voice in ``voices``: a new voice, or its next version."""

    async def register(job: CloneJob, folder: Path) -> Voice:
        if job.new_version:
            return await voices.add_version(job.voice_id, folder, job.promote)
        return await voices.add(job.voice_id, folder)

    return register


class CloneJobs:
    """The persisted jobs, their queue and this process's runner."""

    def __init__(
        self,
        root: Path,
        on_voice_ready: VoiceReady,
        queue: JobQueue | None = None,
        runner_id: str = "local",
        evaluate: Evaluate | None = None,
        audit: AuditTrail | None = None,
    ) -> None:
        self.root = root
        self.audit = audit  # where a runner records how its jobs end
        self.root.mkdir(parents=True, exist_ok=True)
        self.on_voice_ready = on_voice_ready
        self.evaluate = evaluate
        self.queue = queue or FolderQueue()
        self.runner_id = runner_id
        self._process: asyncio.subprocess.Process | None = None
        self._running: str | None = None

    def _dir(self, job_id: str) -> Path:
        try:
            if is_job_id(job_id):
                return child(self.root, job_id)
        except ValueError:  # a job folder that is a link out of the jobs folder
            pass
        raise KeyError(job_id)

    def _save(self, job: CloneJob) -> None:
        job.updated = time.time()
        path = self._dir(job.id) / "job.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(job)))
        tmp.replace(path)

    def _load(self, job_id: str) -> CloneJob | None:
        try:
            data = json.loads((self._dir(job_id) / "job.json").read_text())
        except (KeyError, OSError, json.JSONDecodeError):
            return None
        try:
            return CloneJob(**data)
        except TypeError:  # a job.json from another version
            return None

    def new_job_dir(self) -> tuple[str, Path]:
        """A fresh job id and its (empty) inputs folder, for the upload to fill."""
        job_id = f"job-{secrets.token_hex(8)}"
        inputs = self._dir(job_id) / "inputs"
        inputs.mkdir(parents=True)
        return job_id, inputs

    def discard(self, job_id: str) -> None:
        shutil.rmtree(self._dir(job_id), ignore_errors=True)

    def output_dir(self, job_id: str) -> Path:
        """Where the job's worker writes the voice folder."""
        return self._dir(job_id) / OUTPUT

    def job_dir(self, job_id: str) -> Path:
        """The job's folder (what it keeps besides its inputs: its consent record)."""
        return self._dir(job_id)

    async def submit(
        self,
        job_id: str,
        spec: VoiceJob,
        tenant: str | None = None,
        new_version: bool = False,
        promote: bool = True,
    ) -> CloneJob:
        """Queue a job whose inputs are in place (``spec.adapters_dir`` is ``output_dir``)."""
        (self._dir(job_id) / SPEC).write_text(json.dumps(job_to_json(spec)))
        now = time.time()
        job = CloneJob(
            job_id,
            spec.voice_id,
            "queued",
            now,
            now,
            tenant=tenant,
            new_version=new_version,
            promote=promote,
        )
        self._save(job)
        await self.queue.put(job_id)  # if this fails, the caller discards the job
        return job

    def get(self, job_id: str) -> CloneJob | None:
        """The job's state, with the worker's latest progress while it runs."""
        job = self._load(job_id)
        if job is None or job.status not in RUNNING:
            return job
        try:
            progress = json.loads((self._dir(job_id) / PROGRESS).read_text())
        except (OSError, json.JSONDecodeError):
            return job
        if job.status != "evaluating":  # then the worker has ended: its progress is history
            job.stage = progress["stage"]
            training = progress["stage"] in ("training", "exporting")
            job.status = "training" if training else "preparing"
        job.progress = progress["progress"]
        job.eval_loss = progress["eval_loss"]
        job.data = progress.get("data", job.data)
        return job

    def jobs(self) -> list[CloneJob]:
        found = [self._load(p.name) for p in self.root.iterdir() if is_job_id(p.name)]
        return sorted((j for j in found if j), key=lambda j: j.created)

    def voice_in_progress(self, voice_id: str) -> bool:
        return any(j.voice_id == voice_id and j.status not in FINISHED for j in self.jobs())

    async def cancel(self, job_id: str) -> CloneJob | None:
        """Stop a queued or running job; a finished one is left as it is."""
        job = self._load(job_id)
        if job is None or job.status in FINISHED:
            return job
        job.status, job.error = "cancelled", "cancelled by request"
        self._save(job)
        if self._running == job_id and self._process is not None:
            self._process.terminate()  # this process runs it; other runners see job.json
        return job

    def is_running(self, job_id: str) -> bool:
        """Whether a worker process for this job is still alive (even if it was cancelled)."""
        job = self._load(job_id)
        return job is not None and job.runner is not None

    async def retry(self, job_id: str) -> CloneJob | None:
        """Queue a failed or cancelled job again, from its stored inputs."""
        job = self._load(job_id)
        if job is None or job.status not in ("failed", "cancelled") or job.runner is not None:
            return job
        previous = (job.status, job.error)
        job.status, job.error, job.progress, job.stage = "queued", None, 0.0, None
        job.data, job.eval, job.held_reason = None, None, None
        self._save(job)
        try:
            await self.queue.put(job_id)
        except BaseException:
            job.status, job.error = previous  # not queued after all
            self._save(job)
            raise
        return job

    def recover(self) -> None:
        """After a restart: jobs this runner was running are queued again."""
        sole_runner = isinstance(self.queue, FolderQueue)  # then every running job was ours
        for job in self.jobs():
            if job.runner == self.runner_id or (sole_runner and job.status in RUNNING):
                job.runner = None
                if job.status in RUNNING:
                    job.status = "queued"
                self._save(job)

    async def run_forever(self) -> None:
        """Run queued jobs one at a time, as the queue hands them out (as a task)."""
        await asyncio.to_thread(self.recover)
        while True:
            job_id, receipt = await self.queue.take(self)
            job = self._load(job_id)
            try:
                if job is not None and job.status in ("queued", *RUNNING):
                    await self._run(job, receipt)
                    await self._record_end(job_id)
            except Exception as exc:  # one broken job must not stop the queue
                log.exception("clone job %s could not run", job_id)
                self._finish(job_id, "failed", f"{type(exc).__name__}: {exc}", even_if_queued=True)
                await self._record_end(job_id)
            await self.queue.done(receipt)

    async def _run_worker(self, job_id: str, job_dir: Path, receipt: str) -> int:
        """Run the training process to its end, stopping it if the job is cancelled."""
        with (job_dir / "worker.log").open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "lora_training.worker",
                str(job_dir),
                stdout=log_file,
                stderr=log_file,
            )
            self._process = process
            kept = time.monotonic()
            try:
                while True:
                    if time.monotonic() - kept > KEEP_SECONDS:
                        await self.queue.keep(receipt)
                        kept = time.monotonic()
                    current = await asyncio.to_thread(self._load, job_id)
                    if current is None or current.status == "cancelled":
                        process.terminate()
                    try:
                        return await asyncio.wait_for(process.wait(), CANCEL_POLL_SECONDS)
                    except TimeoutError:
                        continue
            except asyncio.CancelledError:
                process.terminate()  # the server is stopping; the job resumes next time
                await process.wait()
                raise

    def _set_runner(self, job_id: str, runner: str | None) -> None:
        job = self._load(job_id)
        if job is not None:
            job.runner = runner
            self._save(job)

    def _finish(
        self,
        job_id: str,
        status: JobStatus,
        error: str | None = None,
        even_if_queued: bool = False,
        verdict: Verdict | None = None,
        version: int | None = None,
    ) -> None:
        """Record how a run ended, unless the job was cancelled (or re-queued) meanwhile."""
        job = self.get(job_id)
        allowed = RUNNING + (("queued",) if even_if_queued else ())
        if job is None or job.status not in allowed:
            return
        job.status, job.error = status, error
        if status in ("done", "held"):
            job.progress, job.stage = 1.0, status
        if verdict is not None:
            job.eval = verdict.eval
            job.held_reason = "; ".join(verdict.reasons) if verdict.status == "held" else None
        if version is not None:
            job.version = version
        self._save(job)

    async def _record(
        self, job: CloneJob, action: Action, version: int | None = None, **details: object
    ) -> None:
        """Put what this runner did to ``job`` (or to its voice) on the audit trail."""
        if self.audit is not None:
            actor = service_actor(self.runner_id)
            change = Change(
                action, actor, job.tenant, job.voice_id, version, job=job.id, details=details
            )
            await self.audit.record(change)

    async def _record_registered(
        self, job: CloneJob, verdict: Verdict | None, version: int | None
    ) -> None:
        """The trained voice is registered: created (or its new version added), with its
        consent record, and held if the gate held it."""
        status = verdict.status if verdict is not None else "ready"
        action: Action = "voice.version_added" if job.new_version else "voice.created"
        promoted = job.new_version and job.promote and status == "ready"
        await self._record(job, action, version, source="clone", status=status)
        if (self._dir(job.id) / consent.RECORD_FILE).is_file():
            await self._record(job, "voice.consent_recorded", version)
        if promoted:
            await self._record(job, "voice.promoted", version)
        if verdict is not None and verdict.status == "held":
            await self._record(job, "voice.held", version, reasons=verdict.reasons)

    async def _record_end(self, job_id: str) -> None:
        """How a run ended (done, held or failed), unless it was cancelled meanwhile (the
        cancel is recorded by whoever asked for it)."""
        job = await asyncio.to_thread(self._load, job_id)
        if job is not None and job.status in ("done", "held", "failed"):
            action: Action = f"job.{job.status}"  # type: ignore[assignment]
            await self._record(job, action, error=job.error, held_reason=job.held_reason)

    def _evaluating(self, job_id: str) -> bool:
        """Mark a job whose voice is being measured; False if it was cancelled meanwhile."""
        job = self._load(job_id)
        if job is None or job.status not in RUNNING:
            return False
        job.status, job.stage = "evaluating", "evaluating"
        self._save(job)
        return True

    async def _run(self, job: CloneJob, receipt: str) -> None:
        job_dir = self._dir(job.id)
        (job_dir / PROGRESS).unlink(missing_ok=True)
        job.status, job.stage, job.runner = "preparing", "preparing", self.runner_id
        self._save(job)
        self._running = job.id
        try:
            code = await self._run_worker(job.id, job_dir, receipt)
            self._process = None
            if code == 0:
                folder = self.output_dir(job.id) / job.voice_id
                verdict = None
                try:
                    if job.tenant is not None:
                        await asyncio.to_thread(assign_tenant, folder, job.tenant)
                    await asyncio.to_thread(consent.attach, job_dir, folder)
                    if self.evaluate is not None:
                        if not self._evaluating(job.id):
                            return
                        verdict = await self.evaluate(job.voice_id, folder)
                    registered = await self.on_voice_ready(job, folder)
                    number = registered.version if isinstance(registered, Voice) else None
                    await self._record_registered(job, verdict, number)
                except (ValueError, LookupError) as exc:  # VoiceExists, InvalidAdapter, gone
                    self._finish(job.id, "failed", f"the trained voice was not registered: {exc}")
                    return
                except RuntimeError as exc:  # the engine is away: retry the job later
                    self._finish(job.id, "failed", f"the trained voice was not evaluated: {exc}")
                    return
                held = verdict is not None and verdict.status == "held"
                self._finish(job.id, "held" if held else "done", verdict=verdict, version=number)
                await asyncio.to_thread(shutil.rmtree, job_dir / "work", True)  # checkpoints
            else:
                error = job_dir / ERROR
                reason = error.read_text() if error.exists() else f"worker exited with {code}"
                self._finish(job.id, "failed", reason)
        finally:  # only now: until the job's end is recorded, it is this runner's
            self._running, self._process = None, None
            self._set_runner(job.id, None)
