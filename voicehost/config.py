"""All settings in one place: defaults, overridden by ``VOICEHOST_*`` variables, then by flags."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from voicehost.ids import is_voice_id

# A BCP-47 language tag as voices and models carry one: a language, then subtags (pt-BR, zh-Hans)
LANGUAGE_TAG = re.compile(r"[a-z]{2,3}(-[A-Za-z0-9]{2,8})*")
ORPHEUS_VOICES = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]
# OpenAI's voice names onto Orpheus' built-in voices (by OpenAI's own descriptions: the female
# voices onto female ones, the male onto male), so OpenAI clients speak without a change; cedar
# and marin are the newest, and Pipecat refuses any name not in OpenAI's list.
OPENAI_VOICE_ALIASES = {
    "alloy": "tara",
    "ash": "dan",
    "ballad": "leo",
    "cedar": "leo",
    "coral": "jess",
    "echo": "zac",
    "fable": "leo",
    "marin": "leah",
    "nova": "leah",
    "onyx": "dan",
    "sage": "mia",
    "shimmer": "zoe",
    "verse": "zac",
}


class IceServer(BaseModel):
    """One STUN or TURN server, as in WebRTC's ``RTCConfiguration.iceServers``."""

    model_config = ConfigDict(extra="forbid")

    urls: list[Annotated[str, StringConstraints(pattern=r"^(stun|stuns|turn|turns):\S+$")]]
    username: str | None = None
    credential: str | None = None

    @field_validator("urls", mode="before")
    @classmethod
    def _one_url_or_many(cls, urls: object) -> object:
        return [urls] if isinstance(urls, str) else urls


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (an IP or ``localhost``) is a loopback one."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _default_dev_dir() -> Path:
    return Path.home() / ".cache" / "voicehost" / "dev-model"


class Settings(BaseSettings):
    """The service configuration (see the table in the README)."""

    model_config = SettingsConfigDict(
        env_prefix="VOICEHOST_", extra="ignore", populate_by_name=True
    )
    # the settings by concern, each group from its first setting on (the README's tables)
    GROUPS: ClassVar[dict[str, str]] = {
        "dev": "What to serve",
        "jobs_dir": "Voice cloning",
        "host": "HTTP",
        "ice_servers": "WebRTC (POST /v1/audio/speech/webrtc)",
        "api_keys": "Authentication",
        "audit_path": "Audit trail and usage",
        "lexicons_dir": "Pronunciation lexicons",
        "segment_max_chars": "Text",
        "quantization": "Engine",
        "redis_url": "Cluster (voicehost worker / gateway)",
        "temperature": "Sampling (Orpheus' stable defaults)",
        "lookahead_frames": "Decoding",
        "encode_threads": "Audio out",
    }

    dev: bool = Field(
        False, description="Serve the built-in tiny random-weight dev model (`--dev`)."
    )
    model: str | None = Field(
        None, description="Orpheus weights: a local path or a hub id (`--model`)."
    )
    codec: str = Field(
        "hubertsiuzdak/snac_24khz", description="SNAC 24 kHz: a path or hub id (`--codec`)."
    )
    base_model_name: str | None = Field(
        None,
        description=(
            "Base model name adapters must declare; the served model's path or "
            "hub id is accepted too (each compared by its last path part, so a "
            "PEFT `save_pretrained` made against the served folder passes)."
        ),
        json_schema_extra={
            "default_doc": "`voicehost-dev` with `--dev`, else the model's last path part"
        },
    )
    dev_dir: Path = Field(
        default_factory=_default_dev_dir,
        description="Where the dev model is built and cached.",
        json_schema_extra={"default_doc": "`~/.cache/voicehost/dev-model`"},
    )
    adapters_dir: Path = Field(
        Path("adapters"),
        description=("Voice adapters, one folder per voice: `<dir>/<voice_id>/` (`--adapters`)."),
    )
    builtin_voices: list[str] | None = Field(
        None,
        description=(
            'Voices of the base model, spoken by the prompt prefix `"{voice}: "`, no adapter '
            "(a JSON list). Unset: the model's own (its `voicehost.json`, else the voices of "
            "Canopy Labs' finetune of each language it speaks)."
        ),
        json_schema_extra={
            "default_doc": (
                "the model's: Orpheus' 8 voices for English (`tara`, `leah`, `jess`, `leo`, "
                "`dan`, `mia`, `zac`, `zoe`); `pierre`, `amelie`, `marie` for French; `jana`, "
                "`thomas`, `max` for German; `javi`, `sergio`, `maria` and `pietro`, `giulia`, "
                "`carlo` for Spanish and Italian"
            )
        },
    )
    languages: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description=(
            "The languages the base model speaks, BCP-47 tags (a JSON list, or `fr,de`); the "
            "first is a new voice's. Unset: the model's metadata (`voicehost.json`, its model "
            "card's `language:`), Canopy Labs' checkpoint name (`3b-fr-ft-...`), else `en`."
        ),
        json_schema_extra={"default_doc": "the model's own, else `en`"},
    )
    voice_languages: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'Each built-in voice\'s language where the model speaks several, `{"voice": "it"}` '
            "(unset ones: the known voices' own, else the model's first language)."
        ),
    )
    adapter_scan_seconds: float = Field(
        2.0, description="How often the adapter folders are rescanned."
    )
    voice_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(OPENAI_VOICE_ALIASES),
        description=(
            'Other names of voices, a JSON object `{"alias": "voice id"}` '
            "(replaces the default; `{}`: none). A request naming an alias "
            "speaks with its voice, unless a voice of the alias' own id is one "
            "the caller can see; the voice list shows each voice's aliases. An "
            "alias may not name another alias."
        ),
        json_schema_extra={
            "default_doc": (
                'OpenAI\'s voices onto the built-in ones: `{"alloy": "tara", "ash": '
                '"dan", "ballad": "leo", "cedar": "leo", "coral": "jess", "echo": '
                '"zac", "fable": "leo", "marin": "leah", "nova": "leah", "onyx": '
                '"dan", "sage": "mia", "shimmer": "zoe", "verse": "zac"}`'
            )
        },
    )

    jobs_dir: Path = Field(
        Path("jobs"),
        description=(
            "Clone jobs: their state and the uploaded inputs (kept so a failed job can be retried)."
        ),
    )
    max_upload_mb: float = Field(
        200.0,
        description=("Largest upload to `POST /v1/voices`; larger gets 413 while it streams in."),
    )
    max_upload_minutes: float = Field(
        60.0,
        description=(
            "Most decoded audio in one upload (413), counted while decoding, never from headers."
        ),
    )
    max_adapter_mb: float = Field(
        256.0,
        description="Largest file of an uploaded adapter (413 `adapter_too_large`).",
    )
    min_speech_seconds: float = Field(
        30.0,
        description="Least usable speech (after trimming) a clone needs (400).",
    )
    clone_epochs: int = Field(3, description="Training epochs of a clone job.")
    job_lease_seconds: float = Field(
        15.0,
        gt=0,
        description=(
            "A clone job's runner renews its claim every third of this; a job "
            "whose runner stopped for this long is taken over from its "
            "checkpoint."
        ),
    )
    speaker_embedder: str | None = Field(
        None,
        # its variable before, VOICEHOST_SPEAKER_ENCODER, still read (the README names both)
        validation_alias=AliasChoices("VOICEHOST_SPEAKER_EMBEDDER", "VOICEHOST_SPEAKER_ENCODER"),
        description=(
            "The speaker embedder behind every similarity figure: unset or "
            "`resemblyzer` (Resemblyzer's GE2E, weights in its wheel), "
            "`package.module:factory`, or a local folder holding an operator's "
            "model (see [docs/CLONING.md](docs/CLONING.md#the-data-report)). "
            "`VOICEHOST_SPEAKER_ENCODER`, its name before, is read too."
        ),
    )
    speaker_min_similarity: float = Field(
        0.92,
        ge=-1.0,
        le=1.0,
        description=(
            "A group of an upload's clips whose speaker is less like the rest's "
            "than this is another speaker: left out of training and named in "
            "the data report."
        ),
    )
    speaker_min_pitch_shift: float = Field(
        1.2,
        ge=0.0,
        description=(
            "The filter's second cue, each clip's voice pitch: a group of clips "
            "at least this many semitones (and 2.5 robust deviations of the "
            "upload's own pitch) above or below the rest, whose voice is also "
            "less like the rest's than any as large group of the rest's own "
            "clips, is another speaker; `0` turns the cue off (see "
            "[docs/CLONING.md](docs/CLONING.md#the-data-report))."
        ),
    )
    eval_min_similarity: float = Field(
        0.75,
        description=(
            "A clone goes live only if its samples' mean speaker similarity to "
            "its held-out references is at least this (see "
            "[docs/CLONING.md](docs/CLONING.md#the-evaluation-and-the-gate))."
        ),
    )
    eval_min_gain: float = Field(
        0.02,
        description=(
            "... and it is at least this much closer to the speaker than the "
            "closest built-in voice."
        ),
    )
    eval_max_wer: float = Field(
        0.3,
        description=(
            "... and, when an ASR backend measures it, its word error rate is at most this."
        ),
    )
    eval_sentences: int = Field(
        6,
        ge=1,
        le=6,
        description="How many of the six evaluation sentences a new clone is heard on.",
    )
    eval_baselines: int = Field(
        3,
        ge=0,
        description=(
            "How many built-in voices (the first) are tried as a clone's "
            "baseline; `0`: none (no gain is judged)."
        ),
    )
    eval_report_only: bool | None = Field(
        None,
        description=(
            "`true`: evaluate clones and report, never hold one; unset: report "
            "only with the dev model (it speaks noise), gate otherwise."
        ),
    )
    require_consent: bool | None = Field(
        None,
        description=(
            "Cloning from audio (a new voice or a new version) needs a "
            "`consent` record (400 `consent_required` without it); see "
            "[Consent](docs/API.md#consent)."
        ),
        json_schema_extra={"default_doc": "`true` (`false` with `--dev`)"},
    )
    consent_min_similarity: float = Field(
        0.75,
        ge=-1.0,
        le=1.0,
        description=(
            "A consent recording whose speaker is less like the training "
            "audio's than this is refused (422 `consent_speaker_mismatch`)."
        ),
    )

    host: str = Field("127.0.0.1", description="Address to bind (`--host`).")
    port: int = Field(8080, description="Port to bind (`--port`).")
    max_input_chars: int = Field(
        100_000,
        description=(
            "Longest accepted input; longer gets 413. Long input is split into "
            "segments (below), so any length up to this streams."
        ),
    )
    ws_idle_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description=(
            "A realtime WebSocket with no message for this long and nothing "
            "left to speak is closed (`idle_timeout`)."
        ),
    )

    ice_servers: list[IceServer] = Field(
        default_factory=list,
        description=(
            "STUN/TURN servers for WebRTC, as `RTCConfiguration.iceServers` "
            'JSON (`[{"urls": ["turn:turn.example.net:3478"], "username": "u", '
            '"credential": "p"}]`): used for the service\'s own candidates and '
            "sent to clients in the answer's `Link` headers. None: host "
            "candidates only, and no server is contacted."
        ),
    )
    webrtc_udp_ports: str | None = Field(
        None,
        pattern=r"^\d{1,5}-\d{1,5}$",
        description=(
            "The UDP ports WebRTC binds, `first-last` (e.g. `40000-40199`: a "
            "firewall's opening, a Kubernetes `hostPort` range); a session "
            "takes one port per host address and ICE transport (a browser "
            "bundles its audio and data channel onto one). Unset: any free "
            "port."
        ),
    )
    webrtc_announced_address: str | None = Field(
        None,
        description=(
            "The IP address host candidates announce instead of the "
            "interface's: a node's or NAT's public address whose UDP ports map "
            "one to one (a Kubernetes `hostPort`, a published Docker port)."
        ),
    )
    webrtc_max_sessions: int = Field(
        64,
        ge=0,
        description=(
            "WebRTC sessions one process holds at once (503 `at_capacity` "
            "beyond); on `serve` each counts as a stream from its config on, "
            "as a socket does."
        ),
    )
    webrtc_max_pending: int = Field(
        32,
        ge=0,
        description=(
            "Answered WebRTC offers still waiting for their peer (no data "
            "channel and config yet), in all (503 `at_capacity` beyond). A "
            "pending offer is not counted as a stream: an offer that never connects "
            "costs only its peer connection."
        ),
    )
    webrtc_max_pending_per_key: int = Field(
        8, ge=0, description="Pending offers of one API key (429 `too_many_pending` beyond)."
    )
    webrtc_max_pending_per_address: int = Field(
        4,
        ge=0,
        description=(
            "Pending offers from one client address (429 `too_many_pending` "
            "beyond): a page opens one session at a time."
        ),
    )
    webrtc_private_candidates: bool = Field(
        False,
        description=(
            "Send ICE checks to a client's private addresses (10/8, 172.16/12, "
            "192.168/16, fc00::/7, 100.64/10): on for a service on a private "
            "network. Link-local (169.254/16, fe80::/10), unspecified, "
            "multicast and broadcast addresses are never checked, loopback only "
            "when the service binds a loopback address; each refusal is counted "
            "in `voicehost_webrtc_candidates_refused_total{reason}`."
        ),
    )
    webrtc_connect_timeout_seconds: float = Field(
        15.0,
        gt=0,
        description=(
            "A WebRTC session whose data channel has not opened by then ends "
            "(`webrtc_connect_failed` in `voicehost_errors_total`), its peer "
            "connection freed (a pending offer is not counted as a stream)."
        ),
    )
    webrtc_consent_seconds: float = Field(
        30.0,
        gt=0,
        description=(
            "A WebRTC peer that answers no ICE consent check for this long (RFC "
            "7675's 30 s) has vanished: its session ends, its stream and engine "
            "request are freed (`webrtc_peer_lost`)."
        ),
    )

    api_keys: list[dict[str, Any]] = Field(
        default_factory=list,
        description=(
            'API keys: a JSON list of `{"id", "tenant", "scopes", "sha256"}` '
            "(see Authentication). With no key configured here or in the file, "
            "auth is off and the service binds to localhost only."
        ),
        json_schema_extra={"default_doc": "unset"},
    )
    api_keys_file: Path | None = Field(
        None,
        description=(
            "A JSON file holding more keys, in the same format; read at "
            "start-up (a file that cannot be read or holds a bad entry stops "
            "the start-up)."
        ),
    )
    internal_token: SecretStr | None = Field(
        None,
        description=(
            "A cluster's shared secret (at least 16 characters, the same on "
            "gateways and workers): gateways send it with each forwarded "
            "request, and `/internal/*` and `voicehost drain` need it. Required "
            "on a gateway or worker that has keys; a worker with only the token "
            "answers nothing but its gateways."
        ),
    )
    metrics_public: bool = Field(
        True,
        description=(
            "`/metrics` without a key; `false`: with keys configured, it needs an `admin` key."
        ),
    )
    token_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description=(
            "Signs the speech tokens of `POST /v1/tokens` (at least 32 "
            "characters; the same on every gateway and worker). Unset: derived "
            "from `VOICEHOST_INTERNAL_TOKEN`, else from the keys' hashes. "
            "Changing it ends the tokens minted before."
        ),
    )

    audit_path: Path | None = Field(
        None,
        description=(
            "The audit log (JSONL, hash-chained; see [Audit trail and "
            "usage](docs/API.md#audit-trail-and-usage-get-v1audit-get-v1usage)). "
            "In a cluster this is the mirror of the Redis stream on the shared "
            "store."
        ),
        json_schema_extra={
            "default_doc": (
                "`audit.jsonl` beside `VOICEHOST_ADAPTERS_DIR`; in a cluster "
                "`<shared>/audit/audit.jsonl`"
            )
        },
    )
    usage_path: Path | None = Field(
        None,
        description=(
            "One server's usage, per minute (a cluster sums it in Redis and "
            "mirrors it to `<shared>/usage/`)."
        ),
        json_schema_extra={"default_doc": "`usage.jsonl` beside the audit log"},
    )
    usage_flush_seconds: float = Field(
        1.0,
        gt=0,
        description=(
            "How often the usage counted in a process is added to its store "
            "(the file, or Redis): never per chunk."
        ),
    )
    usage_retention_days: float = Field(
        400.0,
        gt=0,
        description="How long a cluster's per-minute usage buckets stay in Redis.",
    )
    lexicons_dir: Path = Field(
        Path("lexicons"),
        description=(
            "Pronunciation lexicons of `serve`, `<dir>/<tenant>/<name>.json` "
            "(`_shared/`: open mode's); a cluster keeps them in "
            "`VOICEHOST_SHARED_DIR/lexicons/` with Redis in front."
        ),
    )
    lexicon_max_entries: int = Field(
        1000, ge=1, description="Entries one lexicon may hold (413 `lexicon_too_large`)."
    )
    lexicon_max_entry_chars: int = Field(
        200,
        ge=1,
        description=("Longest grapheme or alias of an entry (400 `lexicon_entry_too_long`)."),
    )
    lexicons_per_tenant: int = Field(
        100, ge=1, description="Lexicons one tenant may keep (400 `too_many_lexicons`)."
    )

    segment_max_chars: int = Field(
        300,
        ge=80,
        description=(
            "Longest text segment: input is split at sentence ends into "
            "segments of at most this many characters (a longer sentence at a "
            "clause, else a space), each one engine request."
        ),
    )
    continuity_frames: int = Field(
        48,
        ge=0,
        description=(
            "Frames (of 85 ms) of the previous segment, with about the words "
            "spoken in them, that each segment's prompt carries so a long text "
            "keeps one voice and pace; 0: none."
        ),
    )
    segment_prefetch: int = Field(
        1,
        ge=1,
        description=(
            "Segments of a long input generated at once (batched by the engine, "
            "held until played) when a request turns `continuity` off; with "
            "continuity each segment waits for the frames of the one before. "
            "More finishes long texts sooner at the cost of places in the "
            "engine's batch."
        ),
    )
    trim_threshold_db: float = Field(
        -45.0,
        description=(
            "With `trim_silence`, audio at the start of a stream quieter than "
            "this (RMS of 10 ms blocks, dBFS) is dropped, at most 1 s."
        ),
    )
    aligner_model: Path | None = Field(
        None,
        description=(
            'Word timing (`timestamps: "word"`, the captioned endpoint) by '
            "forced alignment: a local folder with a CTC model and its "
            "processor as transformers saves them (wav2vec2, MMS: "
            "`AutoModelForCTC`, `AutoProcessor`; never downloaded), loaded at "
            "start-up, run off the event loop; its streams say `aligner: "
            '"ctc:<folder name>"`. None: the built-in estimate (`estimated`, no '
            "model)."
        ),
        json_schema_extra={"default_doc": "none"},
    )

    quantization: str = Field(
        "auto",
        description=(
            "`auto`: FP8 (dynamic, W8A8) on CUDA GPUs of compute capability >= "
            "8.9, none elsewhere; `none`; or any vLLM method name."
        ),
    )
    dtype: str = Field(
        "auto",
        description=(
            "`auto`: bfloat16 on GPU, float32 on CPU (where bf16 rounding would "
            "make seeded output depend on the batch)."
        ),
    )
    kv_cache_dtype: str = Field(
        "auto",
        description=(
            "`auto`: `fp8` (e4m3) on CUDA GPUs of compute capability >= 8.9, "
            "where a token's keys and values take half the memory of bf16 and "
            "twice the streams fit; vLLM's `auto` (the model's dtype) "
            "elsewhere; or any vLLM `kv_cache_dtype`. Shown at start-up and by "
            "`voicehost doctor`."
        ),
    )
    max_model_len: int = Field(
        8192,
        description=(
            "Context length: prompt + audio tokens, about 90 s of speech (the "
            "model's 131072 would waste KV cache)."
        ),
    )
    max_loras: int | Literal["auto"] = Field(
        "auto",
        description=(
            "Distinct adapters in one batch. `auto`: 8 on the CPU engine; on a "
            "GPU, as many slots as 5% of its memory holds at "
            "`VOICEHOST_MAX_LORA_RANK`, in steps of 8, from 8 to 64, never "
            'above `VOICEHOST_MAX_NUM_SEQS` (see "LoRA slots on a GPU" below). '
            "A number is taken as given."
        ),
    )
    max_lora_rank: int = Field(16, description="Highest adapter rank accepted.")
    max_cpu_loras: int = Field(64, description="Adapters kept loaded in the engine's cache.")
    max_num_seqs: int = Field(64, description="Streams batched in one engine step.")
    frontends: int | Literal["auto"] = Field(
        1,
        description=(
            "Serving processes sharing one vLLM engine core, all accepting on "
            "the one port (`voicehost serve --frontends N`): each has its own "
            "event loop, GIL, SNAC codec and encoding pool, so a host's CPU keeps up "
            "with its GPU. `auto`: on a GPU, one per 2 cores beyond 2 (at most "
            "16); 1 on the CPU engine. Responses name the front end in "
            "`X-Voicehost-Frontend`. What is one per host stays one: the "
            "capacity, each key's quota and measured-capacity admission count "
            "every front end's streams; `/metrics`, `/v1/usage`, `/readyz` and "
            "`/internal/load` answer for the host from any front end; a drain "
            "of one drains them all; the audit chain is one chain and front end "
            "0 runs the clone jobs. A `worker` with N front ends is one ring "
            "member reporting the host's load. A front end that dies (killed, "
            "crashed) ends the host at once, its other front ends killed with "
            "it so that every stream is cut as the host's death would cut it (a "
            "gateway says `upstream_cut`) rather than drained behind a ring "
            "that has dropped it, and the host exits 1 for its supervisor to "
            "restart it, even if a stop signal came meanwhile; the engine core "
            "that dies stops the host too (exit code 1); a core that dies while "
            "the host drains ends the drained streams with the error at once "
            "(exit 1, unless the core ended on the stop's own signal, as on "
            "Ctrl-C)."
        ),
    )
    stream_interval: int = Field(
        7,
        ge=1,
        description=(
            "Tokens vLLM gathers for a request before it hands them to the "
            "serving process (the first at once): 7, one frame, so the process "
            "wakes once per frame, not per token. The first audio still needs "
            "its 21 tokens; it leaves at most one engine step later "
            "(`docs/BENCHMARKS.md`). `1`: every token."
        ),
    )
    gpu_memory_utilization: float | None = Field(
        None,
        description=(
            "Share of GPU memory that vLLM takes (on CPU the KV cache size "
            "comes from `VLLM_CPU_KVCACHE_SPACE`)."
        ),
        json_schema_extra={"default_doc": "`0.9` on GPU, `0.3` on CPU"},
    )
    cpu_kv_cache_gib: int = Field(
        1,
        description=(
            "KV cache of the CPU engine, in GiB, used when "
            "`VLLM_CPU_KVCACHE_SPACE` is not set (the Makefile sets it to 1)."
        ),
    )
    enforce_eager: bool = Field(
        False, description="Disable CUDA graphs (faster start, slower steps)."
    )

    redis_url: str | None = Field(
        None,
        description=(
            "Redis of a cluster (`--redis`); `worker` and `gateway` need it, `serve` never uses it."
        ),
    )
    worker_id: str | None = Field(
        None,
        description=(
            "A worker's stable id (`--worker-id`): its place on the ring follows from it."
        ),
        json_schema_extra={"default_doc": "`<hostname>-<port>`"},
    )
    advertise_url: str | None = Field(
        None,
        description="URL gateways reach a worker at (`--advertise-url`).",
        json_schema_extra={"default_doc": "`http://<host>:<port>`"},
    )
    heartbeat_seconds: float = Field(
        1.0,
        description=(
            "How often a worker rewrites its member record (and so re-registers "
            "after a Redis restart or flush)."
        ),
    )
    worker_ttl_seconds: float = Field(
        5.0,
        description=(
            "A worker whose heartbeats stop leaves the ring after this long "
            "(plus one gateway poll)."
        ),
    )
    membership_poll_seconds: float = Field(
        1.0, description="How often gateways read the membership."
    )
    registry_reconcile_seconds: float = Field(
        2.0,
        gt=0,
        description=(
            "How often workers and gateways check the voice records in Redis "
            "against the shared store, and restore the missing ones."
        ),
    )
    session_ttl_seconds: float = Field(
        600.0,
        description="Life of an idle session pin (`X-Session-Id` -> worker).",
    )
    load_factor: float = Field(
        1.25,
        description=(
            "Bounded-load factor c: no worker takes a new stream beyond `ceil(c "
            "x (in-flight + 1) / workers)`."
        ),
    )
    hot_voice_streams: int = Field(
        8,
        description=(
            "A voice with this many streams in flight at a gateway spreads over "
            "one more ring successor (per multiple)."
        ),
    )
    worker_capacity: int | None = Field(
        None,
        ge=1,
        description=(
            "Streams this process admits at once, and reports to the cluster: "
            "set it to the streams it keeps real-time (`voicehost bench`'s \"max "
            'real-time concurrency"). Beyond it, a new stream gets 503 with '
            "`Retry-After: 1` at once."
        ),
        json_schema_extra={"default_doc": "`VOICEHOST_MAX_NUM_SEQS`"},
    )
    realtime_tokens_per_second: float | None = Field(
        None,
        ge=0,
        description=(
            "Admission from measured capacity: the worker measures its engine's "
            "audio tokens/s per request at each batch size "
            "(`voicehost_request_tokens_per_second{batch}`) and admits a new "
            "stream only while the rate predicted with one more stays at least "
            "`VOICEHOST_REALTIME_MARGIN` x this (Orpheus plays 82 tokens/s), and "
            "while its front end's audio decoding (measured: seconds per second of "
            "audio) keeps up with one more stream at that rate; "
            "else 503 `at_capacity` with `Retry-After` at once. The static "
            "capacity stays the upper bound; workers report the headroom left "
            "to gateways, which pass a worker with none over. 0: off."
        ),
        json_schema_extra={"default_doc": "`82` (off with `--dev`)"},
    )
    realtime_margin: float = Field(
        1.2,
        gt=0,
        description=("How far above real time every stream must stay for one more to be admitted."),
    )
    key_max_streams: int = Field(
        0,
        ge=0,
        description=(
            "Streams one API key may hold at once (0: no quota): on `serve`, in "
            "the process; in a cluster, in the whole cluster (each stream holds "
            "a lease in Redis, `vh:lease:<key id>`, refreshed while it runs; a "
            "gateway that finds a worker gone drops its leases at once, and any "
            "left expire within 15 s; while Redis is away, per worker, said once "
            "in the log). Beyond it, 429 with "
            "`Retry-After: 1`. A key's entry may set its own (`max_streams`)."
        ),
    )
    drain_timeout_seconds: float = Field(
        60.0,
        ge=0,
        description=(
            "On SIGTERM (or SIGINT) the process stops admitting (`/readyz` "
            "503), lets streams in flight finish for up to this long, then "
            "exits; a second signal exits at once."
        ),
    )
    shared_dir: Path = Field(
        Path("shared"),
        description=(
            "The cluster's shared store (mounted by every worker and gateway): "
            "`adapters/<voice>/<checksum>/` and clone `jobs/`."
        ),
    )
    adapter_cache_dir: Path = Field(
        default_factory=lambda: _default_dev_dir().parent / "adapters",
        description="A worker's local copies of adapters, verified by checksum.",
        json_schema_extra={"default_doc": "`~/.cache/voicehost/adapters`"},
    )
    adapter_cache_mb: float = Field(
        2048.0,
        description=("Size cap of that cache; least recently used adapters are evicted beyond it."),
    )
    redis_timeout_seconds: float = Field(0.5, description="Redis socket and connect timeout.")
    redis_retries: int = Field(
        2,
        description=(
            "Retries (exponential backoff, 50 ms to 500 ms) of a Redis command "
            "that failed to connect or timed out."
        ),
    )
    redis_pool_size: int = Field(32, description="Redis connections per process.")
    proxy_connections: int = Field(
        256,
        description=("A gateway's keep-alive connections to workers (one shared client session)."),
    )
    upstream_timeout_seconds: float = Field(
        120.0,
        description=(
            "A worker silent this long, before its first byte or within a "
            "stream, has failed (a crashed worker is noticed at once; this "
            "covers a wedged one or a lost network)."
        ),
    )

    temperature: float = Field(0.6, description="Sampling temperature.")
    top_p: float = Field(0.8, description="Nucleus sampling.")
    repetition_penalty: float = Field(
        1.1, description="Repetition penalty; higher also speeds speech up."
    )
    constrained_sampling: bool = Field(
        True,
        description=(
            "Position-constrained sampling: at each step only the 4096 audio "
            "tokens of the next frame position may be sampled, and the stop "
            "token only after a whole frame, so every stream is whole frames "
            "(`voicehost/model/frame_constraint.py`, a vLLM batch-level logits "
            "processor)."
        ),
    )

    lookahead_frames: Literal[0, 1, 2] = Field(
        2,
        description=(
            "Right context of each decode: 2 equals a one-shot decode; 0 and 1 "
            "start sooner but differ."
        ),
    )
    codec_device: str | None = Field(
        None,
        description="Where SNAC runs.",
        json_schema_extra={"default_doc": "`cuda` if available, else `cpu`"},
    )
    codec_batch_window_ms: float = Field(
        10.0,
        ge=0,
        description=(
            "Longest wait for other streams' windows before a batched SNAC "
            "decode (none when every live stream has one pending)."
        ),
    )
    codec_max_batch: int = Field(64, ge=1, description="Most stream windows in one batched decode.")
    codec_max_chunk_frames: int = Field(
        16,
        ge=1,
        description=(
            "Most new frames per decode once a stream is far ahead of playback "
            "(chunks grow from 1 with the lead)."
        ),
    )
    codec_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for SNAC when it runs on the CPU.",
        json_schema_extra={"default_doc": "half the cores"},
    )
    codec_cuda_graphs: bool = Field(
        True,
        description=(
            "On a GPU, pad small SNAC calls (at most 256 frames once padded) to "
            "fixed (streams, frames) buckets and replay each from a CUDA graph, "
            "all captured at start-up (a capture that fails turns graphs off). "
            "No effect on CPU."
        ),
    )
    codec_noise: bool = Field(
        True,
        description=(
            "Keep SNAC's decoder noise, as trained (off: audio is a pure function of the tokens)."
        ),
    )

    encode_threads: int | None = Field(
        None,
        ge=1,
        description=(
            "Threads that resample and encode audio (mp3, opus, aac, flac, "
            "G.711, and any format at another rate than 24000) off the event "
            "loop, a stream's chunks one at a time and in order; pcm and wav at "
            "24000 are converted on the loop."
        ),
        json_schema_extra={"default_doc": "the cores this process may use"},
    )
    encode_processes: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description=(
            "Encoding processes per serving process (0 to 64): the same work in "
            "processes of its own, fed PCM over a Unix socket, instead of on "
            "its threads (0). A front end then hands no GIL back and forth with "
            "encoding threads (see [docs/BENCHMARKS.md](docs/BENCHMARKS.md)). "
            "`auto`: 2 on a GPU (with `VOICEHOST_FRONTENDS=auto`, a front end "
            "and its two encoding processes share 2 cores), 0 on the CPU engine. An "
            "encoding process that dies ends its streams with `encoding_failed` "
            "and is replaced for the next."
        ),
    )

    @field_validator("webrtc_udp_ports")
    @classmethod
    def _a_port_range(cls, ports: str | None) -> str | None:
        if ports is not None:
            first, last = (int(port) for port in ports.split("-"))
            if not 1024 <= first <= last <= 65535:
                raise ValueError(f"{ports!r}: first-last, 1024 <= first <= last <= 65535")
        return ports

    @field_validator("webrtc_announced_address")
    @classmethod
    def _an_ip_address(cls, address: str | None) -> str | None:
        if address is not None:
            ipaddress.ip_address(address)  # ValueError: not an IP address
        return address

    @field_validator("languages", mode="before")
    @classmethod
    def _language_list(cls, value: object) -> object:
        if isinstance(value, str):  # `fr,de` or a JSON list
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("languages", "voice_languages")
    @classmethod
    def _language_tags(cls, value: list[str] | dict[str, str] | None) -> object:
        tags = list(value.values()) if isinstance(value, dict) else list(value or [])
        for tag in tags:
            if not LANGUAGE_TAG.fullmatch(tag):
                raise ValueError(f"{tag!r} is not a language tag (BCP-47: en, fr, pt-BR, zh)")
        if isinstance(value, list) and not value:
            raise ValueError("name at least one language (or leave it unset)")
        return value

    @field_validator("voice_aliases")
    @classmethod
    def _aliases_are_voice_ids(cls, aliases: dict[str, str]) -> dict[str, str]:
        """Both sides of an alias are voice ids (a request can name the one, the other names a
        voice), and an alias never names another alias: one lookup resolves it."""
        for alias, voice_id in aliases.items():
            if not (is_voice_id(alias) and is_voice_id(voice_id)):
                raise ValueError(f"voice alias {alias!r} -> {voice_id!r}: both must be voice ids")
            if voice_id in aliases:
                raise ValueError(f"voice alias {alias!r} names another alias, {voice_id!r}")
        return aliases

    def udp_port_range(self) -> tuple[int, int] | None:
        """``webrtc_udp_ports`` as (first, last), or None for any port."""
        if self.webrtc_udp_ports is None:
            return None
        first, last = (int(port) for port in self.webrtc_udp_ports.split("-"))
        return first, last

    def configured_model(self) -> str:
        """``model``, which serving without ``--dev`` needs (``voicehost.model.served``
        resolves what is served, the dev model's folders included); ``ValueError`` if unset."""
        if not self.model:
            raise ValueError("no model configured: pass --model (or VOICEHOST_MODEL) or --dev")
        return self.model

    def consent_required(self) -> bool:
        """Whether a clone from audio needs a consent record: ``require_consent``, by default
        everywhere but the dev model."""
        return not self.dev if self.require_consent is None else self.require_consent

    def frontend_count(self) -> int:
        """How many front ends share the engine core (``frontends``, with ``auto`` resolved)."""
        if self.frontends != "auto":
            return max(1, self.frontends)
        import os

        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return 1
        return max(1, min(16, (len(os.sched_getaffinity(0)) - 2) // 2))

    def encode_process_count(self) -> int:
        """How many encoding processes each serving process runs (``encode_processes``, with
        ``auto`` resolved: on a GPU host, two, which with ``frontends=auto`` (a front end per
        2 cores) share a front end's second core with the part of the first its loop leaves:
        docs/BENCHMARKS.md; the CPU engine's cores are the engine's)."""
        if self.encode_processes != "auto":
            return self.encode_processes
        from vllm.platforms import current_platform

        return 2 if current_platform.is_cuda() else 0

    def stream_capacity(self) -> int:
        """Streams this process admits at once (and reports to the cluster)."""
        return self.worker_capacity or self.max_num_seqs

    def served_base_name(self) -> str:
        """The base model name that adapters must declare."""
        if self.base_model_name:
            return self.base_model_name
        return "voicehost-dev" if self.dev else self.configured_model().rstrip("/").split("/")[-1]

    def audit_file(self, cluster: bool = False) -> Path:
        """Where the audit log is written: one server's file, or a cluster's mirror."""
        if self.audit_path is not None:
            return self.audit_path
        if cluster:
            return self.shared_dir / "audit" / "audit.jsonl"
        return self.adapters_dir.parent / "audit.jsonl"

    def usage_file(self) -> Path:
        """One server's usage file (a cluster keeps usage in Redis: ``usage_mirror_dir``)."""
        return self.usage_path or self.audit_file().parent / "usage.jsonl"

    def usage_mirror_dir(self) -> Path:
        """A cluster's mirror of its usage on the shared store: a file per counting process."""
        return self.shared_dir / "usage"
