"""The HTTP edge every front end shares (``voicehost serve``, a cluster worker, a gateway).

The one error shape (``{"error": {"code", "message"}}``, built here for responses, denials,
realtime ``error`` events and a gateway's cut stream), the middleware that turns exceptions and
denied callers into it, request bodies parsed into the wire schemas with one validation message,
and voice lookup over any ``VoiceDirectory`` (the speech request's own checks are the speech
resource's, ``voicehost.api.speech``). The route table that
uses these is ``voicehost.api.routes``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from typing import Protocol, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError

from voicehost.api.auth import (
    AUTH,
    INTERNAL_TOKEN_HEADER,
    PRINCIPAL,
    AccessDenied,
    identify,
    request_principal,
)
from voicehost.api.errors import ApiError, ErrorDetail, ErrorResponse, documented, kind_of
from voicehost.api.listeners import Listener
from voicehost.audio.encoding import EncodingFailed
from voicehost.cloning.intake import Intake
from voicehost.cloning.jobs import CloneJobs
from voicehost.config import Settings
from voicehost.errors import ServiceError, validation_message
from voicehost.ids import (
    checked_job_id,
    checked_version,
    checked_voice_id,
    split_voice_ref,
)
from voicehost.metrics import SpeechMetrics
from voicehost.serving import ServingProcess
from voicehost.speech.admission import Refused
from voicehost.tenancy.audit import Action, AuditTrail, Change, actor_of
from voicehost.tenancy.keys import Principal, can_see
from voicehost.tenancy.lexicons import LexiconStore
from voicehost.tenancy.usage import UsageLedger
from voicehost.voices.voice import (
    RegistryRebuilding,
    UnusableVersion,
    Voice,
    VoiceDirectory,
    VoiceNotFound,
)

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WORKER_HEADER = "X-Voicehost-Worker"  # which worker served a request (cluster mode)
FRONTEND_HEADER = "X-Voicehost-Frontend"  # which of a host's front ends answered (--frontends)
VERSION_HEADER = "X-Voicehost-Voice-Version"  # which version of the voice a response speaks
# A JSON body (speech, routing) is read whole: 1 MiB holds VOICEHOST_MAX_INPUT_CHARS' default of
# 100000 characters however they are escaped; uploads stream under their own caps.
MAX_JSON_BODY_BYTES = 1 << 20
PATH_IDS = {"voice_id": checked_voice_id, "job_id": checked_job_id}


class VoiceService(Protocol):
    """What the shared routes need: a serving process and a gateway both provide it."""

    settings: Settings
    metrics: SpeechMetrics
    voices: VoiceDirectory
    jobs: CloneJobs
    intake: Intake  # an upload's checks: this process's own, or a gateway's asked of a worker
    audit: AuditTrail
    usage: UsageLedger
    lexicons: LexiconStore


SERVICE = web.AppKey("service", VoiceService)
# (method, path) -> (its OpenAPI operation, whether an API key guards it): what an error answer
# is checked against (``check_documented``); set by ``voicehost.api.routes``
ROUTE_OPERATIONS = web.AppKey("route_operations", dict)
SERVING = web.AppKey(
    "serving", ServingProcess
)  # the engine's process (serve, worker): not a gateway


# --- the one error shape ---------------------------------------------------------------------


def error_body(code: str, message: str) -> dict[str, object]:
    return ErrorResponse(error=ErrorDetail(code=code, message=message)).model_dump()


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response(error_body(code, message), status=status)


def error_event(code: str, message: str) -> dict[str, object]:
    """The error as a realtime or SSE event: ``{"type": "error", "error": {...}}``."""
    return {"type": "error", **error_body(code, message)}


SYNTHESIS_FAILED = ("synthesis_failed", "synthesis failed after the stream had started")
ENCODING_FAILED = ("encoding_failed", "encoding the audio failed after the stream had started")


def stream_failure(exc: BaseException) -> tuple[str, tuple[str, str]]:
    """The stage and the error a stream that failed mid-way ends with (``end_broken_stream``):
    its encoding's (an encoding process lost), or the synthesis'."""
    if isinstance(exc, EncodingFailed):
        return "encoding", ENCODING_FAILED
    return "synthesis", SYNTHESIS_FAILED


async def end_broken_stream(
    request: web.Request,
    response: web.StreamResponse | Listener,
    sse: bool,
    stage: str,
    error: tuple[str, str],
    exc: BaseException | str,
) -> None:
    """End a stream that failed after its first byte, so the client can tell it from one that
    finished (never a second response written into the first): an SSE stream gets an
    ``error`` event (``error``: code and message) and ends; a realtime listener gets it as a
    message and an end that reads as a failure (a socket's close with 1011); raw audio is cut,
    its connection closed without the last chunk of its chunked body. Counted in
    ``voicehost_stream_errors_total{stage}`` and logged once with the request id. Every
    streaming route of ``serve`` and of the gateway ends this way."""
    request.app[SERVICE].metrics.stream_errors.labels(stage).inc()
    log.warning(
        "stream %s cut mid-way (%s): %s",
        request_id(request),
        stage,
        exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}",
    )
    if isinstance(response, Listener):
        await response.fail(error_event(*error))
        return
    if sse:
        data = f"data: {json.dumps(error_event(*error))}\n\n".encode()
        with suppress(ConnectionError):
            await response.write(data)
            await response.write_eof()
        return
    if request.transport is not None:  # no last chunk: the client sees a cut stream
        request.transport.close()


def answer(request: web.Request, exc: ServiceError) -> web.Response:
    """``exc`` as the one error shape, with the table's status (``voicehost.api.errors``):
    ``Retry-After`` where waiting helps (an admission refusal's own seconds, else 1),
    ``WWW-Authenticate`` on a 401; counted and checked against the operation's documentation."""
    kind = kind_of(exc)
    response = error_response(kind.status, exc.code, exc.message)
    if kind.retry_after:
        response.headers["Retry-After"] = str(getattr(exc, "retry_after", 1))
    if kind.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="voicehost"'
    service = request.app.get(SERVICE)  # (a bare app of the auth tests has none)
    if service is not None:
        service.metrics.errors.labels(exc.code).inc()
        check_documented(request, exc.code)
    return response


def check_documented(request: web.Request, code: str) -> None:
    """An error answer its operation's OpenAPI text does not list is counted
    (``voicehost_undocumented_errors_total``) and logged: the suite's servers fail on one."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or request.match_info.http_exception is not None:
        return  # the router's own 404 or 405: no operation
    method = "GET" if request.method == "HEAD" else request.method
    found = request.app.get(ROUTE_OPERATIONS, {}).get((method, resource.canonical))
    if found is None:
        return  # an internal route: no public operation
    operation, keyed = found
    if not documented(operation, keyed, code):
        request.app[SERVICE].metrics.undocumented_errors.labels(operation, code).inc()
        log.error("%s answered %r, which its OpenAPI operation does not list", operation, code)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of a handler as the one error shape: a ``ServiceError`` (the domain's,
    or a handler's ``ApiError``) with the error table's status; Redis unreachable, a body that
    cannot be read and aiohttp's own HTTP errors likewise; anything else a logged 500."""
    try:
        return await handler(request)
    except RegistryRebuilding as exc:  # a voice route's lookup in Redis's gap
        if not can_see(request_principal(request), exc.tenant, held=exc.held):
            return answer(request, VoiceNotFound(exc.voice_id))  # as outside the gap
        return answer(request, exc)
    except ServiceError as exc:
        return answer(request, exc)
    except RedisError as exc:
        log.warning("redis unavailable on %s %s: %s", request.method, request.path, exc)
        return answer(request, ApiError("redis_unavailable", "the cluster's Redis is unavailable"))
    except web.RequestPayloadError as exc:  # a body aiohttp could not decode, or cut short
        reason = str(exc).split("message:", 1)[-1].strip() or "it ended early"
        response = answer(
            request, ApiError("invalid_body", f"the request body is unreadable: {reason}")
        )
        response.force_close()  # the connection's framing is lost: say so, then close it
        # and the rest of the body is not read: aiohttp would read it after the response to
        # keep the connection, meet the same error, and log it as an unhandled exception
        request.content.feed_eof()
        return response
    except web.HTTPRequestEntityTooLarge:
        message = f"a JSON body is at most {MAX_JSON_BODY_BYTES} bytes"
        return answer(request, ApiError("body_too_large", message))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        response = error_response(exc.status, code, exc.reason)
        check_documented(request, code)
        if "Allow" in exc.headers:  # a 405 says which methods the route takes
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except ConnectionResetError:
        raise  # the client went away; nothing to answer
    except Exception as exc:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return answer(request, ApiError("internal", f"internal error: {type(exc).__name__}"))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Sets the request's principal (``voicehost.api.auth.identify``); a denied caller gets 401
    (with ``WWW-Authenticate``) or 403 before any handler runs."""
    try:
        request[PRINCIPAL] = identify(request.app[AUTH], request)
    except AccessDenied as exc:
        service = request.app.get(SERVICE)  # (a bare app of the auth tests has none)
        if exc.principal is not None and service is not None:  # a key refused for its scope
            await service.audit.record(scope_refusal(request, exc))
        return answer(request, exc)
    principal = request[PRINCIPAL]
    auth = request.app[AUTH]
    if (
        isinstance(principal, Principal)
        and auth.rate_limited(principal.key_id)  # most keys have no rate: nothing more to do
        and not auth.is_gateway(request.headers.get(INTERNAL_TOKEN_HEADER))  # counted there
    ):
        if (retry := auth.over_rate(principal.key_id)) is not None:
            message = "this API key has made its most requests this minute"
            return answer(request, Refused("rate_limited", message, retry))
    return await handler(request)


# --- request ids and the audit trail ----------------------------------------------------------

REQUEST_ID_HEADER = "X-Request-Id"  # a client's own (kept if it is sane) or one made here
REQUEST_ID = web.RequestKey("request_id", str)
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def request_id(request: web.Request) -> str:
    """The request's id: the ``X-Request-Id`` it was sent with (a gateway forwards its own),
    else a new one; answered in the same header and recorded with its audit events."""
    if REQUEST_ID not in request:
        sent = request.headers.get(REQUEST_ID_HEADER, "")
        request[REQUEST_ID] = sent if _REQUEST_ID.fullmatch(sent) else uuid.uuid4().hex
    return request[REQUEST_ID]


async def name_request(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[REQUEST_ID_HEADER] = request_id(request)


def change(request: web.Request, action: Action, **fields: object) -> Change:
    """What ``request`` changed, as its caller's audit event (``fields``: ``Change``'s)."""
    actor = actor_of(request_principal(request))
    return Change(action, actor, request_id=request_id(request), **fields)  # type: ignore[arg-type]


async def record(request: web.Request, action: Action, **fields: object) -> None:
    """Put what ``request`` changed on the service's audit trail."""
    await request.app[SERVICE].audit.record(change(request, action, **fields))


def scope_refusal(request: web.Request, denied: AccessDenied) -> Change:
    route = request.match_info.route.resource
    return Change(
        "auth.scope_refused",
        actor_of(denied.principal),  # type: ignore[arg-type]
        tenant=denied.principal.tenant if denied.principal is not None else None,
        request_id=request_id(request),
        details={
            "method": request.method,
            "route": route.canonical if route is not None else request.path,
            "message": denied.message,
        },
    )


# --- requests --------------------------------------------------------------------------------


_SURROGATE = re.compile("[\ud800-\udfff]")


def load_json(text: str) -> object:
    """``text`` parsed as JSON; ``ValueError`` saying why for what is not, for nesting too deep
    to parse, and for a string holding an unpaired UTF-16 surrogate (``"\\ud800"``: no UTF-8
    encoding, the tokenizer's included, takes one)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from exc
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                raise ValueError("a string holds an unpaired UTF-16 surrogate")
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


def json_object(body: bytes | str) -> dict[str, object]:
    """The JSON object ``body`` holds (bytes: UTF-8): 400 ``invalid_json`` or
    ``invalid_request`` otherwise."""
    try:
        payload = load_json(body.decode() if isinstance(body, bytes) else body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("invalid_json", f"the body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ApiError("invalid_request", "the body must be a JSON object")
    return payload


def validated(model: type[Body], payload: object) -> Body:
    """``payload`` as ``model``: 400 ``invalid_request`` naming each problem otherwise."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApiError("invalid_request", validation_message(exc)) from exc


async def read_json_object(request: web.Request) -> dict[str, object]:
    """The JSON object a request's body holds (``json_object``: JSON is UTF-8, RFC 8259)."""
    return json_object(await request.read())


async def read_body(request: web.Request, model: type[Body]) -> Body:
    """The JSON body as ``model``: 400 ``invalid_json`` or ``invalid_request`` otherwise."""
    return validated(model, await read_json_object(request))


# --- voices ----------------------------------------------------------------------------------


async def find_voice(
    directory: VoiceDirectory,
    ref: str,
    principal: Principal | None,
    aliases: Mapping[str, str] | None = None,
) -> Voice:
    """The voice ``principal`` speaks with, ``ref`` naming its live version (``anna``) or a
    pinned one (``anna@3``): 400 for an id that breaks the pattern (as on every route), 404 if
    there is none (or no such version, or it is another tenant's, or a held voice or version it
    may not manage), 422 if its adapter is unusable (told only to an admin or in open mode: its
    tenant is unknown). A held voice is spoken for its tenant and admins, to listen before
    publishing.

    ``aliases`` (``VOICEHOST_VOICE_ALIASES``): an id that names no voice ``principal`` can see
    is looked up as the voice its alias names; a voice of that id it can see comes first."""
    voice_id, version = split_voice_ref(ref)
    if voice_id not in directory.builtin:
        checked_voice_id(voice_id)
    if principal is not None and principal.voices is not None and voice_id not in principal.voices:
        allowed = ", ".join(sorted(principal.voices))
        raise ApiError("voice_not_allowed", f"this token speaks only {allowed}")
    try:
        voice = await directory.find(voice_id, version)
    except RegistryRebuilding as exc:  # it exists: retry soon (a socket gets retry_after too)
        if not can_see(principal, exc.tenant, held=exc.held):
            raise VoiceNotFound(ref) from None  # another's: as outside the gap
        raise Refused("registry_rebuilding", str(exc), 1) from exc
    seen = voice is not None and can_see(principal, voice.tenant, held=voice.status == "held")
    if not seen and version is None and aliases and voice_id in aliases:
        target = aliases[voice_id]
        try:
            return await find_voice(directory, target, principal)
        except VoiceNotFound:
            message = f"voice {voice_id!r} is an alias of {target!r}, which does not exist"
            raise VoiceNotFound(voice_id, message) from None
    if voice is None:
        broken = directory.broken(voice_id, version)
        if broken is not None and (principal is None or principal.admin):
            raise UnusableVersion(f"voice {ref!r} is unusable: {broken}")
        raise VoiceNotFound(ref)
    if not can_see(principal, voice.tenant, held=voice.status == "held"):
        raise VoiceNotFound(ref)
    return voice


def path_version(request: web.Request) -> int:
    """The version number in the route's path: 400 unless it is one (1, 2, ...)."""
    return checked_version(request.match_info["version"])


def query_value(request: web.Request, name: str) -> str | None:
    """An optional query value: absent or empty (``?since=``, as a generated client sends an
    unset one), it is unset."""
    return request.query.get(name) or None


def path_id(request: web.Request, key: str) -> str:
    """A voice or job id from the route's path (aiohttp has percent-decoded it): 400 unless it
    matches the id pattern whole."""
    return PATH_IDS[key](request.match_info[key])


# --- a quiet log under attack -----------------------------------------------------------------

MALFORMED_LOG_SECONDS = 60.0  # one line per client address at most this often
MALFORMED_ADDRESSES = 10_000  # addresses remembered; past it, forgotten all at once


class MalformedRequests(logging.Filter):
    """aiohttp logs each request it cannot parse (a duplicate Content-Length, a folded header,
    a header line over its limit) as "Error handling request from ADDR" with a traceback at
    ERROR: a client could write those at line rate. Each becomes one WARNING line (status,
    reason, client address), at most one per address per ``interval`` seconds, and every one
    is counted (``voicehost_malformed_requests_total``). A handler's own failure (a 500) is
    left as aiohttp logs it."""

    def __init__(self, counter: Counter, interval: float = MALFORMED_LOG_SECONDS) -> None:
        super().__init__()
        self.counter = counter
        self.interval = interval
        self.logged: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        self.counter.inc()
        address = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "?"
        now = time.monotonic()
        if now - self.logged.get(address, -math.inf) < self.interval:
            return False
        if len(self.logged) >= MALFORMED_ADDRESSES:
            self.logged.clear()
        self.logged[address] = now
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = "malformed HTTP request from %s: %s %s (more within %.0f s: counted only)"
        record.args = (address, error.code, str(error.message)[:160], self.interval)
        record.exc_info, record.exc_text = None, None
        return True


def quiet_malformed_requests(metrics: SpeechMetrics) -> None:
    """Install ``MalformedRequests`` on aiohttp's server log (one per process: the last app's
    counter)."""
    logger = logging.getLogger("aiohttp.server")
    for installed in [f for f in logger.filters if isinstance(f, MalformedRequests)]:
        logger.removeFilter(installed)
    logger.addFilter(MalformedRequests(metrics.malformed_requests))
