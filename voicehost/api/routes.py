"""The public API's route table and the application every front end starts from.

``voicehost serve``, a cluster worker and a gateway answer the same routes; only speech and
health differ (spoken here, or proxied to a worker), so those handlers are parameters.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web

from voicehost.api import audit, lexicons, models, playground, voices
from voicehost.api.auth import AUTH, Authenticator, redact_access_log
from voicehost.api.edge import (
    MAX_JSON_BODY_BYTES,
    SERVICE,
    Handler,
    VoiceService,
    auth_middleware,
    error_middleware,
    name_request,
)
from voicehost.api.openapi import openapi
from voicehost.config import Settings


async def metrics(request: web.Request) -> web.Response:
    body = request.app[SERVICE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def public_app(
    settings: Settings,
    role: Literal["serve", "worker", "gateway"],
    service: VoiceService,
    *,
    speech: Handler,
    speech_ws: Handler,
    healthz: Handler,
    readyz: Handler,
) -> web.Application:
    """An application answering the public API, with the edge's middleware and ``role``'s
    authentication; the caller adds its own routes and lifecycle."""
    app = web.Application(
        middlewares=[error_middleware, auth_middleware], client_max_size=MAX_JSON_BODY_BYTES
    )
    app[AUTH] = Authenticator.from_settings(settings, role)
    app[SERVICE] = service
    redact_access_log()
    app.on_response_prepare.append(name_request)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/speech/ws", speech_ws)
    app.router.add_get("/v1/audio/voices", voices.list_voices)
    app.router.add_get("/v1/voices", voices.list_voices)
    voices.add_routes(app)
    audit.add_routes(app)
    lexicons.add_routes(app)
    app.router.add_get("/v1/models", models.list_models)
    app.router.add_get("/v1/models/{model}", models.get_model)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    playground.add_routes(app)
    return app
