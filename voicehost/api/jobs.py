"""Clone jobs over HTTP: ``GET``, ``DELETE`` (cancel, or delete a finished one) and retry."""

from __future__ import annotations

import asyncio

from aiohttp import web

from voicehost.api.auth import request_principal
from voicehost.api.edge import (
    SERVICE,
    path_id,
    record,
)
from voicehost.api.errors import ApiError
from voicehost.api.openapi import Json, Models, json_body, operation, wrapped
from voicehost.api.schemas import CloneJobInfo
from voicehost.cloning.jobs import FINISHED, RETRYABLE, CloneJob
from voicehost.tenancy.keys import can_see


def job_info(job: CloneJob) -> CloneJobInfo:
    return CloneJobInfo.model_validate(job, from_attributes=True)


def _job(request: web.Request) -> CloneJob:
    """The job the route names: 404 if there is none, or it is another tenant's."""
    job_id = path_id(request, "job_id")
    job = request.app[SERVICE].jobs.get(job_id)
    if job is None or not can_see(request_principal(request), job.tenant):
        raise ApiError("job_not_found", f"job {job_id!r} does not exist")
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
            raise ApiError("job_busy", "the job's worker is still stopping; try again")
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
        raise ApiError("job_not_retryable", "the job's worker is still stopping; try again")
    if not job.new_version and await service.voices.exists(job.voice_id):
        raise ApiError("voice_exists", f"voice {job.voice_id!r} exists now")
    if job.status not in RETRYABLE:
        raise ApiError(
            "job_not_retryable",
            f"job is {job.status}; a failed, cancelled or queued job retries, or one whose "
            "runner was lost",
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
