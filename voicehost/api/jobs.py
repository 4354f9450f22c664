"""Clone jobs over HTTP: ``GET``, ``DELETE`` (cancel, or delete a finished one) and retry."""

from __future__ import annotations

import asyncio

from aiohttp import web
from pydantic import BaseModel, Field

from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    path_id,
    record,
)
from voicehost.api.openapi import Json, Models, json_body, operation, wrapped
from voicehost.cloning.jobs import (
    FINISHED,
    RETRYABLE,
    CloneJob,
    JobBusy,
    JobNotFound,
    JobStatus,
    NotRetryable,
)
from voicehost.tenancy.keys import can_see
from voicehost.voices.voice import VoiceExists

# --- its wire models ---


class CloneJobInfo(BaseModel):
    """A clone job: queued, preparing, training (with progress), evaluating, then done, held
    (the voice measured below the gate's thresholds), failed or cancelled. ``runner_lost``: its
    runner stopped (its lease lapsed) and another takes it over from its last checkpoint."""

    id: str
    voice_id: str
    status: JobStatus
    runner: str | None = Field(
        None, description="The worker running the job now (while runner_lost: the one lost)."
    )
    runners_lost: list[str] = Field(
        default_factory=list, description="Runners that stopped while the job was theirs."
    )
    progress: float = Field(description="0..1 of the training steps")
    stage: str | None = None
    error: str | None = None
    eval_loss: list[float] = Field(default_factory=list)
    data: dict[str, object] | None = Field(
        None,
        description="The data quality report, from the end of the preparing stage on: each "
        "clip's figures, the clips left out (another speaker) and the warnings.",
    )
    eval: dict[str, object] | None = Field(
        None,
        description="The evaluation of the trained voice (as in its voice.json): speaker "
        "similarity to held-out references, the baseline voice, start of speech, real-time "
        "factor, the findings, and whether the gate only reported.",
    )
    held_reason: str | None = Field(None, description="Why the gate held the voice.")
    created: str = Field(description="When it was submitted: UTC, ISO 8601.")
    updated: str = Field(description="When its record last changed: UTC, ISO 8601.")


def job_info(job: CloneJob) -> CloneJobInfo:
    return CloneJobInfo.model_validate(job, from_attributes=True)


def _job(request: web.Request) -> CloneJob:
    """The job the route names: 404 if there is none, or it is another tenant's."""
    job_id = path_id(request, "job_id")
    job = request.app[SERVICE].jobs.get(job_id)
    if job is None or not can_see(request_principal(request), job.tenant):
        raise JobNotFound(job_id)
    return job


async def get_job(request: web.Request) -> web.Response:
    job = _job(request)
    return web.json_response({"job": job_info(job).model_dump()})


async def cancel_job(request: web.Request) -> web.Response:
    """``DELETE /v1/jobs/{id}``: cancel a queued or running job; delete a finished one (and its
    stored inputs)."""
    service = request.app[SERVICE]
    job = _job(request)
    if job.status in FINISHED:
        if service.jobs.is_running(job.id):
            raise JobBusy("the job's worker is still stopping; try again")
        await asyncio.to_thread(service.jobs.discard, job.id)
        await record(request, "job.deleted", tenant=job.tenant, voice=job.voice_id, job=job.id)
        return web.Response(status=204)
    job = await service.jobs.cancel(job.id)
    await record(request, "job.cancelled", tenant=job.tenant, voice=job.voice_id, job=job.id)
    return web.json_response({"job": job_info(job).model_dump()})


async def retry_job(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    job = _job(request)
    if service.jobs.is_running(job.id):
        raise NotRetryable("the job's worker is still stopping; try again")
    if not job.new_version and await service.voices.exists(job.voice_id):
        raise VoiceExists(f"voice {job.voice_id!r} exists now")
    if job.status not in RETRYABLE:
        raise NotRetryable(
            f"job is {job.status}; a failed, cancelled or queued job retries, or one whose "
            "runner was lost"
        )
    job = await service.jobs.retry(job.id)
    await record(request, "job.retried", tenant=job.tenant, voice=job.voice_id, job=job.id)
    return web.json_response({"job": job_info(job).model_dump()}, status=202)


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The OpenAPI operations of the clone-job routes (their error answers: the error table's)."""
    job = wrapped("job", CloneJobInfo)
    return {
        "get_job": operation(
            "A clone job's state and progress",
            {
                "200": json_body(job, "The job."),
            },
            tag="jobs",
        ),
        "cancel_job": operation(
            "Cancel a queued or running job; delete a finished one and its inputs",
            {
                "200": json_body(job, "The job, cancelled."),
                "204": {"description": "The finished job is deleted."},
            },
            tag="jobs",
        ),
        "retry_job": operation(
            "Queue a job nobody runs again: failed, cancelled, queued or runner_lost",
            {
                "202": json_body(job, "The job, queued."),
            },
            tag="jobs",
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ((CloneJobInfo, "serialization"),)
