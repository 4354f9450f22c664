"""Intake in a cluster: a gateway decodes no audio, so it asks a worker to check an upload.

A gateway answers the upload routes itself and stores an upload in the shared store's jobs
folder, where every worker finds it under the same job id. Its intake (``WorkerIntake``) asks
one worker, picked as for a stream (the ring, by the job's id; the next one if it fails), to
run the cloning service's checks there: ``POST /internal/intake/{job_id}`` (the gateway's
internal token only) with the clips' saved names, answered by the worker's own intake
(``voicehost.cloning.intake.LocalIntake``, counted in ``voicehost_intake_checks_total``) with
200 and the consent recording's similarity, or the check's error in the one error shape. The
gateway raises that error again, so it answers what ``voicehost serve`` would (a 422
``consent_speaker_mismatch`` at once); 503 ``no_workers`` without a worker, 502
``upstream_failed`` when each one tried failed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from voicehost.api.auth import INTERNAL, INTERNAL_TOKEN_HEADER
from voicehost.api.edge import SERVICE, path_id, read_body
from voicehost.api.errors import ERRORS, UPLOADS, ApiError
from voicehost.api.routes import Route
from voicehost.cloning.intake import StoredUpload
from voicehost.config import Settings
from voicehost.errors import ServiceError

INTAKE_PATH = "/internal/intake/{job_id}"

# (routing key, path, JSON body, headers) -> the worker's status and body (``Gateway.ask``)
Ask = Callable[[str, str, bytes, Mapping[str, str]], Awaitable[tuple[int, bytes]]]

# --- its wire models ---


class IntakeRequest(BaseModel):
    """What a gateway sends with a job's id: the upload's clips, as saved in its inputs
    folder, and whether a consent recording came with them."""

    model_config = ConfigDict(extra="forbid")

    clips: list[StrictStr]
    consent_recording: bool = False


class IntakeAnswer(BaseModel):
    """A passed check: the consent recording's similarity to the clips' speaker (or null)."""

    speaker_similarity: float | None


# --- the worker's side ---


async def check_upload(request: web.Request) -> web.Response:
    """``POST /internal/intake/{job_id}``: the stored upload checked by this process's intake;
    200 and the similarity, or the check's error (its status and code from the error table)."""
    job_id = path_id(request, "job_id")
    body = await read_body(request, IntakeRequest)
    upload = StoredUpload(job_id, tuple(body.clips), body.consent_recording)
    measured = await request.app[SERVICE].intake.check(upload)
    return web.json_response(IntakeAnswer(speaker_similarity=measured).model_dump())


INTAKE_ROUTES = (Route("POST", INTAKE_PATH, check_upload, INTERNAL, None),)


# --- the gateway's side ---


class WorkerIntake:
    """A gateway's intake (``voicehost.cloning.intake.Intake``): each check asked of a worker
    through ``ask`` (``Gateway.ask``), its answer turned back into the check's result or its
    ``ServiceError``."""

    def __init__(self, ask: Ask, settings: Settings) -> None:
        self.ask = ask
        token = settings.internal_token
        self.headers = {INTERNAL_TOKEN_HEADER: token.get_secret_value()} if token else {}

    async def check(self, upload: StoredUpload) -> float | None:
        request = IntakeRequest(
            clips=list(upload.clips), consent_recording=upload.consent_recording
        )
        path = INTAKE_PATH.format(job_id=upload.job_id)
        body = request.model_dump_json().encode()
        status, payload = await self.ask(upload.job_id, path, body, self.headers)
        if status != 200:
            raise refusal(status, payload)
        try:
            return IntakeAnswer.model_validate_json(payload).speaker_similarity
        except ValidationError as exc:
            raise ApiError("upstream_failed", f"a worker's intake answered {exc}") from exc


def refusal(status: int, payload: bytes) -> ServiceError:
    """A worker's error answer to an intake check as the error it was: its code, where the
    table gives that code this status and the upload routes answer it; otherwise (a worker
    of another version, a token it refused) 502 ``upstream_failed``."""
    try:
        error = json.loads(payload)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "", payload[:200].decode(errors="replace")
    kind = ERRORS.get(code)
    if kind is not None and kind.status == status and kind.answered_by & UPLOADS:
        return ServiceError(message, code=code)
    return ApiError("upstream_failed", f"a worker's intake answered HTTP {status}: {message}")
