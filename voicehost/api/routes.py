"""The public API's route table and the application every front end starts from.

Each route is declared once, here: its method, path, handler, who may call it and its OpenAPI
operation. The app's router, the authentication's scopes (``auth.ROUTE_ACCESS``) and the OpenAPI
document's paths are all derived from the table, so they cannot drift; ``tests/api/test_openapi.py``
fails on a route without its documentation.

``voicehost serve``, a cluster worker and a gateway answer the same routes; only speech and
health differ (spoken here, or proxied to a worker), so the table names those handlers and each
role supplies its own (``RoleHandler``). A role's own routes (the worker's ``/internal/...``, the
gateway's ``/v1/cluster``) are ``Route`` entries of the same kind, passed in by that role.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Literal

from aiohttp import web

from voicehost.api import (
    audit,
    jobs,
    lexicons,
    models,
    playground,
    realtime,
    speech,
    tokens,
    uploads,
    voices,
    webrtc,
)
from voicehost.api.auth import (
    ADMIN,
    AUTH,
    INTERNAL,
    INTERNAL_PREFIX,
    PUBLIC,
    ROUTE_ACCESS,
    Access,
    Authenticator,
    redact_access_log,
)
from voicehost.api.edge import (
    MAX_JSON_BODY_BYTES,
    ROUTE_OPERATIONS,
    SERVICE,
    Handler,
    VoiceService,
    auth_middleware,
    error_middleware,
    name_request,
    quiet_malformed_requests,
)
from voicehost.api.openapi import (
    DOCUMENT,
    DocumentedRoute,
    Json,
    Models,
    build_document,
    json_body,
    operation,
    status_body,
)
from voicehost.config import Settings
from voicehost.tenancy.keys import SPEECH_TOKEN
from voicehost.webrtc.ice import configure_ice

# the handlers named in the table and supplied by each role (spoken here, or proxied to a worker)
RoleHandler = Literal[
    "speech", "speech_captioned", "speech_ws", "speech_webrtc", "healthz", "readyz"
]
SYNTHESIZE = frozenset({"synthesize"})
SPEAK = SYNTHESIZE | {SPEECH_TOKEN}  # the speech routes: a speech token's too, and only these
VOICES = frozenset({"voices"})
READ = SYNTHESIZE | VOICES  # listings a speaking key needs as much as a managing one


@dataclasses.dataclass(frozen=True)
class Route:
    """One route: ``method`` (a GET answers HEAD too) on ``path``, answered by ``handler`` (or,
    named, the role's own), open to ``access``, documented by the OpenAPI operation
    ``operation`` (its id; ``None`` only for an internal route, which is no public API)."""

    method: str
    path: str
    handler: Handler | RoleHandler
    access: Access
    operation: str | None


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document of the app's own routes."""
    return web.json_response(request.app[DOCUMENT])


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


CAPTIONED_PATH = "/v1/audio/speech/captioned"
VOICE = "/v1/voices/{voice_id}"
VERSION = VOICE + "/versions/{version}"
JOB = "/v1/jobs/{job_id}"
LEXICON = "/v1/lexicons/{name}"

PUBLIC_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/audio/speech", "speech", SPEAK, "speak"),
    Route("POST", CAPTIONED_PATH, "speech_captioned", SPEAK, "speak_captioned"),
    Route("GET", "/v1/audio/speech/ws", "speech_ws", SPEAK, "speak_realtime"),
    Route("POST", webrtc.WEBRTC_PATH, "speech_webrtc", SPEAK, "speak_webrtc"),
    Route("PATCH", webrtc.SESSION_PATH, webrtc.update_session, SPEAK, "update_webrtc"),
    Route("DELETE", webrtc.SESSION_PATH, webrtc.end_session, SPEAK, "end_webrtc"),
    Route("POST", "/v1/tokens", tokens.mint_token, SYNTHESIZE, "mint_token"),
    Route("GET", "/v1/audio/voices", voices.list_voices, READ, "list_audio_voices"),
    Route("GET", "/v1/voices", voices.list_voices, READ, "list_voices"),
    Route("POST", "/v1/voices", uploads.create_voice, VOICES, "create_voice"),
    Route("GET", VOICE, voices.get_voice, VOICES, "get_voice"),
    Route("DELETE", VOICE, voices.delete_voice, VOICES, "delete_voice"),
    Route("POST", VOICE + "/publish", voices.publish_voice, VOICES, "publish_voice"),
    Route("POST", VOICE + "/versions", uploads.add_version, VOICES, "add_version"),
    Route("GET", VOICE + "/versions", voices.list_versions, VOICES, "list_versions"),
    Route("POST", VERSION + "/promote", voices.promote_version, VOICES, "promote_version"),
    Route("DELETE", VERSION, voices.delete_version, VOICES, "delete_version"),
    Route("GET", JOB, jobs.get_job, VOICES, "get_job"),
    Route("DELETE", JOB, jobs.cancel_job, VOICES, "cancel_job"),
    Route("POST", JOB + "/retry", jobs.retry_job, VOICES, "retry_job"),
    # a tenant's key reads its own voices' events, and its own tenant's usage
    Route("GET", "/v1/audit", audit.list_audit, VOICES, "list_audit"),
    Route("GET", "/v1/usage", audit.usage_report, READ, "usage_report"),
    Route("GET", "/v1/lexicons", lexicons.list_lexicons, READ, "list_lexicons"),
    Route("GET", LEXICON, lexicons.get_lexicon, READ, "get_lexicon"),
    Route("PUT", LEXICON, lexicons.put_lexicon, VOICES, "put_lexicon"),
    Route("DELETE", LEXICON, lexicons.delete_lexicon, VOICES, "delete_lexicon"),
    Route("GET", "/v1/models", models.list_models, READ, "list_models"),
    Route("GET", "/v1/models/{model}", models.get_model, READ, "get_model"),
    Route("GET", "/healthz", "healthz", PUBLIC, "healthz"),
    Route("GET", "/readyz", "readyz", PUBLIC, "readyz"),
    # admin, or open with VOICEHOST_METRICS_PUBLIC (auth.METRICS_ROUTE)
    Route("GET", "/metrics", metrics, ADMIN, "metrics"),
    Route("GET", "/openapi.json", openapi, PUBLIC, "openapi"),
    # the playground's page and files: open, the page asks for a key itself
    Route("GET", "/", playground.page, PUBLIC, "playground"),
    Route("GET", "/playground", playground.page, PUBLIC, "playground_alias"),
    Route("GET", playground.FILE_ROUTE, playground.page_file, PUBLIC, "playground_file"),
)


def _service_operations() -> dict[str, Json]:
    """The OpenAPI operations of the service's own routes: health, metrics, this document."""

    def probe(summary: str, value: str) -> Json:
        return operation(summary, {"200": json_body(status_body(value), "Yes.")}, tag="service")

    return {
        "healthz": probe("Liveness: can this process serve?", "ok"),
        "readyz": probe("Readiness: is the engine warm (and not draining)?", "ready"),
        "metrics": operation(
            "Prometheus metrics (needs an admin key when `VOICEHOST_METRICS_PUBLIC` is off)",
            {
                "200": {
                    "description": "Prometheus text format 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
            },
            tag="service",
        ),
        "openapi": operation(
            "This document",
            {"200": json_body({"type": "object"}, "The OpenAPI 3.1 document.")},
            tag="service",
        ),
    }


# Each resource's module holds its handlers, its OpenAPI operations and its models together;
# the document is built from them (and the error table) for the routes an app answers.
RESOURCES = (
    speech,
    realtime,
    webrtc,
    tokens,
    voices,
    uploads,
    jobs,
    audit,
    lexicons,
    models,
    playground,
)
OPERATIONS: dict[str, Json] = {
    **{name: op for resource in RESOURCES for name, op in resource.OPERATIONS.items()},
    **_service_operations(),
}
MODELS: Models = tuple(model for resource in RESOURCES for model in resource.MODELS)


def add_route(app: web.Application, route: Route, handler: Handler) -> None:
    if route.method == "GET":
        app.router.add_get(route.path, handler)  # and HEAD
    else:
        app.router.add_route(route.method, route.path, handler)


def public_app(
    settings: Settings,
    role: Literal["serve", "worker", "gateway"],
    service: VoiceService,
    role_handlers: Mapping[RoleHandler, Handler],
    own_routes: Iterable[Route] = (),
    own_operations: Mapping[str, Json] | None = None,
    own_models: Models = (),
) -> web.Application:
    """An application answering the public API and ``own_routes`` (with their OpenAPI
    ``own_operations`` and ``own_models``), with the edge's middleware and ``role``'s
    authentication; ``role_handlers`` are its speech and health handlers. The caller adds its own
    lifecycle."""
    app = web.Application(
        middlewares=[error_middleware, auth_middleware], client_max_size=MAX_JSON_BODY_BYTES
    )
    app[AUTH] = Authenticator.from_settings(settings, role)
    app[SERVICE] = service
    app[webrtc.PEERS] = webrtc.PeerSessions(settings)
    refused = service.metrics.webrtc_candidates_refused
    configure_ice(settings, lambda reason: refused.labels(reason).inc())
    app.on_cleanup.append(webrtc.close_sessions)
    redact_access_log()
    quiet_malformed_requests(service.metrics)
    app.on_response_prepare.append(name_request)
    routes = (*PUBLIC_ROUTES, *own_routes)
    for route in routes:
        handler = role_handlers[route.handler] if isinstance(route.handler, str) else route.handler
        add_route(app, route, handler)
    app[ROUTE_ACCESS] = route_access(routes)
    app[ROUTE_OPERATIONS] = {
        (r.method, r.path): (r.operation, r.access != PUBLIC) for r in routes if r.operation
    }
    known = {**OPERATIONS, **(own_operations or {})}
    app[DOCUMENT] = build_document(documented(routes), known, (*MODELS, *own_models))
    return app


def document() -> Json:
    """The OpenAPI document of ``voicehost serve`` (a gateway's adds its own routes)."""
    return build_document(documented(PUBLIC_ROUTES), OPERATIONS, MODELS)


def documented(routes: Iterable[Route]) -> list[DocumentedRoute]:
    return [(r.method, r.path, r.operation, r.access) for r in routes if r.operation is not None]


def route_access(routes: Iterable[Route]) -> dict[tuple[str, str], Access]:
    """(method, path) -> who may call it, for the authentication."""
    table: dict[tuple[str, str], Access] = {}
    for route in routes:
        name = f"{route.method} {route.path}"
        if (route.method, route.path) in table:
            raise ValueError(f"{name} is declared twice")
        if route.path.startswith(INTERNAL_PREFIX) != (route.access == INTERNAL):
            raise ValueError(f"{name}: internal routes, and only they, are under {INTERNAL_PREFIX}")
        if route.access != INTERNAL and route.operation is None:
            raise ValueError(f"{name} has no OpenAPI operation")
        table[(route.method, route.path)] = route.access
    return table


__all__ = ["ADMIN", "INTERNAL", "PUBLIC", "PUBLIC_ROUTES", "READ", "VOICES", "Route", "public_app"]
