"""Clone jobs: uploaded audio in, a trained voice out, trained in a separate process.

Each job lives in ``<jobs_dir>/<job_id>/``: ``job.json`` (its state, owned by this process),
``spec.json`` (what the training worker runs), ``inputs/`` (the uploaded files, kept until the
job is deleted so a failed job can be retried), and the worker's ``progress.json``/``error.txt``.
The worker writes the voice into ``out/``; when it succeeds the voice is measured against the
speaker (``evaluate``, through this process's engine; the job is ``evaluating``) and handed to
the voice directory, ready (the job is ``done``) or held by the gate (``held``, with its
reasons): as a new voice, or as the next version of one (``new_version``; live at once if it
passed the gate, unless ``promote`` is off), with its consent record
(``voicehost.cloning.consent``). Which job runs next comes from a ``JobQueue``: the jobs folder
itself for one server (one job at a time, oldest first; on restart a job that was running is queued
again and resumes from its last checkpoint), or a Redis stream shared by a cluster's workers
(``voicehost.cluster.jobs``). A runner watches ``job.json`` while its worker runs, so a cancel
written by any process stops the job.

A job runs once. Its runner holds a lease in ``lease.json`` beside ``job.json``, taken and
renewed under a lock on the shared store (``lease.lock``) and renewed every third of
``lease_seconds`` in every stage (preparing, training, evaluating, publishing): a live runner
never loses its job. A runner that dies stops renewing: once its lease lapses the job reads
``runner_lost``, and the next runner that looks for work (``orphans``, every third of the lease
while it is idle) takes it over and resumes its training from the last checkpoint. Only the
lease's holder writes how a job ended, so a job ends once: one ``job.done``, one voice. The
queue is only a fast path: a job whose queue entry Redis lost is still found in the jobs folder.
Leases compare wall clocks: the hosts sharing a store keep them in step (NTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import secrets
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from lora_training.recipe import VoiceJob, job_to_json
from lora_training.worker import ERROR, PROGRESS, SPEC
from voicehost.cloning import consent
from voicehost.errors import ServiceError
from voicehost.ids import as_iso, child, is_job_id, now_iso, parse_iso
from voicehost.tenancy.audit import Action, AuditTrail, Change, service_actor
from voicehost.voices.validation import assign_tenant
from voicehost.voices.voice import Voice, VoiceDirectory

if TYPE_CHECKING:
    from voicehost.metrics import SpeechMetrics

log = logging.getLogger(__name__)

JobStatus = Literal[
    "queued",
    "preparing",
    "training",
    "evaluating",
    "runner_lost",  # reported, never stored: running, but its runner's lease lapsed
    "done",
    "held",
    "failed",
    "cancelled",
]
RUNNING: tuple[JobStatus, ...] = ("preparing", "training", "evaluating")
FINISHED: tuple[JobStatus, ...] = ("done", "held", "failed", "cancelled")
RETRYABLE: tuple[JobStatus, ...] = ("failed", "cancelled", "queued", "runner_lost")
OUTPUT = "out"
CANCEL_POLL_SECONDS = 0.5
LEASE_SECONDS = 15.0
LEASE_FILE = "lease.json"
LEASE_LOCK = "lease.lock"


class JobNotFound(ServiceError, LookupError):
    """No such job (or another tenant's)."""

    code = "job_not_found"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} does not exist")


class JobInProgress(ServiceError, ValueError):
    """A version of the voice is being trained: one clone job at a time per voice."""

    code = "job_in_progress"


class JobBusy(ServiceError, RuntimeError):
    """The job's runner is still stopping: the change waits for it (try again)."""

    code = "job_busy"


class NotRetryable(ServiceError, ValueError):
    """A job that cannot run again in the state it is in."""

    code = "job_not_retryable"


@dataclass
class CloneJob:
    """What ``GET /v1/jobs/{id}`` reports."""

    id: str
    voice_id: str
    status: JobStatus
    created: str  # UTC, ISO 8601 (``now_iso``)
    updated: str
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
    runners_lost: list[str] = field(default_factory=list)  # runners whose lease lapsed on it


JOB_FIELDS = frozenset(CloneJob.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class TrainingModel:
    """The base model a runner trains on. The jobs asked of it by name (a spec's
    ``base_model_name``) are this runner's, and run on its own weights and codec: whoever queued
    them (a gateway, a worker of another model) may not know where those lie."""

    name: str
    weights: str
    codec: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A runner's claim on a job (``lease.json``): whose, and until when (wall clock, Unix
    seconds: only ever compared with the time now, never shown)."""

    runner: str
    until: float

    def live(self) -> bool:
        return time.time() < self.until


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


def _write_whole(path: Path, record: dict[str, object]) -> None:
    """``record`` as ``path``'s JSON, swapped in whole: a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


class JobQueue(Protocol):
    """Hands queued jobs to runners: a job of ``base_model`` (its name, as a spec's
    ``base_model_name``) to a runner of that model."""

    async def put(self, job_id: str, base_model: str) -> None: ...

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

    async def put(self, job_id: str, base_model: str) -> None:
        self._wake.set()

    async def take(self, jobs: CloneJobs) -> tuple[str, str]:
        while True:
            waiting = await asyncio.to_thread(jobs.orphans)
            if waiting:
                return waiting[0], waiting[0]
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


def add_to(voices: VoiceDirectory) -> VoiceReady:
    """What adds a job's trained voice to the voice directory ``voices``: a new voice, or its
    next version."""

    async def add(job: CloneJob, folder: Path) -> Voice:
        if job.new_version:
            return await voices.add_version(job.voice_id, folder, job.promote)
        return await voices.add(job.voice_id, folder)

    return add


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
        lease_seconds: float = LEASE_SECONDS,
        model: TrainingModel | None = None,
        metrics: SpeechMetrics | None = None,
    ) -> None:
        self.root = root
        self.model = model  # what this runner trains on (None: it runs no job, or any)
        self.metrics = metrics  # how this runner's runs end, and the jobs it takes over
        self.lease_seconds = lease_seconds
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
        job.updated = now_iso()
        _write_whole(self._dir(job.id) / "job.json", asdict(job))

    def _load(self, job_id: str) -> CloneJob | None:
        try:
            data = json.loads((self._dir(job_id) / "job.json").read_text())
        except (KeyError, OSError, json.JSONDecodeError):
            return None
        known = {name: value for name, value in data.items() if name in JOB_FIELDS}
        try:  # fields a newer version added are left out, so an older one can still read it
            job = CloneJob(**known)
            # a job.json written before timestamps were ISO holds Unix seconds
            job.created, job.updated = as_iso(job.created), as_iso(job.updated)
        except (TypeError, ValueError):  # without a field this version needs, or not a time
            return None
        return job

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
        now = now_iso()
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
        await self.queue.put(job_id, spec.base_model_name)  # if this fails, it is discarded
        return job

    def _current(self, job_id: str) -> CloneJob | None:
        """The job's record, with its worker's latest progress while it runs."""
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

    def get(self, job_id: str) -> CloneJob | None:
        """The job as a caller sees it: its state and progress, and ``runner_lost`` while a
        job's runner has stopped renewing its lease and no other has taken it over yet."""
        job = self._current(job_id)
        if job is None or job.status not in RUNNING:
            return job
        try:
            lease = self.lease(job_id)
        except OSError:  # unreadable for now: the job as recorded
            return job
        if lease is None or not lease.live():
            job.status = "runner_lost"
            job.runner = lease.runner if lease is not None else job.runner
        return job

    def jobs(self) -> list[CloneJob]:
        found = [self._load(p.name) for p in self.root.iterdir() if is_job_id(p.name)]
        return sorted((j for j in found if j), key=lambda j: parse_iso(j.created))

    def model_of(self, job_id: str) -> str:
        """The name of the base model the job trains on (its spec's); "" if unreadable."""
        try:
            spec = json.loads((self._dir(job_id) / SPEC).read_text())
        except (OSError, json.JSONDecodeError):
            return ""
        return str(spec.get("base_model_name") or "") if isinstance(spec, dict) else ""

    def _ours(self, job_id: str) -> bool:
        """Whether this runner trains the job: one of its model (or of none said)."""
        return self.model is None or self.model_of(job_id) in ("", self.model.name)

    def orphans(self) -> list[str]:
        """The jobs of this runner's model that need a runner, oldest first: queued, or
        running under a lease that lapsed (or under this runner's own, from before it
        restarted)."""
        waiting = []
        for job in self.jobs():
            if (job.status == "queued" or job.status in RUNNING) and self._ours(job.id):
                try:
                    lease = self.lease(job.id)
                except OSError:  # unreadable for now: not this runner's to take
                    continue
                if lease is None or not lease.live() or lease.runner == self.runner_id:
                    waiting.append(job.id)
        return waiting

    def runners_lost(self) -> int:
        """Jobs running under a lease that lapsed, that no runner has taken over yet (each
        reads ``runner_lost``)."""
        lost = 0
        for job in self.jobs():
            if job.status in RUNNING:
                try:
                    lease = self.lease(job.id)
                except OSError:  # unreadable for now: not known lost
                    continue
                lost += lease is None or not lease.live()
        return lost

    def voice_in_progress(self, voice_id: str) -> bool:
        return any(j.voice_id == voice_id and j.status not in FINISHED for j in self.jobs())

    # -- the lease ------------------------------------------------------------------------

    def lease(self, job_id: str) -> Lease | None:
        """Who holds the job, and until when; None if nobody does. A read that fails (not a
        missing file: the store's hiccup) is no answer: ``OSError``."""
        try:
            data = json.loads((self._dir(job_id) / LEASE_FILE).read_text())
            return Lease(str(data["runner"]), float(data["until"]))
        except (FileNotFoundError, KeyError, ValueError, TypeError):  # none, or not a lease
            return None

    @contextlib.contextmanager
    def _leasing(self, job_id: str) -> Iterator[Lease | None]:
        """The job's lease, read under its lock (held until the block ends)."""
        with (self._dir(job_id) / LEASE_LOCK).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield self.lease(job_id)

    def _write_lease(self, job_id: str) -> None:
        lease = {"runner": self.runner_id, "until": time.time() + self.lease_seconds}
        _write_whole(self._dir(job_id) / LEASE_FILE, lease)

    def _claim(self, job_id: str) -> CloneJob | None:
        """Take the job's lease, unless another runner holds it; the job if taken. A job whose
        runner's lease lapsed is taken over (and its lost runner named in it). A job of
        another model than this runner's is not taken."""
        if not self._ours(job_id):
            return None
        try:
            with self._leasing(job_id) as held:
                if held is not None and held.runner != self.runner_id and held.live():
                    return None
                job = self._load(job_id)
                if job is None or job.status not in ("queued", *RUNNING):
                    return None
                self._write_lease(job_id)
                if held is not None and held.runner != self.runner_id and job.status in RUNNING:
                    lapsed = time.time() - held.until
                    log.warning(
                        "clone job %s: taking it over from %s, whose lease lapsed %.1f s ago",
                        job_id,
                        held.runner,
                        lapsed,
                    )
                    job.runners_lost.append(held.runner)
                    if self.metrics is not None:
                        self.metrics.clone_jobs_taken_over.inc()
                job.runner = self.runner_id
                self._save(job)
                return job
        except FileNotFoundError:  # the job was deleted meanwhile
            return None

    def _renew(self, job_id: str) -> bool:
        """Keep this runner's lease; False if another runner holds the job now, or nobody (a
        retry gave it up). A store that fails to answer is not a lost job: ``OSError``."""
        with self._leasing(job_id) as held:
            if held is None or held.runner != self.runner_id:
                return False
            self._write_lease(job_id)
            return True

    def _let_go(self, job_id: str) -> None:
        """The run has ended: this runner no longer holds the job."""
        try:
            with self._leasing(job_id) as held:
                if held is None or held.runner != self.runner_id:
                    return
                job = self._load(job_id)
                if job is not None:
                    job.runner = None
                    self._save(job)
                (self._dir(job_id) / LEASE_FILE).unlink(missing_ok=True)
        except OSError:
            return

    def _update(self, job_id: str, change: Callable[[CloneJob], bool]) -> bool:
        """Apply ``change`` to the job's record (with its latest progress) if this runner still
        holds the job and ``change`` accepts it; whether it was written."""
        try:
            with self._leasing(job_id) as held:
                if held is None or held.runner != self.runner_id:
                    return False
                job = self._current(job_id)
                if job is None or not change(job):
                    return False
                self._save(job)
                return True
        except OSError:
            return False

    # -- requests ---------------------------------------------------------------------------

    async def cancel(self, job_id: str) -> CloneJob | None:
        """Stop a queued or running job; a finished one is left as it is."""
        try:
            with self._leasing(job_id):  # not between a runner's read and write of the record
                # with its runner's latest progress: the job ends where it stood (its data
                # report, stage, progress), as _update's ends do
                job = self._current(job_id)
                if job is None or job.status in FINISHED:
                    return job
                job.status, job.error = "cancelled", "cancelled by request"
                self._save(job)
        except FileNotFoundError:  # deleted meanwhile
            return None
        if self._running == job_id and self._process is not None:
            self._process.terminate()  # this process runs it; other runners see job.json
        return job

    def is_running(self, job_id: str) -> bool:
        """Whether a runner holds the job (its worker may still be stopping after a cancel);
        a lease that cannot be read now counts as held."""
        try:
            lease = self.lease(job_id)
        except OSError:
            return True
        return lease is not None and lease.live()

    async def retry(self, job_id: str) -> CloneJob | None:
        """Queue a job again, from its stored inputs: a failed or cancelled one; a queued one
        (its queue entry may be lost) or one whose runner was lost (from its checkpoint)."""
        seen = self.get(job_id)
        if seen is None or seen.status not in RETRYABLE or self.is_running(job_id):
            return seen
        try:
            with self._leasing(job_id) as held:  # a lapsed lease is given up: a runner that
                job = self._load(job_id)  # only stalled finds it gone when it wakes, and stops
                if job is None or (held is not None and held.live()):
                    return job
                (self._dir(job_id) / LEASE_FILE).unlink(missing_ok=True)
                if held is not None and job.status in RUNNING:  # its runner stopped: named
                    job.runners_lost.append(held.runner)
                    if self.metrics is not None:
                        self.metrics.clone_jobs_taken_over.inc()
                previous = (job.status, job.error)
                if job.status in ("failed", "cancelled"):
                    job.error, job.progress, job.stage = None, 0.0, None
                    job.data, job.eval, job.held_reason = None, None, None
                job.status, job.runner = "queued", None
                self._save(job)
        except FileNotFoundError:  # deleted meanwhile
            return None
        try:
            await self.queue.put(job_id, await asyncio.to_thread(self.model_of, job_id))
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

    # -- the runner -------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Run queued jobs one at a time, as the queue hands them out (as a task)."""
        await asyncio.to_thread(self.recover)
        while True:
            job_id, receipt = await self.queue.take(self)
            if not await self.run_one(job_id, receipt):
                await asyncio.sleep(FolderQueue.POLL_SECONDS)  # never a loop on one job
            await self.queue.done(receipt)

    async def run_one(self, job_id: str, receipt: str) -> bool:
        """Run the job if it still needs a runner and none other holds it; record its end if
        this runner is the one that ended it. Whether this runner took it."""
        try:
            job = await asyncio.to_thread(self._claim, job_id)
        except OSError as exc:  # the store: the job waits for the next look
            log.warning("clone job %s could not be claimed (%s)", job_id, exc)
            return False
        if job is None:  # finished, cancelled, deleted, or another runner's
            return False
        try:
            ended = await self._run_leased(job, receipt)
        except asyncio.CancelledError:  # stopping: the next runner need not wait for the lease
            self._running, self._process = None, None
            self._let_go(job_id)
            raise
        except Exception as exc:  # one broken job must not stop the queue
            log.exception("clone job %s could not run", job_id)
            reason = f"{type(exc).__name__}: {exc}"
            ended = self._finish(job_id, "failed", reason, even_if_queued=True)
        self._running, self._process = None, None
        if ended:
            await self._record_end(job_id)
        await asyncio.to_thread(self._let_go, job_id)  # its end recorded: no longer this runner's
        return True

    async def _run_leased(self, job: CloneJob, receipt: str) -> bool:
        """``_run``, with the lease renewed beside it; a run whose lease another runner took
        (this one stalled past it) is stopped, and ends nothing."""
        run = asyncio.create_task(self._run(job), name=f"clone-job-{job.id}")

        async def keep() -> None:
            while True:
                await asyncio.sleep(self.lease_seconds / 3)
                try:
                    renewed = await asyncio.to_thread(self._renew, job.id)
                except OSError as exc:  # the store's hiccup: try again at the next round
                    log.warning("clone job %s: its lease not renewed (%s)", job.id, exc)
                    continue
                if not renewed:
                    log.warning("clone job %s: no longer this runner's; stopping", job.id)
                    run.cancel()
                    return
                with contextlib.suppress(Exception):  # the queue's claim: a fast path only
                    await asyncio.wait_for(self.queue.keep(receipt), self.lease_seconds / 3)

        keeper = asyncio.create_task(keep(), name=f"clone-job-lease-{job.id}")
        try:
            await asyncio.wait({run})
        finally:
            keeper.cancel()
            if not run.done():  # this task was cancelled: the server is stopping
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
        if run.cancelled():  # stopped: the job is another runner's (or nobody's) now
            return False
        return run.result()

    def _train_on_own_model(self, job_dir: Path) -> None:
        """Point the job's spec at this runner's weights and codec, when it asks for this
        runner's model by name (``TrainingModel``)."""
        if self.model is None:
            return
        spec = json.loads((job_dir / SPEC).read_text())
        if spec.get("base_model_name") not in (None, "", self.model.name):
            raise ValueError(
                f"the job trains on {spec['base_model_name']!r}; this runner serves "
                f"{self.model.name!r}"
            )
        spec |= {"base_model": self.model.weights, "codec": self.model.codec}
        _write_whole(job_dir / SPEC, spec)

    async def _run_worker(self, job_id: str, job_dir: Path) -> int:
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
            try:
                while True:
                    current = await asyncio.to_thread(self._load, job_id)
                    if current is None or current.status == "cancelled":
                        process.terminate()
                    try:
                        return await asyncio.wait_for(process.wait(), CANCEL_POLL_SECONDS)
                    except TimeoutError:
                        continue
            except asyncio.CancelledError:
                process.terminate()  # stopping, or the job is another runner's now
                await process.wait()
                raise

    def _finish(
        self,
        job_id: str,
        status: JobStatus,
        error: str | None = None,
        even_if_queued: bool = False,
        verdict: Verdict | None = None,
        version: int | None = None,
    ) -> bool:
        """Record how a run ended, unless the job was cancelled (or re-queued) meanwhile or
        another runner holds it now; whether it was recorded."""
        allowed = RUNNING + (("queued",) if even_if_queued else ())

        def end(job: CloneJob) -> bool:
            if job.status not in allowed:
                return False
            job.status, job.error = status, error
            job.runner = None  # ended: nobody runs it (the lease goes just after)
            if status in ("done", "held"):
                job.progress, job.stage = 1.0, status
            if verdict is not None:
                job.eval = verdict.eval
                job.held_reason = "; ".join(verdict.reasons) if verdict.status == "held" else None
            if version is not None:
                job.version = version
            return True

        return self._update(job_id, end)

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
            if self.metrics is not None:
                self.metrics.clone_jobs_ended.labels(job.status).inc()
            action: Action = f"job.{job.status}"  # type: ignore[assignment]
            await self._record(job, action, error=job.error, held_reason=job.held_reason)

    def _stage(self, job_id: str, status: JobStatus) -> bool:
        """Mark the job's stage; False if it was cancelled meanwhile or is another runner's."""

        def mark(job: CloneJob) -> bool:
            if job.status not in ("queued", *RUNNING):
                return False
            job.status, job.stage = status, status
            return True

        return self._update(job_id, mark)

    async def _run(self, job: CloneJob) -> bool:
        """Train, evaluate and register the job's voice; whether this run ended the job (and
        so records its end)."""
        job_dir = self._dir(job.id)
        (job_dir / PROGRESS).unlink(missing_ok=True)
        if not await asyncio.to_thread(self._stage, job.id, "preparing"):
            return False
        self._running = job.id
        await asyncio.to_thread(self._train_on_own_model, job_dir)
        code = await self._run_worker(job.id, job_dir)
        self._process = None
        if code != 0:
            error = job_dir / ERROR
            reason = error.read_text() if error.exists() else f"worker exited with {code}"
            return self._finish(job.id, "failed", reason)
        folder = self.output_dir(job.id) / job.voice_id
        verdict = None
        try:
            if job.tenant is not None:
                await asyncio.to_thread(assign_tenant, folder, job.tenant)
            await asyncio.to_thread(consent.attach, job_dir, folder)
            if self.evaluate is not None:
                if not await asyncio.to_thread(self._stage, job.id, "evaluating"):
                    return False
                verdict = await self.evaluate(job.voice_id, folder)
            # the last check that the job is still this runner's (renewed: a whole lease to go)
            if not await asyncio.to_thread(self._renew, job.id):
                return False
            registered = await asyncio.shield(self.on_voice_ready(job, folder))
            number = registered.version if isinstance(registered, Voice) else None
            await self._record_registered(job, verdict, number)
        except (ValueError, LookupError) as exc:  # VoiceExists, InvalidAdapter, gone
            return self._finish(job.id, "failed", f"the trained voice was not registered: {exc}")
        except RuntimeError as exc:  # the engine is away: retry the job later
            return self._finish(job.id, "failed", f"the trained voice was not evaluated: {exc}")
        held = verdict is not None and verdict.status == "held"
        ended = self._finish(job.id, "held" if held else "done", verdict=verdict, version=number)
        await asyncio.to_thread(shutil.rmtree, job_dir / "work", True)  # checkpoints
        return ended
