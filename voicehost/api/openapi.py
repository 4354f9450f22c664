"""``GET /openapi.json``: the OpenAPI 3.1 document of the public API.

Request and response bodies are the pydantic models of ``voicehost.api.schemas``, turned into
JSON Schema here; this module only says which route takes and answers what.
``tests/api/test_openapi`` keeps it true: the paths come from the app's route table
(``voicehost.api.routes``), each route's operation from here by its id.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from voicehost import __version__
from voicehost.api.auth import PUBLIC, WS_ROUTE, Access
from voicehost.api.realtime import MESSAGES
from voicehost.api.schemas import (
    AuditPage,
    CaptionedSpeech,
    CaptionedSpeechRequest,
    CloneJobInfo,
    ConsentRecord,
    ErrorDetail,
    ErrorResponse,
    LexiconDetail,
    LexiconList,
    LexiconSaved,
    LexiconUpload,
    ModelInfo,
    ModelList,
    PublishRequest,
    RealtimeConfig,
    RealtimeControl,
    RealtimeText,
    RouteRequest,
    SpeechRequest,
    UsageReport,
    VersionInfo,
    VersionList,
    VoiceDetail,
    VoiceList,
)
from voicehost.api.tokens import TokenRequest, TokenResponse
from voicehost.audio.formats import CONTENT_TYPES
from voicehost.ids import JOB_ID_PATTERN, VERSION_PATTERN, VOICE_ID_PATTERN
from voicehost.tenancy.lexicons import LEXICON_NAME_PATTERN

OPENAPI_VERSION = "3.1.0"
REF_TEMPLATE = "#/components/schemas/{model}"

Json = dict[str, Any]

MODELS: tuple[tuple[type[BaseModel], JsonSchemaMode], ...] = (
    (SpeechRequest, "validation"),
    (CaptionedSpeechRequest, "validation"),
    (RealtimeConfig, "validation"),
    (RealtimeText, "validation"),
    (RealtimeControl, "validation"),
    (PublishRequest, "validation"),
    (RouteRequest, "validation"),
    (LexiconUpload, "validation"),
    (LexiconSaved, "serialization"),
    (LexiconList, "serialization"),
    (LexiconDetail, "serialization"),
    (ConsentRecord, "validation"),
    (VersionList, "serialization"),
    (VersionInfo, "serialization"),
    (VoiceList, "serialization"),
    (ModelList, "serialization"),
    (ModelInfo, "serialization"),
    (VoiceDetail, "serialization"),
    (CloneJobInfo, "serialization"),
    (AuditPage, "serialization"),
    (UsageReport, "serialization"),
    (CaptionedSpeech, "serialization"),
    (TokenRequest, "validation"),
    (TokenResponse, "serialization"),
    (ErrorResponse, "serialization"),
)

# Answered by the API-key layer (voicehost.api.auth) when keys are configured, on every route but
# the probes and this document; the other codes of a route come from its handler.
AUTH_ERRORS: dict[int, str] = {
    401: "`missing_api_key` / `invalid_api_key` (auth, when API keys are configured): send "
    "`Authorization: Bearer <key>` (or `X-API-Key`); `invalid_token` / `token_expired`: a speech "
    "token that is not valid, has expired, or whose key is gone.",
    403: "`insufficient_scope` (auth): the key lacks the route's scope; `token_not_allowed`: a "
    "speech token on a route other than speech; `origin_not_allowed`: a token bound to another "
    "page's `Origin`.",
    429: "`rate_limited` (auth): the key's own `requests_per_minute` are spent; retry after "
    "`Retry-After` seconds.",
}
# Answered by admission control (voicehost.speech.admission) to a stream: a speech request or a
# socket.
ADMISSION_ERRORS: dict[int, str] = {
    429: "`quota_exceeded` (admission): the key already holds its most streams; retry after "
    "`Retry-After` seconds.",
    503: "`at_capacity` (admission): the server holds all the real-time streams it can; retry "
    "after `Retry-After` seconds.",
}
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
UNAVAILABLE = "`not_ready`: the engine is warming up, failed or died."
REDIS_DOWN = "`redis_unavailable`: the cluster's Redis is unreachable (cluster mode)."
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


def errors(codes: dict[int, str], *, keyed: bool = True, stream: bool = False) -> dict[str, Json]:
    """Error responses (``{"error": {"code", "message"}}``) by status: the handler's ``codes``,
    plus the API-key errors on a ``keyed`` route and admission's on a ``stream``."""
    merged = dict(codes)
    for status, text in (
        (AUTH_ERRORS if keyed else {}) | (ADMISSION_ERRORS if stream else {})
    ).items():
        merged[status] = f"{merged[status]} {text}" if status in merged else text
    answers: dict[str, Json] = {}
    for status in sorted(merged):
        headers = RETRY_AFTER if status == 429 or (status == 503 and stream) else None
        headers = WWW_AUTHENTICATE if status == 401 else headers
        answers[str(status)] = json_body(ref(ErrorResponse), merged[status], headers)
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


SSE_EVENTS: Json = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "speech.audio.delta"},
                "audio": {"type": "string", "contentEncoding": "base64"},
            },
            "required": ["type", "audio"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "speech.audio.done"},
                "samples": {"type": "integer", "minimum": 0},
            },
            "required": ["type", "samples"],
        },
        {
            "type": "object",
            "description": 'With `timestamps: "word"`: a word, after the audio that ends it.',
            "properties": {
                "type": {"const": "speech.word"},
                "text": {"type": "string"},
                "start": {"type": "integer", "minimum": 0},
                "end": {"type": "integer", "minimum": 0},
                "audio_start": {"type": "number", "minimum": 0},
                "audio_end": {"type": "number", "minimum": 0},
                "aligner": {"type": "string"},
            },
            "required": ["type", "text", "start", "end", "audio_start", "audio_end", "aligner"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "error"}, "error": ref(ErrorDetail)},
            "required": ["type", "error"],
        },
    ]
}


def speech_operations() -> dict[str, Json]:
    audio = {
        content: {"schema": {"type": "string", "format": "binary"}}
        for content in CONTENT_TYPES.values()
    }
    audio["text/event-stream"] = {
        # one event of the stream (OpenAPI 3.2's itemSchema; 3.0/3.1 tools read schema so)
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "description": 'With `stream_format: "sse"`: `data: {"type": "speech.audio.delta", '
            '"audio": "<base64>"}` events, then '
            '`data: {"type": "speech.audio.done", "samples": N}` (or, from a gateway whose '
            'worker failed mid-way, `data: {"type": "error", "error": {...}}`). Each event\'s '
            "data is one of `x-events`, as JSON.",
        },
        "x-events": SSE_EVENTS,
    }
    speak = operation(
        "Speak text (OpenAI-compatible); the audio streams as it is made",
        {
            "200": {
                "description": "The audio, chunked, in `response_format`; or SSE events.",
                "content": audio,
                "headers": VOICE_VERSION,
            },
            **errors(
                {
                    400: "`invalid_json` (not JSON, nested too deeply, an unpaired surrogate) "
                    "/ `invalid_request` / `invalid_voice_id` / `empty_input` / "
                    "`unsupported_format`.",
                    404: "`voice_not_found` (no such voice, or no such version: `voice@n`) / "
                    "`lexicon_not_found`.",
                    413: "`input_too_long`: over `VOICEHOST_MAX_INPUT_CHARS` (also once its "
                    "lexicons have rewritten it), or over the model's context; "
                    "`body_too_large`: a JSON body over 1 MiB.",
                    422: "`voice_unusable`: the voice's adapter failed validation.",
                    500: "`synthesis_failed` / `no_audio`: the engine failed before the first "
                    "audio.",
                    502: "`upstream_failed`: a gateway's workers failed (cluster mode).",
                    503: f"{UNAVAILABLE} {REDIS_DOWN} `no_workers` (gateway).",
                },
                stream=True,
            ),
        },
        tag="speech",
        body={
            "required": True,
            "content": {
                "application/json": {
                    "schema": ref(SpeechRequest),
                    "example": {"input": "Hello there.", "voice": "tara"},
                }
            },
        },
    )
    captioned = operation(
        "Speak text, answered at once with every word's timing (captioned speech)",
        {
            "200": json_body(
                ref(CaptionedSpeech),
                "The audio (base64, in `response_format`) and each word's span and times.",
                VOICE_VERSION,
            ),
            **errors(
                {
                    400: "As `speak`'s.",
                    404: "As `speak`'s.",
                    413: "As `speak`'s.",
                    422: "As `speak`'s.",
                    500: "`synthesis_failed` / `no_audio` / `encoding_failed`: nothing is "
                    "answered but the error.",
                    502: "`upstream_failed`: a gateway's workers failed (cluster mode).",
                    503: f"{UNAVAILABLE} {REDIS_DOWN} `no_workers` (gateway).",
                },
                stream=True,
            ),
        },
        tag="speech",
        description="The same request as `POST /v1/audio/speech`, its words timed as with "
        '`timestamps: "word"`; for callers that want captions and no stream.',
        body={
            "required": True,
            "content": {
                "application/json": {
                    "schema": ref(CaptionedSpeechRequest),
                    "example": {"input": "Hello there.", "voice": "tara", "response_format": "wav"},
                }
            },
        },
    )
    mint = operation(
        "Mint a short-lived speech token for a browser",
        {
            "201": json_body(ref(TokenResponse), "The token, and when it expires."),
            **errors(
                {
                    400: "`invalid_request` (a TTL over an hour, an origin that is not "
                    "`scheme://host`), `invalid_voice_id`.",
                    409: "`no_api_keys`: a server without keys (speak without one).",
                }
            ),
        },
        tag="speech",
        description=(
            "A signed token that speaks for the calling key (which needs `synthesize`) on every "
            "speech transport (HTTP, SSE, the socket as `?api_key=`, WebRTC) and reaches no "
            "other route, for `ttl_seconds` (60 by default, at most 3600), optionally only "
            "`voices` and only with an `Origin` header of `origin`. Its streams count against "
            "the key's quota and usage; it dies with its key. An app's backend mints one and "
            "hands it to its page, so the key never reaches a browser."
        ),
        body={"required": True, "content": {"application/json": {"schema": ref(TokenRequest)}}},
    )
    return {
        "speak": speak,
        "speak_captioned": captioned,
        "speak_realtime": realtime_operation(),
        **webrtc_operations(),
        "mint_token": mint,
    }


def realtime_operation() -> Json:
    kinds = ", ".join(
        f"`{kind}` ([{model.__name__}]({REF_TEMPLATE.format(model=model.__name__)}))"
        for kind, model in MESSAGES.items()
    )
    description = (
        "A WebSocket (OpenAPI cannot describe one; this is its upgrade request). The client "
        f"sends JSON text messages, by `type`: {kinds}. `config` comes first and once; then "
        "`text` pieces as they come, `flush` (speak what is buffered), `cancel` (barge-in: stop "
        "at once, drop what is queued) and finally `end`. The server answers `ready` (with the "
        "voice's `version`), then per "
        "segment `segment.started` (its span in the text sent), the audio as binary messages and "
        "`segment.done`; `cancelled` after `cancel`; `done` and a normal close after `end`; "
        '`{"type": "error", "error": {"code", "message"}}` for a bad message, a bad config '
        "(closed with 1008) or `idle_timeout`."
    )
    return operation(
        "Realtime speech: text in as it comes, audio out (WebSocket)",
        {
            "101": {"description": "Switched to the WebSocket protocol."},
            **errors(
                {400: "`bad_request`: not a WebSocket upgrade request.", 503: UNAVAILABLE},
                stream=True,
            ),
        },
        tag="speech",
        description=description,
    )


def webrtc_operations() -> dict[str, Json]:
    sdp = {"schema": {"type": "string"}}
    description = (
        "The realtime session over WebRTC (the WHIP/WHEP convention). The body is an SDP offer "
        "with an audio section that receives Opus and a data channel labelled `voicehost`; the "
        "answer is the server's SDP, with every candidate in it. The data channel carries the "
        "realtime socket's messages and events (see `speak_realtime`): `config` first; its "
        "`response_format` and `sample_rate` do not apply, the audio is the session's track "
        "(Opus, 48 kHz, 20 ms packets, paced in real time; `ready` says so). `cancel` drops the "
        "audio queued for the track. ICE servers come in `Link` headers (`rel=ice-server`). "
        "The stream is admitted when the config arrives (a refusal: an `error` event with "
        "`retry_after`); until then the offer is pending and holds no stream. No ICE check goes "
        "to a link-local, unspecified, multicast or broadcast candidate, nor to loopback or "
        "private ones unless the service allows them."
    )
    missing = "`session_not_found`: no such session of this key's."
    silent = (
        "`frontend_unavailable`: another front end of this host (`--frontends`), which may "
        "hold the session, did not answer in time; retry after `Retry-After`."
    )
    return {
        "speak_webrtc": operation(
            "Realtime speech over WebRTC: an SDP offer in, the answer out",
            {
                "201": {
                    "description": "The SDP answer.",
                    "content": {"application/sdp": sdp},
                    "headers": {
                        "Location": {
                            "description": "The session: DELETE ends it, PATCH trickles ICE.",
                            "schema": {"type": "string"},
                        },
                        "Link": {
                            "description": 'An ICE server, `<url>; rel="ice-server"`.',
                            "schema": {"type": "string"},
                        },
                    },
                },
                **errors(
                    {
                        400: "`invalid_sdp` (not SDP; a section without its DTLS fingerprint "
                        "or ICE credentials; no candidate ICE may check), `no_audio` (no "
                        "receiving Opus audio), `no_data_channel`.",
                        413: "`body_too_large`: an offer over 64 KiB.",
                        415: "`unsupported_media_type`: not `application/sdp`.",
                        429: "`too_many_pending`: this key, or this client address, has its "
                        "most offers waiting for their peers.",
                        503: UNAVAILABLE + " `at_capacity`: this server holds its most WebRTC "
                        "sessions; `too_many_pending`: its most offers wait for their peers.",
                    },
                    stream=True,
                ),
            },
            tag="speech",
            description=description,
            body={"required": True, "content": {"application/sdp": sdp}},
        ),
        "update_webrtc": operation(
            "Trickled ICE candidates for a WebRTC session",
            {
                "204": {"description": "Added."},
                **errors(
                    {
                        400: "`invalid_sdp`: not a trickle-ICE fragment (RFC 8840), or a "
                        "candidate line that is not one.",
                        404: missing,
                        415: "`unsupported_media_type`: not `application/trickle-ice-sdpfrag`.",
                        503: silent,
                    }
                ),
            },
            tag="speech",
            body={
                "required": True,
                "content": {"application/trickle-ice-sdpfrag": {"schema": {"type": "string"}}},
            },
        ),
        "end_webrtc": operation(
            "End a WebRTC session",
            {
                "204": {"description": "Ended; its stream is freed."},
                **errors({404: missing, 503: silent}),
            },
            tag="speech",
        ),
    }


def voice_operations() -> dict[str, Json]:
    redis = {503: REDIS_DOWN}
    listing = operation(
        "The voices that can be spoken, and adapters that failed validation",
        {"200": json_body(ref(VoiceList), "Every voice the caller may use."), **errors(redis)},
        tag="voices",
    )
    file = {"type": "string", "format": "binary"}
    naming = {
        "name": {"type": "string"},
        "voice_id": {"type": "string", "description": "Default: the name, slugged."},
    }
    consenting = {
        "consent": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The consent record, a JSON `ConsentRecord` (a field or a file): "
            "required to clone from audio where `VOICEHOST_REQUIRE_CONSENT` is on (400 "
            "`consent_required`).",
        },
        "consent_recording": {
            **file,
            "description": "The speaker reading the statement: must be the training audio's "
            "speaker (422 `consent_speaker_mismatch`).",
        },
    }
    upload = {
        "description": "Audio to clone, or a ready-made adapter: one or the other, not both "
        "(400 `ambiguous_upload`).",
        "oneOf": [
            {
                "title": "Clone from audio",
                "type": "object",
                "properties": {
                    "audio": {
                        "type": "array",
                        "items": file,
                        "minItems": 1,
                        "description": "Recordings.",
                    },
                    "transcripts": {**file, "description": "metadata.csv: `file|text` per line."},
                    **naming,
                    **consenting,
                },
                "required": ["audio"],
                "not": {
                    "anyOf": [{"required": ["adapter_config"]}, {"required": ["adapter_model"]}]
                },
            },
            {
                "title": "Register an adapter",
                "type": "object",
                "properties": {
                    "adapter_config": {**file, "description": "A PEFT adapter_config.json."},
                    "adapter_model": {**file, "description": "Its adapter_model.safetensors."},
                    "voice": {**file, "description": "An optional voice.json."},
                    "consent": consenting["consent"],
                    **naming,
                },
                "required": ["adapter_config", "adapter_model"],
                "not": {"required": ["audio"]},
            },
        ],
    }
    location = {"description": "The new resource's URL.", "schema": {"type": "string"}}
    job = wrapped("job", CloneJobInfo)
    create = operation(
        "Clone a voice from audio (a job) or register a ready-made adapter",
        {
            "201": json_body(
                wrapped("voice", VoiceDetail), "The adapter is registered.", {"Location": location}
            ),
            "202": json_body(job, "A clone job is queued.", {"Location": location}),
            **errors(
                {
                    400: "`invalid_multipart` / `invalid_voice_id` / `no_audio` / "
                    "`ambiguous_upload` / `invalid_transcripts` / `missing_transcripts` / "
                    "`not_enough_speech` / `invalid_adapter` / `consent_required` / "
                    "`invalid_consent` / `invalid_request`.",
                    409: "`voice_exists`.",
                    413: "`upload_too_large` / `audio_too_long` / `adapter_too_large`.",
                    415: "`unsupported_media_type`: not multipart; `not_audio`: a file that is "
                    "not audio; `unsupported_audio`: audio of a rate, channel count or codec "
                    "outside the allowlists.",
                    422: "`consent_speaker_mismatch`: the consent recording's speaker is not the "
                    "training audio's.",
                    **redis,
                }
            ),
        },
        tag="voices",
        body={"required": True, "content": {"multipart/form-data": {"schema": upload}}},
    )
    not_found = {400: "`invalid_voice_id`: not a voice id.", 404: "`voice_not_found`.", **redis}
    version_upload = copy.deepcopy(upload)
    for shape in version_upload["oneOf"]:
        shape["properties"].pop("voice_id")
        shape["properties"]["promote"] = {
            "type": "string",
            "enum": ["true", "false"],
            "description": "`false`: keep the live version (default `true`: a version that "
            "passes the gate goes live).",
        }
    versioned = wrapped("version", VersionInfo)
    read_only = "`voice_read_only`: a built-in voice, or a shared one (admins only)."
    bad_version = "`invalid_voice_id` / `invalid_version`: not a voice id or version number."
    no_version = "`voice_not_found` / `version_not_found`."
    add_version = operation(
        "Add a version: clone it from audio (a job) or register a ready-made adapter",
        {
            "201": json_body(
                versioned, "The adapter is the voice's next version.", {"Location": location}
            ),
            "202": json_body(
                job, "A clone job for the next version is queued.", {"Location": location}
            ),
            **errors(
                {
                    400: "`invalid_multipart` / `invalid_voice_id` / `no_audio` / "
                    "`ambiguous_upload` / `invalid_transcripts` / `missing_transcripts` / "
                    "`not_enough_speech` / `invalid_adapter` / `consent_required` / "
                    "`invalid_consent` / `invalid_request`.",
                    403: read_only,
                    404: "`voice_not_found`.",
                    409: "`version_exists`: the voice has a version with this adapter; "
                    "`job_in_progress`: a version of it is being trained.",
                    413: "`upload_too_large` / `audio_too_long` / `adapter_too_large`.",
                    415: "`unsupported_media_type` / `not_audio` / `unsupported_audio`.",
                    422: "`consent_speaker_mismatch`.",
                    **redis,
                }
            ),
        },
        tag="voices",
        description="A version is immutable: one adapter (by checksum) with its own manifest, "
        "data report, evaluation and consent record. Cloned from audio, it needs a consent "
        "record as a new voice does.",
        body={"required": True, "content": {"multipart/form-data": {"schema": version_upload}}},
    )
    no_job = {400: "`invalid_job_id`: not a job id.", 404: "`job_not_found`.", **redis}
    return {
        "list_audio_voices": listing,
        "list_voices": {**listing, "summary": "The voices (same as GET /v1/audio/voices)"},
        "create_voice": create,
        "get_voice": operation(
            "A voice and its manifest",
            {
                "200": json_body(wrapped("voice", VoiceDetail), "The voice."),
                **errors(not_found),
            },
            tag="voices",
        ),
        "delete_voice": operation(
            "Remove an adapter voice: every version, and its consent records",
            {
                "204": {"description": "Removed."},
                **errors(
                    {
                        403: "`voice_read_only`: a built-in or dev voice, or a shared one "
                        "(admins only).",
                        **not_found,
                    }
                ),
            },
            tag="voices",
        ),
        "publish_voice": operation(
            "Publish a held voice: make it ready anyway",
            {
                "200": json_body(wrapped("voice", VoiceDetail), "The voice, ready now."),
                **errors(
                    {
                        400: "`invalid_voice_id`: not a voice id; `invalid_json` / "
                        '`invalid_request`: the body is not `{"reason": "..."}`.',
                        404: "`voice_not_found`: none, another tenant's, or a held voice "
                        "the caller may not manage.",
                        409: "`voice_not_held`: the voice is ready already (or built in).",
                        413: "`body_too_large`: a JSON body over 1 MiB.",
                        **redis,
                    }
                ),
            },
            tag="voices",
            description="A clone that measured below the evaluation gate is held: listed "
            'with `status: "held"` and spoken only for its tenant and admins. Its tenant '
            "or an admin may publish it; the reason, the key and the time are recorded in "
            "its `voice.json` (`published`).",
            body={
                "required": True,
                "content": {
                    "application/json": {
                        "schema": ref(PublishRequest),
                        "example": {"reason": "Listened to it: it sounds like her."},
                    }
                },
            },
        ),
        "add_version": add_version,
        "list_versions": operation(
            "A voice's versions, oldest first, and which is live",
            {
                "200": json_body(ref(VersionList), "The versions."),
                **errors(not_found),
            },
            tag="voices",
        ),
        "promote_version": operation(
            "Make a version the live one (roll forward or back), at once everywhere",
            {
                "200": json_body(versioned, "The version, live now."),
                **errors(
                    {
                        400: bad_version,
                        403: read_only,
                        404: no_version,
                        409: "`version_held`: a held version (publish it first).",
                        422: "`voice_unusable`: its adapter failed validation.",
                        **redis,
                    }
                ),
            },
            tag="voices",
            description="The version it replaces stays servable when pinned (`voice@n`); "
            "streams in flight finish on the version they started with.",
        ),
        "delete_version": operation(
            "Remove a version (not the live one)",
            {
                "204": {"description": "Removed."},
                **errors(
                    {
                        400: bad_version,
                        403: read_only,
                        404: no_version,
                        409: "`version_live`: the live version (promote another first, or "
                        "delete the voice).",
                        **redis,
                    }
                ),
            },
            tag="voices",
        ),
        "get_job": operation(
            "A clone job's state and progress",
            {"200": json_body(job, "The job."), **errors(no_job)},
            tag="jobs",
        ),
        "cancel_job": operation(
            "Cancel a queued or running job; delete a finished one and its inputs",
            {
                "200": json_body(job, "The job, cancelled."),
                "204": {"description": "The finished job is deleted."},
                **errors({409: "`job_busy`: its worker is still stopping.", **no_job}),
            },
            tag="jobs",
        ),
        "retry_job": operation(
            "Queue a job nobody runs again: failed, cancelled, queued or runner_lost",
            {
                "202": json_body(job, "The job, queued."),
                **errors(
                    {
                        409: "`job_not_retryable` / `voice_exists`: the job is done, held or "
                        "held by a runner (running, or its worker is stopping), or the voice id "
                        "is taken.",
                        **no_job,
                    }
                ),
            },
            tag="jobs",
        ),
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


def audit_operations() -> dict[str, Json]:
    since = query_param(
        "since",
        "From this time on: ISO 8601 (UTC unless it names a zone) or Unix seconds.",
        {"type": "string"},
    )
    bad_query = {400: "`invalid_request`: a query parameter out of range or not understood."}
    audit_bad = {
        400: "`invalid_request`: a query parameter out of range or not understood; "
        "`invalid_voice_id`: `voice` is not a voice id."
    }
    return {
        "list_audit": operation(
            "The audit trail: every change to voices and jobs, and scope refusals",
            {"200": json_body(ref(AuditPage), "Events in order."), **errors(audit_bad)},
            tag="audit",
            description="Admins read every event (and the log's `head`); a tenant's key "
            "(`voices` scope) only the events of its tenant's voices and jobs. Each event "
            "carries the SHA-256 of the one before it (`prev`); `voicehost audit verify` "
            "checks the chain.",
            parameters=[
                query_param(
                    "voice",
                    "Only this voice's events (empty: every voice's).",
                    # a voice id, or empty: an empty query value means unset
                    {"type": "string", "pattern": "^(" + VOICE_ID_PATTERN.pattern[1:-1] + ")?$"},
                ),
                since,
                query_param(
                    "after",
                    "Only events after this seq (paging: the answer's `next_after`).",
                    {"type": "integer", "minimum": 0},
                ),
                query_param(
                    "limit",
                    "At most this many events (default 100).",
                    {"type": "integer", "minimum": 1, "maximum": 1000},
                ),
            ],
        ),
        "usage_report": operation(
            "Characters and audio seconds sent, per API key, tenant and voice",
            {"200": json_body(ref(UsageReport), "The sums."), **errors(bad_query)},
            tag="usage",
            description="Counted as audio is sent (a stream cancelled half-way counts what "
            "was sent), summed per minute over every worker of a cluster. Admins read "
            "every tenant's (or `tenant`'s); any other key its own tenant's.",
            parameters=[
                query_param("tenant", "Only this tenant (admins).", {"type": "string"}),
                since,
            ],
        ),
    }


def lexicon_operations() -> dict[str, Json]:
    bad_name = {400: "`invalid_lexicon_name`: not a lexicon name.", 503: REDIS_DOWN}
    missing = {**bad_name, 404: "`lexicon_not_found`: none of the caller's tenant."}
    saved = json_body(ref(LexiconSaved), "Stored.")
    upload = {
        "required": True,
        "content": {
            "application/json": {
                "schema": ref(LexiconUpload),
                "example": {"entries": [{"grapheme": "Kubernetes", "alias": "koo ber net ees"}]},
            },
            "application/pls+xml": {
                "schema": {
                    "type": "string",
                    "description": "A W3C PLS 1.0 document: each `<lexeme>`'s `<grapheme>`s "
                    "say its first `<alias>` (matched as written); lexemes with only "
                    "`<phoneme>`s are skipped. No DTD, entities or external references.",
                }
            },
        },
    }
    location = {"Location": {"description": "The lexicon's URL.", "schema": {"type": "string"}}}
    return {
        "list_lexicons": operation(
            "The caller's tenant's pronunciation lexicons",
            {"200": json_body(ref(LexiconList), "Each lexicon."), **errors({503: REDIS_DOWN})},
            tag="lexicons",
        ),
        "put_lexicon": operation(
            "Store a pronunciation lexicon (JSON or W3C PLS), replacing one of that name",
            {
                "200": saved,
                "201": {**json_body(ref(LexiconSaved), "Stored, new."), "headers": location},
                **errors(
                    {
                        **bad_name,
                        400: "`invalid_lexicon_name` / `invalid_json` / `invalid_request` / "
                        "`invalid_lexicon`: not a lexicon; `unsafe_lexicon`: a PLS document "
                        "with a DTD, entities or nesting deeper than 8, refused unexpanded; "
                        "`lexicon_entry_too_long`: over `VOICEHOST_LEXICON_MAX_ENTRY_CHARS`; "
                        "`too_many_lexicons`: the tenant keeps "
                        "`VOICEHOST_LEXICONS_PER_TENANT` already.",
                        413: "`lexicon_too_large`: over `VOICEHOST_LEXICON_MAX_ENTRIES` "
                        "entries; `body_too_large`: a body over 1 MiB.",
                    }
                ),
            },
            tag="lexicons",
            body=upload,
        ),
        "get_lexicon": operation(
            "A lexicon and its entries",
            {
                "200": json_body(wrapped("lexicon", LexiconDetail), "The lexicon."),
                **errors(missing),
            },
            tag="lexicons",
        ),
        "delete_lexicon": operation(
            "Delete a lexicon",
            {"204": {"description": "Deleted."}, **errors(missing)},
            tag="lexicons",
        ),
    }


def model_operations() -> dict[str, Json]:
    return {
        "list_models": operation(
            "The model names a speech request may send (OpenAI's shape)",
            {"200": json_body(ref(ModelList), "Every name; one model speaks them all.")}
            | errors({}),
            tag="models",
        ),
        "get_model": operation(
            "One model name (OpenAI's shape)",
            {"200": json_body(ref(ModelInfo), "The model.")} | errors({404: "`model_not_found`."}),
            tag="models",
        ),
    }


def service_operations() -> dict[str, Json]:
    def probe(summary: str, value: str, unavailable: str) -> Json:
        return operation(
            summary,
            {
                "200": json_body(status_body(value), "Yes."),
                **errors({503: unavailable}, keyed=False),
            },
            tag="service",
        )

    return {
        "healthz": probe(
            "Liveness: can this process serve?",
            "ok",
            "`failed`: start-up failed or the engine died.",
        ),
        "readyz": probe(
            "Readiness: is the engine warm (and not draining)?",
            "ready",
            "`not_ready` / `no_workers`: not yet, or draining.",
        ),
        "metrics": operation(
            "Prometheus metrics (needs an admin key when `VOICEHOST_METRICS_PUBLIC` is off)",
            {
                "200": {
                    "description": "Prometheus text format 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **errors({}),
            },
            tag="service",
        ),
        "openapi": operation(
            "This document",
            {"200": json_body({"type": "object"}, "The OpenAPI 3.1 document.")},
            tag="service",
        ),
        **playground_operations(),
    }


def playground_operations() -> dict[str, Json]:
    """The web playground (``voicehost.api.playground``): open, it asks for a key itself."""
    page = operation(
        "The web playground: speak, clone, voices (a client of this API, in the browser)",
        {"200": {"description": "The page.", "content": {"text/html": {"schema": TEXT}}}},
        tag="playground",
    )
    typed = {"text/html", "text/css", "text/javascript", "image/svg+xml"}
    page_file = operation(
        "One of the playground's files (scripts, styles, images)",
        {
            "200": {
                "description": "The file, with its content type.",
                "content": {media: {"schema": TEXT} for media in sorted(typed)},
            },
            **errors({404: "`not_found`: the playground has no such file."}, keyed=False),
        },
        tag="playground",
    )
    return {
        "playground": page,
        "playground_alias": page,
        "playground_file": page_file,
    }


def component_schemas() -> dict[str, Json]:
    _, top = models_json_schema(list(MODELS), ref_template=REF_TEMPLATE)
    return top["$defs"]


def cluster_operations() -> dict[str, Json]:
    """A gateway's own view of its cluster (``voicehost.cluster.gateway``), for admins."""
    worker = {
        "type": "object",
        "properties": {
            "id": TEXT,
            "url": TEXT,
            **{
                name: {"type": "integer"}
                for name in (
                    "active_streams",
                    "loaded_adapters",
                    "capacity",
                    "headroom",
                    "gateway_in_flight",
                )
            },
        },
    }
    view = {
        "type": "object",
        "properties": {
            "redis_ok": {"type": "boolean"},
            "workers": {"type": "array", "items": worker},
        },
        "required": ["redis_ok", "workers"],
    }
    owners = {
        "type": "object",
        "properties": {"owners": {"type": "object", "additionalProperties": TEXT}},
        "required": ["owners"],
    }
    return {
        "cluster_view": operation(
            "The workers this gateway routes to, with their load (a gateway's own route)",
            {"200": json_body(view, "The workers."), **errors({})},
            tag="cluster",
        ),
        "cluster_route": operation(
            "Each voice's owner on the ring (a gateway's own route)",
            {
                "200": json_body(owners, "The owners, by voice."),
                **errors(
                    {
                        400: "`invalid_json` / `invalid_request`.",
                        413: "`body_too_large`: a JSON body over 1 MiB.",
                    }
                ),
            },
            tag="cluster",
            body={"required": True, "content": {"application/json": {"schema": ref(RouteRequest)}}},
        ),
    }


@functools.cache
def operations() -> dict[str, Json]:
    """Every operation of the public API, by its id (the route table's ``operation``)."""
    return {
        **speech_operations(),
        **voice_operations(),
        **model_operations(),
        **audit_operations(),
        **lexicon_operations(),
        **service_operations(),
    }


DocumentedRoute = tuple[str, str, str, Access]  # method, path, operation id, who may call it
DOCUMENT = web.AppKey("openapi_document", dict)


def build_document(routes: Iterable[DocumentedRoute], own: Mapping[str, Json]) -> Json:
    """The document of an app answering ``routes``, whose operations are this module's or the
    app's ``own``; each operation's security follows its route's access."""
    known = {**operations(), **own}
    params = path_params()
    paths: dict[str, Json] = {}
    for method, path, operation_id, access in routes:
        if operation_id not in known:
            raise ValueError(f"{method} {path}: no OpenAPI operation {operation_id!r}")
        op = {**copy.deepcopy(known[operation_id]), "operationId": operation_id}
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
        "components": {"schemas": component_schemas(), "securitySchemes": SECURITY_SCHEMES},
    }


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document of the app's own routes."""
    return web.json_response(request.app[DOCUMENT])
