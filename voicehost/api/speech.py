"""The speech resource's contract: ``POST /v1/audio/speech`` and its captioned form, their
OpenAPI operations and models. Who answers them is each role's: ``voicehost.api.server``
speaks in this process, a gateway (``voicehost.cluster.gateway``) proxies to a worker; both
fill the route table's speech slots (``voicehost.api.routes``)."""

from __future__ import annotations

from voicehost.api.openapi import VOICE_VERSION, Json, Models, json_body, operation, ref
from voicehost.api.schemas import (
    CaptionedSpeech,
    CaptionedSpeechRequest,
    ErrorDetail,
    SpeechRequest,
)
from voicehost.audio.formats import CONTENT_TYPES

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


def _operations() -> dict[str, Json]:
    """The OpenAPI operations of the speech routes (their error answers: the error table's)."""
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
    return {
        "speak": speak,
        "speak_captioned": captioned,
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = (
    (SpeechRequest, "validation"),
    (CaptionedSpeechRequest, "validation"),
    (CaptionedSpeech, "serialization"),
)
