"""The speech resource's contract: ``POST /v1/audio/speech`` and its captioned form, their
OpenAPI operations and models. Who answers them is each role's: ``voicehost.api.server``
speaks in this process, a gateway (``voicehost.cluster.gateway``) proxies to a worker; both
supply the route table's speech handlers (``voicehost.api.routes.RoleHandler``).
Its checks (nothing to say, too long, an unservable format, word timing where the answer has no
place for it) run in every role before any engine work."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictStr

from voicehost.api.errors import ApiError, ErrorDetail
from voicehost.api.openapi import VOICE_VERSION, Json, Models, json_body, operation, ref
from voicehost.api.schemas import JsonInt, Seed
from voicehost.audio.formats import (
    CONTENT_TYPES,
    FORMATS,
    SAMPLE_RATES,
    TELEPHONE_FORMATS,
    TELEPHONE_RATE,
    output_rate,
)
from voicehost.audio.tempo import MAX_SPEED, MIN_SPEED
from voicehost.config import Settings
from voicehost.ids import VERSION_PATTERN, VOICE_ID_PATTERN
from voicehost.speech.alignment import Aligner
from voicehost.speech.synthesis import SpeakOptions
from voicehost.tenancy.lexicons import LEXICON_NAME_PATTERN
from voicehost.text.stage import TextStage, check_input

# --- its wire models ---


MAX_REQUEST_LEXICONS = 8


SPEAKABLE = r"[^\W_]"  # a letter or a digit somewhere (Python's str.isalnum, as the edge checks)


# a voice id, and a version after @ (the edge's check: ids.is_voice_id, versioning's split)
VOICE_REF_PATTERN = VOICE_ID_PATTERN.pattern[:-1] + "(@" + VERSION_PATTERN.pattern[1:-1] + ")?$"


FORMATS_HELP = (
    "pcm (s16le mono), wav, mp3, opus (Ogg), flac, aac (ADTS), mulaw or alaw (8 kHz only)"
)


# the telephone formats are 8 kHz only (unsupported_format otherwise)
TELEPHONE_RATE_RULE: dict[str, Any] = {
    "if": {
        "properties": {"response_format": {"enum": list(TELEPHONE_FORMATS)}},
        "required": ["response_format"],
    },
    "then": {"properties": {"sample_rate": {"enum": [TELEPHONE_RATE, None]}}},
}


# a stream's word timing comes as SSE events: raw audio has no place for it
TIMESTAMPS_RULE: dict[str, Any] = {
    "if": {"properties": {"timestamps": {"const": "word"}}, "required": ["timestamps"]},
    "then": {"properties": {"stream_format": {"const": "sse"}}, "required": ["stream_format"]},
}


class SpeechOptions(BaseModel):
    """What both speech endpoints take besides the text: voice, audio format and options.

    Types are strict, as the document says: ``seed`` and ``sample_rate`` are integers (not a
    boolean, a string or a fraction; ``24000.0`` is one, as JSON Schema has it), the flags
    booleans (not 0 or 1). Formats and rates are listed
    in the document; one the server cannot serve is answered ``unsupported_format``."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=TELEPHONE_RATE_RULE)

    voice: StrictStr = Field(
        description="A voice id from GET /v1/audio/voices, or an alias there (OpenAI's alloy, "
        "nova ...: VOICEHOST_VOICE_ALIASES); `voice@n` pins its version n.",
        json_schema_extra={"pattern": VOICE_REF_PATTERN},
    )
    response_format: StrictStr = Field(
        "mp3",
        description=FORMATS_HELP + "; mp3 by default, as OpenAI's API",
        json_schema_extra={"enum": list(FORMATS)},
    )
    sample_rate: JsonInt | None = Field(
        None,
        description="8000, 16000, 22050, 24000, 44100 or 48000 (default 24000; mulaw/alaw 8000).",
        json_schema_extra={"enum": [*SAMPLE_RATES, None]},
    )
    seed: Seed | None = Field(None, description="Sampling seed: same seed, same audio.")
    normalize: StrictBool = Field(
        True, description="Speak numbers, dates, currency and abbreviations as words."
    )
    trim_silence: StrictBool = Field(
        False, description="Drop near-silent audio at the very start (at most 1 s)."
    )
    continuity: StrictBool = Field(
        True, description="Each segment of a long text hears the end of the one before."
    )
    lexicons: list[Annotated[StrictStr, Field(pattern=LEXICON_NAME_PATTERN.pattern)]] = Field(
        default_factory=list,
        max_length=MAX_REQUEST_LEXICONS,
        description="The caller's pronunciation lexicons to apply, in order (the first one's "
        "entry wins for a word), before the voice's own; an unknown name is lexicon_not_found.",
    )
    speed: StrictFloat = Field(
        1.0,
        ge=MIN_SPEED,
        le=MAX_SPEED,
        description="Playback speed, 0.25 to 4.0: the audio is time-stretched as it streams, "
        "its pitch kept.",
    )
    timestamps: Literal["word"] | None = Field(
        None,
        description='"word": an event for each word once its timing is final (`word` on the '
        "socket, `speech.word` in SSE, which it needs): its span in the text sent, and its "
        "start and end in seconds of the audio sent. The stream's `aligner` says how it was "
        "timed.",
    )


class SpeechRequest(SpeechOptions):
    """``POST /v1/audio/speech``: OpenAI's fields, plus the options above."""

    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"allOf": [TELEPHONE_RATE_RULE, TIMESTAMPS_RULE]}
    )

    model: StrictStr = Field(
        "orpheus",
        description="Accepted for OpenAI compatibility (any name, GET /v1/models lists them): "
        "one model is served.",
    )
    input: StrictStr = Field(
        description="The text to speak, of any length up to max_input_chars; one with nothing "
        "to say (no letter or digit) is answered empty_input.",
        json_schema_extra={"minLength": 1, "pattern": SPEAKABLE},
    )
    stream_format: Literal["audio", "sse"] = Field("audio", description="Raw audio or SSE events.")
    instructions: StrictStr | None = Field(
        None,
        description="OpenAI's style prompt (gpt-4o-mini-tts); accepted and not followed: Orpheus "
        "takes no instructions (emotive tags in the input, and the voice, set the delivery).",
    )


class CaptionedSpeechRequest(SpeechRequest):
    """``POST /v1/audio/speech/captioned``: a speech request answered as JSON, its words
    always timed."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=TELEPHONE_RATE_RULE)

    stream_format: Literal["audio"] = Field(
        "audio", description="The audio comes whole, base64, in the JSON answer."
    )
    timestamps: Literal["word"] = Field("word", description="Every word is timed here.")


class RealtimeConfig(SpeechOptions):
    """The first message on ``/v1/audio/speech/ws``."""

    type: Literal["config"]
    response_format: StrictStr = Field(
        "pcm", description=FORMATS_HELP, json_schema_extra={"enum": list(FORMATS)}
    )


class TimedWord(BaseModel):
    """A word's timing: its span in the text sent (the client's characters, whatever the text
    stage said it as) and its start and end in seconds of the audio sent (after ``speed``)."""

    text: str
    said: str = Field(
        description="What it was said as: its numbers, dates, money ... in words, in the "
        "voice's language, and a lexicon's alias (a word said together with its neighbour, "
        "`42,50 €`, carries their words: both say `quarante-deux euros cinquante`)."
    )
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    audio_start: float = Field(ge=0)
    audio_end: float = Field(ge=0)


class CaptionedSpeech(BaseModel):
    """``POST /v1/audio/speech/captioned``: the whole audio and every word's timing at once."""

    audio: str = Field(description="The audio in `response_format`, base64.")
    response_format: str
    content_type: str
    sample_rate: int
    samples: int = Field(description="Samples of the audio, at `sample_rate`.")
    audio_seconds: float
    aligner: str = Field(
        description='What timed the words: "estimated" (built in) or "ctc:<folder>" '
        "(VOICEHOST_ALIGNER_MODEL)."
    )
    words: list[TimedWord]


# --- its checks (every role's, before any engine work) ---


def check_audio_options(body: SpeechOptions) -> int:
    """The output sample rate of ``body``'s format and rate; 400 if they cannot be served."""
    return output_rate(body.response_format, body.sample_rate)  # or UnsupportedFormat


def check_speech_request(body: SpeechRequest, max_chars: int) -> None:
    """400 for input with nothing to say, an unservable format, or word timing where the
    answer has no place for it (raw audio; the captioned endpoint's JSON has one); 413 past
    ``max_chars``."""
    check_input(body.input, max_chars)
    captioned = isinstance(body, CaptionedSpeechRequest)
    if body.timestamps == "word" and body.stream_format != "sse" and not captioned:
        raise ApiError(
            "invalid_request",
            'word timestamps come as SSE events: stream_format "sse" (or POST '
            "/v1/audio/speech/captioned for the audio and its words at once)",
        )
    check_audio_options(body)


def speak_options(
    body: SpeechOptions, settings: Settings, aligner: Aligner, stage: TextStage
) -> SpeakOptions:
    """How the synthesizer speaks a request's segments, from its options and the settings;
    ``aligner`` times its words if it asks for word timing, each said as ``stage`` says it."""
    timed = body.timestamps == "word"
    return SpeakOptions(
        seed=body.seed,
        continuity_frames=settings.continuity_frames if body.continuity else 0,
        prefetch=settings.segment_prefetch,
        trim_db=settings.trim_threshold_db if body.trim_silence else None,
        aligner=aligner if timed else None,
        say=stage.say if timed else None,
    )


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


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
                "said": {"type": "string", "description": "What it was said as."},
                "start": {"type": "integer", "minimum": 0},
                "end": {"type": "integer", "minimum": 0},
                "audio_start": {"type": "number", "minimum": 0},
                "audio_end": {"type": "number", "minimum": 0},
                "aligner": {"type": "string"},
            },
            "required": [
                "type",
                "text",
                "said",
                "start",
                "end",
                "audio_start",
                "audio_end",
                "aligner",
            ],
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
