"""The API's one error table: every error code, its HTTP status and what it means, and the
operations that answer it.

A layer raises a ``voicehost.errors.ServiceError`` naming its code (the voice directory's
``voice_exists``, the training pipeline's ``not_enough_speech``, admission's ``at_capacity``);
a handler raises ``ApiError(code, message)`` for what it checks itself. Neither says a status:
``ERRORS[code]`` does, for the error middleware (``voicehost.api.edge``) and for the OpenAPI
document, whose error answers per operation are built from ``answered_by`` here
(``voicehost.api.openapi.errors``). What is documented cannot drift from what is answered:
the middleware counts an answer its operation does not list
(``voicehost_undocumented_errors_total``, logged), and the suite's servers fail their tests
if any was; ``tests/api/test_errors.py`` checks that every code the code raises is a row and
every row is raised.

``answered_by`` names operations (the route table's ``operation``) or one of the groups below;
``KEYED`` is every route an API key guards (the auth layer's errors), resolved from the routes;
none at all: an answer of no public operation (the router's 405, an internal route's).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from voicehost.errors import ServiceError

# --- its wire models ---


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error the API returns: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


KEYED = "(keyed)"  # every route that takes an API key, when keys are configured
ANY = "(any)"  # every operation

SPEECH = frozenset({"speak", "speak_captioned"})
STREAMS = SPEECH | {"speak_realtime", "speak_webrtc"}
WEBRTC_SESSION = frozenset({"update_webrtc", "end_webrtc"})
UPLOADS = frozenset({"create_voice", "add_version"})
VOICE_PATH = frozenset(
    {
        "get_voice",
        "delete_voice",
        "publish_voice",
        "add_version",
        "list_versions",
        "promote_version",
        "delete_version",
    }
)
VERSION_PATH = frozenset({"promote_version", "delete_version"})
JOB_PATH = frozenset({"get_job", "cancel_job", "retry_job"})
LEXICON_PATH = frozenset({"get_lexicon", "put_lexicon", "delete_lexicon"})
VOICE_LISTS = frozenset({"list_voices", "list_audio_voices"})
JSON_BODIES = SPEECH | {"publish_voice", "put_lexicon", "mint_token", "cluster_route"}
# What reads the cluster's Redis (in cluster mode): voices, versions, jobs, lexicons, speech
REDIS = (
    STREAMS
    | VOICE_PATH
    | UPLOADS
    | JOB_PATH
    | LEXICON_PATH
    | VOICE_LISTS
    | {"list_lexicons", "cluster_view", "cluster_route"}
)
ENGINE = STREAMS | {"readyz"}
# answered by asking a worker: speech proxied to one, an upload checked on one (its intake)
GATEWAY = SPEECH | UPLOADS | {"speak_webrtc", "readyz", "cluster_route"}


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """One row: ``code`` answered with ``status``; ``meaning`` is its OpenAPI text (after the
    code); ``retry_after``: the answer says when to try again."""

    status: int
    code: str
    meaning: str
    answered_by: frozenset[str]
    retry_after: bool = False


NOT_RETRIED = {"failed"}  # a 503 that waiting does not mend (the process must be restarted)


def _kinds(*rows: tuple[int, str, str, frozenset[str] | set[str] | str]) -> dict[str, ErrorKind]:
    table: dict[str, ErrorKind] = {}
    for status, code, meaning, where in rows:
        answered_by = frozenset({where}) if isinstance(where, str) else frozenset(where)
        retry = status in (429, 503) and code not in NOT_RETRIED
        if code in table:
            raise ValueError(f"{code!r} is in the error table twice")
        table[code] = ErrorKind(status, code, meaning, answered_by, retry)
    return table


ERRORS: dict[str, ErrorKind] = _kinds(
    # --- any route: the request itself ---
    (
        400,
        "invalid_body",
        "the body cannot be read (its `Content-Encoding` does not decode, or it ended early); "
        "the connection is closed.",
        JSON_BODIES | UPLOADS | {"speak_webrtc", "update_webrtc"},
    ),
    (400, "bad_request", "not a WebSocket upgrade request.", {"speak_realtime"}),
    (
        405,
        "method_not_allowed",
        "the path does not take this method (`Allow` lists those it does).",
        (),
    ),
    (500, "internal", "an unexpected error (logged).", ANY),
    (404, "not_found", "the playground has no such file.", {"playground_file"}),
    # --- the API key layer (voicehost.api.auth) ---
    (403, "forbidden", "an internal route called by another than the cluster's gateway.", ()),
    (401, "invalid_principal", "an internal route's forwarded caller that cannot be read.", ()),
    (
        401,
        "missing_api_key",
        "no API key was sent (`Authorization: Bearer <key>` or `X-API-Key`).",
        KEYED,
    ),
    (401, "invalid_api_key", "the API key is not valid.", KEYED),
    (
        400,
        "ambiguous_api_key",
        "different API keys were sent (`Authorization`, `X-API-Key`, `?api_key=`): send one.",
        KEYED,
    ),
    (401, "invalid_token", "a speech token that is not valid, or whose key is gone.", KEYED),
    (401, "token_expired", "a speech token past its expiry.", KEYED),
    (403, "insufficient_scope", "the key lacks the route's scope.", KEYED),
    (403, "token_not_allowed", "a speech token on a route other than speech.", KEYED),
    (403, "origin_not_allowed", "a speech token bound to another page's `Origin`.", KEYED),
    (429, "rate_limited", "the key's own `requests_per_minute` are spent.", KEYED),
    # --- JSON bodies ---
    (
        400,
        "invalid_json",
        "the body is not JSON (nested too deeply, or a string with an unpaired surrogate, "
        "included).",
        JSON_BODIES,
    ),
    (
        400,
        "invalid_request",
        "a field or query parameter missing, out of range or not understood.",
        JSON_BODIES | UPLOADS | {"list_audit", "usage_report"},
    ),
    (
        413,
        "body_too_large",
        "a JSON body over 1 MiB (an SDP offer over 64 KiB).",
        JSON_BODIES | {"speak_webrtc"},
    ),
    (
        415,
        "unsupported_media_type",
        "not the body's media type (multipart for an upload, `application/sdp` for an offer, "
        "`application/trickle-ice-sdpfrag` for candidates).",
        UPLOADS | {"speak_webrtc", "update_webrtc"},
    ),
    # --- ids in the path or the body ---
    (
        400,
        "invalid_voice_id",
        "not a voice id (the same answer on every route that takes one).",
        SPEECH | VOICE_PATH | UPLOADS | {"mint_token", "list_audit", "speak_webrtc"},
    ),
    (400, "invalid_version", "not a version number.", VERSION_PATH),
    (400, "invalid_job_id", "not a job id.", JOB_PATH),
    (400, "invalid_lexicon_name", "not a lexicon name.", LEXICON_PATH),
    # --- speech (voicehost.api.server, voicehost.speech) ---
    (400, "empty_input", "`input` is empty or has nothing to say.", SPEECH),
    (
        400,
        "unsupported_format",
        "an unknown format, a rate outside the list, `mulaw`/`alaw` at another rate than 8000.",
        SPEECH,
    ),
    (
        413,
        "input_too_long",
        "over `VOICEHOST_MAX_INPUT_CHARS` (also once its lexicons have rewritten it), or over "
        "the model's context.",
        SPEECH,
    ),
    (
        403,
        "voice_not_allowed",
        "a speech token that may not speak this voice.",
        SPEECH | {"speak_webrtc"},
    ),
    (
        404,
        "voice_not_found",
        "no such voice (or another tenant's, or a held voice the caller may not manage), or no "
        "such version of it (`voice@n`).",
        SPEECH | VOICE_PATH | {"speak_webrtc"},
    ),
    (422, "voice_unusable", "the voice's adapter failed validation.", SPEECH | {"promote_version"}),
    (500, "synthesis_failed", "the engine failed before the first audio.", SPEECH),
    (500, "no_speech_produced", "the model produced no audio for the input.", SPEECH),
    (500, "encoding_failed", "an encoding process was lost.", {"speak_captioned"}),
    (
        503,
        "not_ready",
        "the engine is warming up, failed or died, or the process is draining.",
        ENGINE,
    ),
    (503, "failed", "start-up failed or the engine died.", {"healthz"}),
    # --- admission (voicehost.speech.admission) ---
    (
        429,
        "quota_exceeded",
        "the key (or the speech token) already holds its most streams.",
        STREAMS,
    ),
    (
        503,
        "at_capacity",
        "the server holds all the real-time streams it can (or its most WebRTC sessions, or "
        "its most offers waiting for their peers).",
        STREAMS,
    ),
    (
        429,
        "too_many_pending",
        "this key, or this client address, has its most WebRTC offers waiting for their peers.",
        {"speak_webrtc"},
    ),
    # --- WebRTC (voicehost.api.webrtc) ---
    (
        400,
        "invalid_sdp",
        "not SDP (or not a trickle-ICE fragment); a section without its DTLS fingerprint or ICE "
        "credentials; no candidate ICE may check.",
        {"speak_webrtc", "update_webrtc"},
    ),
    (
        400,
        "no_audio",
        "no audio to clone in an upload; no receiving Opus audio in an offer.",
        UPLOADS | {"speak_webrtc"},
    ),
    (400, "no_data_channel", "an offer without a data channel.", {"speak_webrtc"}),
    (404, "session_not_found", "no such WebRTC session of this key's.", WEBRTC_SESSION),
    (
        503,
        "frontend_unavailable",
        "another front end of this host (`--frontends`), which may hold the session, did not "
        "answer in time.",
        WEBRTC_SESSION,
    ),
    (
        409,
        "no_api_keys",
        "a server without API keys mints no tokens (speak without one).",
        {"mint_token"},
    ),
    # --- voices and versions (voicehost.voices) ---
    (
        403,
        "voice_read_only",
        "a built-in or dev voice, or a shared one (admins only).",
        {"delete_voice", "add_version", "promote_version", "delete_version"},
    ),
    (409, "voice_exists", "the voice id is taken (or being trained).", UPLOADS | {"retry_job"}),
    (409, "voice_not_held", "the voice is ready already (or built in).", {"publish_voice"}),
    (404, "version_not_found", "the voice has no such version.", VERSION_PATH),
    (409, "version_exists", "the voice has a version with this adapter.", {"add_version"}),
    (409, "version_held", "a held version (publish it first).", {"promote_version"}),
    (
        409,
        "version_live",
        "the live version (promote another first, or delete the voice).",
        {"delete_version"},
    ),
    (
        503,
        "registry_rebuilding",
        "the cluster's registry is being restored from its store (cluster mode): the voice "
        "exists, or a list now would miss voices.",
        SPEECH | VOICE_PATH | VOICE_LISTS | UPLOADS | {"speak_webrtc", "retry_job"},
    ),
    # --- uploads and cloning (voicehost.cloning and the training pipeline) ---
    (400, "invalid_multipart", "the multipart body is malformed.", UPLOADS),
    (400, "ambiguous_upload", "audio to clone and an adapter, in one upload.", UPLOADS),
    (400, "invalid_transcripts", "transcripts that are not UTF-8 lines of `file|text`.", UPLOADS),
    (
        400,
        "missing_transcripts",
        "clips without transcripts, and no recognizer to make them.",
        UPLOADS,
    ),
    (400, "not_enough_speech", "less speech than `VOICEHOST_MIN_SPEECH_SECONDS`.", UPLOADS),
    (400, "invalid_adapter", "an adapter vLLM must not load (the message says why).", UPLOADS),
    (
        400,
        "consent_required",
        "cloning from audio needs a `consent` record (`VOICEHOST_REQUIRE_CONSENT`), and a "
        "consent recording goes with one.",
        UPLOADS,
    ),
    (400, "invalid_consent", "a consent record or recording that is not valid.", UPLOADS),
    (
        400,
        "unsupported_language",
        "a language no served model speaks (`GET /v1/models` lists each model's).",
        UPLOADS,
    ),
    (413, "upload_too_large", "over `VOICEHOST_MAX_UPLOAD_MB`, or too many files.", UPLOADS),
    (413, "audio_too_long", "more audio than `VOICEHOST_MAX_UPLOAD_MINUTES`.", UPLOADS),
    (413, "adapter_too_large", "an adapter over `VOICEHOST_MAX_ADAPTER_MB`.", UPLOADS),
    (415, "not_audio", "a file that is not audio.", UPLOADS),
    (
        415,
        "unsupported_audio",
        "audio of a rate, channel count or codec outside the allowlists.",
        UPLOADS,
    ),
    (
        422,
        "consent_speaker_mismatch",
        "the consent recording's speaker is not the training audio's.",
        UPLOADS,
    ),
    (409, "job_in_progress", "a version of the voice is being trained.", {"add_version"}),
    # --- clone jobs (voicehost.cloning.jobs) ---
    (404, "job_not_found", "no such job.", JOB_PATH),
    (409, "job_busy", "its worker is still stopping.", {"cancel_job"}),
    (
        409,
        "job_not_retryable",
        "the job is done, held or held by a runner (running, or its worker is stopping).",
        {"retry_job"},
    ),
    # --- lexicons (voicehost.tenancy.lexicons) ---
    (
        404,
        "lexicon_not_found",
        "no lexicon of that name in the caller's tenant.",
        LEXICON_PATH | SPEECH,
    ),
    (
        400,
        "lexicon_language_mismatch",
        "a lexicon named for a voice of another language (a lexicon applies to its language's).",
        SPEECH,
    ),
    (400, "invalid_lexicon", "not a lexicon (or its language not a BCP-47 tag).", {"put_lexicon"}),
    (
        400,
        "unsafe_lexicon",
        "a PLS document with a DTD, entities or nesting deeper than 8, refused unexpanded.",
        {"put_lexicon"},
    ),
    (400, "lexicon_entry_too_long", "over `VOICEHOST_LEXICON_MAX_ENTRY_CHARS`.", {"put_lexicon"}),
    (
        400,
        "too_many_lexicons",
        "the tenant keeps `VOICEHOST_LEXICONS_PER_TENANT` already.",
        {"put_lexicon"},
    ),
    (413, "lexicon_too_large", "over `VOICEHOST_LEXICON_MAX_ENTRIES` entries.", {"put_lexicon"}),
    # --- models ---
    (404, "model_not_found", "no such model name.", {"get_model"}),
    # --- the cluster (voicehost.cluster) ---
    (503, "redis_unavailable", "the cluster's Redis is unreachable (cluster mode).", REDIS),
    (
        503,
        "no_workers",
        "no worker is available to speak, or to check an upload (gateway).",
        GATEWAY,
    ),
    (
        503,
        "model_unavailable",
        "no live worker serves the voice's base model (gateway): never a worker of another.",
        SPEECH | {"speak_webrtc"},
    ),
    (502, "upstream_failed", "a gateway's workers failed (cluster mode).", GATEWAY),
)


class ApiError(ServiceError):
    """An error a handler finds itself: ``ApiError("invalid_voice_id", "...")``; its status is
    the table's."""

    def __init__(self, code: str, message: str) -> None:
        if code not in ERRORS:
            raise ValueError(f"{code!r} is not in the API's error table")
        super().__init__(message, code=code)

    @property
    def status(self) -> int:
        return ERRORS[self.code].status


def kind_of(exc: ServiceError) -> ErrorKind:
    """The row of ``exc``'s code (a code missing from the table is a bug: ``internal``)."""
    return ERRORS.get(exc.code) or ERRORS["internal"]


def answers(kind: ErrorKind, operation: str, keyed: bool) -> bool:
    """Whether ``operation`` (guarded by an API key if ``keyed``) may answer ``kind``."""
    where = kind.answered_by
    return operation in where or ANY in where or (keyed and KEYED in where)


def answered_by(operation: str, keyed: bool) -> list[ErrorKind]:
    """The rows ``operation`` may answer, by status then code."""
    rows = [kind for kind in ERRORS.values() if answers(kind, operation, keyed)]
    return sorted(rows, key=lambda kind: (kind.status, kind.code))


def documented(operation: str, keyed: bool, code: str) -> bool:
    kind = ERRORS.get(code)
    return kind is not None and answers(kind, operation, keyed)
