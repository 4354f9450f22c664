"""The public API contract: pydantic models of requests and responses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Ge, Lt
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from voicehost.audio.formats import FORMATS, SAMPLE_RATES, TELEPHONE_FORMATS, TELEPHONE_RATE
from voicehost.audio.tempo import MAX_SPEED, MIN_SPEED
from voicehost.ids import VERSION_PATTERN, VOICE_ID_PATTERN
from voicehost.tenancy.lexicons import LEXICON_NAME_PATTERN

MAX_REQUEST_LEXICONS = 8
SPEAKABLE = r"[^\W_]"  # a letter or a digit somewhere (Python's str.isalnum, as the edge checks)
# a voice id, and a version after @ (the edge's check: ids.is_voice_id, versioning's split)
VOICE_REF_PATTERN = VOICE_ID_PATTERN.pattern[:-1] + "(@" + VERSION_PATTERN.pattern[1:-1] + ")?$"


def _integral(value: object) -> object:
    """A JSON number with no fraction is an integer (JSON Schema counts ``3042.0`` as one);
    anything else is left for ``StrictInt`` to judge (a string, a boolean, ``2.5``: refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# an integer as JSON Schema has it: 7 or 7.0, not "7", true or 7.5
JsonInt = Annotated[StrictInt, BeforeValidator(_integral)]
# ... from 0 (a seed) or 1 (a version) up: bounds before the validator, so that the document
# says them as JSON Schema does (minimum, exclusiveMaximum), not as pydantic's ge and lt
Seed = Annotated[StrictInt, Ge(0), Lt(2**63), BeforeValidator(_integral)]
VersionNumber = Annotated[StrictInt, Ge(1), Lt(10**9), BeforeValidator(_integral)]

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


class RealtimeText(BaseModel):
    """A piece of text, as it comes (a word, a token, a sentence)."""

    type: Literal["text"]
    text: str = Field(max_length=65536)


class RealtimeControl(BaseModel):
    """``flush``: speak the text buffered so far; ``end``: no more text, finish and close;
    ``cancel``: stop at once (barge-in) and drop what is buffered."""

    type: Literal["flush", "end", "cancel"]


class VoiceInfo(BaseModel):
    """One entry of ``GET /v1/audio/voices``: ``held`` is a clone that measured below the
    evaluation gate, listed only to its tenant and admins, who may listen and publish it;
    ``aliases`` are the other names that speak with it (OpenAI's ``alloy`` ...)."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    status: Literal["ready", "held", "error"] = "ready"
    error: str | None = None
    aliases: list[str] | None = Field(
        None, description="Other names a request may use for this voice (VOICEHOST_VOICE_ALIASES)."
    )


class VoiceList(BaseModel):
    voices: list[VoiceInfo]


# OpenAI's speech models: accepted in ``model`` and listed by GET /v1/models, so clients
# configured with one of them (LiveKit's and Pipecat's plugins default to gpt-4o-mini-tts) work.
OPENAI_SPEECH_MODELS: tuple[str, ...] = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class ModelInfo(BaseModel):
    """One entry of ``GET /v1/models``, in OpenAI's shape."""

    id: str
    object: Literal["model"] = "model"
    # Unix seconds, not ISO: OpenAI's shape, which its clients parse
    created: int = Field(description="Unix time: when this server started.")
    owned_by: str = "voicehost"


class ModelList(BaseModel):
    """``GET /v1/models``: every model name a speech request may send (one model serves them
    all), as OpenAI lists its models."""

    object: Literal["list"] = "list"
    data: list[ModelInfo]


class TimedWord(BaseModel):
    """A word's timing: its span in the text sent (the client's characters, whatever the text
    stage said it as) and its start and end in seconds of the audio sent (after ``speed``)."""

    text: str
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


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error the API returns: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class PublishRequest(BaseModel):
    """``POST /v1/voices/{id}/publish``: make a held voice ready anyway, saying why."""

    model_config = ConfigDict(extra="forbid")

    reason: StrictStr = Field(
        min_length=1,
        max_length=500,
        pattern=r"\S",
        description="Why it goes live despite its evaluation (recorded in its voice.json).",
    )
    version: VersionNumber | None = Field(
        None, description="Which held version (default: the live one)."
    )


class ConsentRecord(BaseModel):
    """The ``consent`` part of a clone from audio: who agreed to have their voice cloned, to
    which statement, who collected that and when, and for what purpose."""

    model_config = ConfigDict(extra="forbid")

    speaker_name: StrictStr = Field(min_length=1, max_length=200, pattern=r"\S")
    statement: StrictStr = Field(
        min_length=1,
        max_length=4000,
        pattern=r"\S",
        description="What the speaker agreed to, word for word (what a consent recording says).",
    )
    collected_by: StrictStr = Field(min_length=1, max_length=200, pattern=r"\S")
    collected_at: AwareDatetime = Field(description="When, with its time zone (ISO 8601).")
    purpose: StrictStr = Field(min_length=1, max_length=1000, pattern=r"\S")


class VersionInfo(BaseModel):
    """One version of a voice: ``held`` by the gate; else ``ready`` while live, ``retired``
    once replaced, ``candidate`` if it has never been live. Its manifest holds its data report,
    evaluation and consent record (the consent only for the voice's tenant and admins)."""

    version: int
    status: Literal["candidate", "ready", "held", "retired"]
    live: bool
    checksum: str | None = None
    manifest: dict[str, object] = Field(default_factory=dict)
    error: str | None = None


class VersionList(BaseModel):
    """``GET /v1/voices/{id}/versions``: oldest first."""

    voice_id: str
    live: int
    versions: list[VersionInfo]


class VoiceDetail(BaseModel):
    """``GET /v1/voices/{id}``: a voice and its manifest (``voice.json``)."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    manifest: dict[str, object] = Field(default_factory=dict)


class CloneJobInfo(BaseModel):
    """A clone job: queued, preparing, training (with progress), evaluating, then done, held
    (the voice measured below the gate's thresholds), failed or cancelled. ``runner_lost``: its
    runner stopped (its lease lapsed) and another takes it over from its last checkpoint."""

    id: str
    voice_id: str
    status: Literal[
        "queued",
        "preparing",
        "training",
        "evaluating",
        "runner_lost",
        "done",
        "held",
        "failed",
        "cancelled",
    ]
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


class RouteRequest(BaseModel):
    """``POST /v1/cluster/route`` (a gateway): the voices whose owners on the ring to name."""

    model_config = ConfigDict(extra="forbid")

    voices: list[StrictStr]


class AuditActor(BaseModel):
    """Who made a change: an API key (``key``, with its tenant), the operator (the CLI, adapter
    folders), the service (a clone job's runner), or a caller of a server without keys."""

    kind: Literal["key", "operator", "service", "open"]
    key_id: str | None = None
    tenant: str | None = None
    runner: str | None = None


class AuditEvent(BaseModel):
    """One line of the audit log, as written (``voicehost.tenancy.audit``): ``prev`` is the SHA-256
    of the line before (the event before, as canonical JSON)."""

    seq: int = Field(ge=1)
    prev: str = Field(pattern=r"^[0-9a-f]{64}$")
    time: str = Field(description="UTC, ISO 8601.")
    action: str = Field(description="voice.created, voice.deleted, job.done, ...")
    actor: AuditActor
    request_id: str | None = None
    tenant: str | None = Field(None, description="Whose voice or job it is (none: shared).")
    voice: str | None = None
    version: int | None = None
    job: str | None = None
    details: dict[str, object] = Field(default_factory=dict, description="What changed.")


class AuditHead(BaseModel):
    """The log's last event: its seq and the SHA-256 of its line."""

    seq: int = Field(ge=0)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class AuditPage(BaseModel):
    """``GET /v1/audit``: events in order; ``next_after`` is set when more match (ask again
    with ``after`` = it). ``head`` (admins) is where the whole log ends."""

    events: list[AuditEvent]
    next_after: int | None = None
    head: AuditHead | None = None


class UsageRow(BaseModel):
    """What one API key spoke with one voice (key and tenant are null on a server without
    keys)."""

    key_id: str | None
    tenant: str | None
    voice: str
    characters: int = Field(ge=0)
    audio_seconds: float = Field(ge=0)


class UsageTotal(BaseModel):
    characters: int = Field(ge=0)
    audio_seconds: float = Field(ge=0)


class UsageReport(BaseModel):
    """``GET /v1/usage``: speech sent since ``since`` (to the minute), per key, tenant and
    voice, and in all."""

    since: str = Field(description="UTC, ISO 8601: the start of the first minute counted.")
    usage: list[UsageRow]
    total: UsageTotal


class PronunciationEntry(BaseModel):
    """Say ``alias`` where ``grapheme`` is written: whole words only, longest match first."""

    model_config = ConfigDict(extra="forbid")

    grapheme: StrictStr = Field(min_length=1, description="A word or phrase, as written.")
    alias: StrictStr = Field(min_length=1, description="What to say instead.")
    case_sensitive: StrictBool = Field(
        False, description="Match it only as written (else in any case)."
    )


class LexiconUpload(BaseModel):
    """``PUT /v1/lexicons/{name}`` as JSON (a W3C PLS document is the other way to send it)."""

    model_config = ConfigDict(extra="ignore")

    entries: list[PronunciationEntry]


class LexiconInfo(BaseModel):
    name: str
    entries: int = Field(description="How many entries it holds.")
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")


class LexiconSaved(BaseModel):
    """What a put stored: the lexicon, and the PLS lexemes left out (a ``<phoneme>`` but no
    ``<alias>``: this model reads text)."""

    lexicon: LexiconInfo
    skipped: int = 0


class LexiconList(BaseModel):
    lexicons: list[LexiconInfo]


class LexiconDetail(BaseModel):
    name: str
    entries: list[PronunciationEntry]
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")
