"""``GET /openapi.json``: the OpenAPI 3.1 document of the public API, and what it is built with.

This module knows no resource. Each resource's module (``speech``, ``realtime``, ``webrtc``,
``tokens``, ``voices``, ``uploads``, ``jobs``, ``audit``, ``lexicons``, ``models``,
``playground``) declares its operations beside its handlers (``OPERATIONS``, by id, written with
the helpers here) and the pydantic models they refer to (``MODELS``); ``voicehost.api.routes``
gathers them. ``build_document`` makes the document of an app's routes: each path and its
security from the route table, its operation by id, its error answers from the error table
(``voicehost.api.errors``), the component schemas from the models.
``tests/api/test_openapi`` keeps it true.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from voicehost import __version__
from voicehost.api.auth import PUBLIC, WS_ROUTE, Access
from voicehost.api.errors import ErrorKind, ErrorResponse, answered_by
from voicehost.ids import JOB_ID_PATTERN, VERSION_PATTERN, VOICE_ID_PATTERN
from voicehost.tenancy.lexicons import LEXICON_NAME_PATTERN

OPENAPI_VERSION = "3.1.0"
REF_TEMPLATE = "#/components/schemas/{model}"

Json = dict[str, Any]

# What a resource's module lists of its pydantic models, each with how the document reads it
Models = tuple[tuple[type[BaseModel], JsonSchemaMode], ...]
# The one error shape every route answers (each resource's module lists its own models)
MODELS: Models = ((ErrorResponse, "serialization"),)

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    }
}
VOICE_VERSION = {
    "X-Voicehost-Voice-Version": {
        "description": "The version of the voice spoken (its live one, or the one `voice@n` "
        "pins; 1 for a built-in voice).",
        "schema": {"type": "integer", "minimum": 1},
    }
}
WWW_AUTHENTICATE = {
    "WWW-Authenticate": {"description": "`Bearer realm=...`", "schema": {"type": "string"}}
}
SECURITY_SCHEMES: Json = {
    "bearerAuth": {"type": "http", "scheme": "bearer"},
    "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "apiKeyQuery": {
        "type": "apiKey",
        "in": "query",
        "name": "api_key",
        "description": "On the WebSocket route only (browsers cannot set its headers).",
    },
}
TEXT: Json = {"type": "string"}
# No entry: open (a server without keys); any one of the others when keys are configured.
KEYED: list[Json] = [{}, {"bearerAuth": []}, {"apiKeyHeader": []}]


def ref(model: type[BaseModel]) -> Json:
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def json_body(schema: Json, description: str, headers: Json | None = None) -> Json:
    response: Json = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = headers
    return response


def wrapped(key: str, model: type[BaseModel]) -> Json:
    """``{key: model}``, the envelope the voice and job routes answer in."""
    return {"type": "object", "properties": {key: ref(model)}, "required": [key]}


def status_body(value: str) -> Json:
    return {"type": "object", "properties": {"status": {"const": value}}, "required": ["status"]}


def error_answers(operation_id: str, keyed: bool) -> dict[str, Json]:
    """The error answers of an operation, by status, from the API's error table
    (``voicehost.api.errors``): each code it may answer with what it means (the API-key
    layer's on a ``keyed`` route), ``Retry-After`` where waiting helps, ``WWW-Authenticate``
    on a 401."""
    by_status: dict[int, list[ErrorKind]] = {}
    for kind in answered_by(operation_id, keyed):
        by_status.setdefault(kind.status, []).append(kind)
    answers: dict[str, Json] = {}
    for status, kinds in sorted(by_status.items()):
        text = " ".join(f"`{kind.code}`: {kind.meaning}" for kind in kinds)
        headers = RETRY_AFTER if any(kind.retry_after for kind in kinds) else None
        headers = WWW_AUTHENTICATE if status == 401 else headers
        answers[str(status)] = json_body(ref(ErrorResponse), text, headers)
    return answers


def operation(
    summary: str,
    responses: dict[str, Json],
    *,
    tag: str,
    description: str | None = None,
    parameters: list[Json] | None = None,
    body: Json | None = None,
) -> Json:
    op: Json = {"summary": summary, "tags": [tag], "responses": responses}
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body:
        op["requestBody"] = body
    return op  # its security comes from its route's access (build_document)


def path_param(name: str, description: str, pattern: str | None = None) -> Json:
    schema: Json = {"type": "string"}
    if pattern:
        schema["pattern"] = pattern
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }


def path_params() -> dict[str, Json]:
    """Every path parameter, by name: a route's path names the ones it takes."""
    return {
        "voice_id": path_param("voice_id", "A voice id.", VOICE_ID_PATTERN.pattern),
        "version": path_param(
            "version", "A version of the voice (1, 2, ...).", VERSION_PATTERN.pattern
        ),
        "job_id": path_param("job_id", "A clone job id.", JOB_ID_PATTERN.pattern),
        "name": path_param(
            "name", "A lexicon's name (the caller's tenant's).", LEXICON_NAME_PATTERN.pattern
        ),
        "model": path_param("model", "A model name, as GET /v1/models lists them."),
        "file": path_param("file", "A file name, e.g. `app.js`."),
        "session_id": path_param("session_id", "A WebRTC session's id (its `Location`)."),
    }


def query_param(name: str, description: str, schema: Json) -> Json:
    """An optional query parameter; an empty value means unset (``edge.query_value``)."""
    return {
        "name": name,
        "in": "query",
        "required": False,
        "allowEmptyValue": True,
        "description": description,
        "schema": schema,
    }


def component_schemas(models: Models) -> dict[str, Json]:
    _, top = models_json_schema(list(models), ref_template=REF_TEMPLATE)
    return top["$defs"]


DocumentedRoute = tuple[str, str, str, Access]  # method, path, operation id, who may call it
DOCUMENT = web.AppKey("openapi_document", dict)


def build_document(
    routes: Iterable[DocumentedRoute], known: Mapping[str, Json], models: Models
) -> Json:
    """The document of an app answering ``routes``, each described by its operation in
    ``known`` (by id: what each resource's module declares beside its handlers), its error
    answers from the error table and its security from its route's access; ``models``: the
    pydantic models its operations refer to (``MODELS`` of each resource's module)."""
    params = path_params()
    paths: dict[str, Json] = {}
    for method, path, operation_id, access in routes:
        if operation_id not in known:
            raise ValueError(f"{method} {path}: no OpenAPI operation {operation_id!r}")
        op = {**copy.deepcopy(known[operation_id]), "operationId": operation_id}
        op["responses"] |= error_answers(operation_id, keyed=access != PUBLIC)
        if access == PUBLIC:
            op["security"] = []
        else:
            op["security"] = KEYED + ([{"apiKeyQuery": []}] if path == WS_ROUTE else [])
            op["x-scopes"] = sorted(access)
        item = paths.setdefault(path, {})
        names = re.findall(r"\{(\w+)\}", path)
        if names:
            item["parameters"] = [params[name] for name in names]
        item[method.lower()] = op
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "voicehost",
            "version": __version__,
            "description": "Self-hosted voice-cloning TTS. Errors are always "
            '`{"error": {"code", "message"}}`. When the server is configured with API keys, '
            "every route but `/healthz`, `/readyz` and this document needs one "
            "(`Authorization: Bearer <key>`; 401/403 otherwise; `x-scopes` names the scopes "
            "of which a key needs one, admin holding them all); a stream over its key's quota "
            "or the server's capacity is refused with 429/503 and `Retry-After`.",
        },
        "paths": paths,
        "components": {
            "schemas": component_schemas((*MODELS, *models)),
            "securitySchemes": SECURITY_SCHEMES,
        },
    }
