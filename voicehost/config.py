"""All settings in one place: defaults, overridden by ``VOICEHOST_*`` variables, then by flags."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from voicehost.ids import is_voice_id
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths
from voicehost.tenancy.keys import ApiKey
from voicehost.tenancy.lexicons import LexiconLimits
from voicehost.voices.validation import AdapterRules, ModelShape

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


def _default_dev_dir() -> Path:
    return Path.home() / ".cache" / "voicehost" / "dev-model"


class Settings(BaseSettings):
    """The service configuration (see the table in the README)."""

    model_config = SettingsConfigDict(env_prefix="VOICEHOST_", extra="ignore")

    # What to serve
    dev: bool = Field(False, description="Serve the built-in tiny random-weight dev model.")
    model: str | None = Field(None, description="Orpheus weights: a local path or a hub id.")
    codec: str = Field("hubertsiuzdak/snac_24khz", description="SNAC 24 kHz: a path or hub id.")
    base_model_name: str | None = Field(
        None, description="Name adapters must declare as their base (default: the model's name)."
    )
    dev_dir: Path = Field(default_factory=_default_dev_dir, description="Dev model cache.")
    adapters_dir: Path = Field(Path("adapters"), description="Voice adapters: <dir>/<voice_id>/.")
    builtin_voices: list[str] = Field(
        default_factory=lambda: list(ORPHEUS_VOICES),
        description="Voices of the base model, spoken by prompt prefix without an adapter.",
    )
    adapter_scan_seconds: float = Field(2.0, description="How often the adapters dir is rescanned.")
    voice_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(OPENAI_VOICE_ALIASES),
        description="Other names of voices (alias -> voice id): OpenAI's onto built-in voices.",
    )

    # Voice cloning
    jobs_dir: Path = Field(Path("jobs"), description="Clone jobs: state and uploaded inputs.")
    max_upload_mb: float = Field(200.0, description="Largest upload to POST /v1/voices (413).")
    max_upload_minutes: float = Field(60.0, description="Most audio in one upload (413).")
    max_adapter_mb: float = Field(256.0, description="Largest uploaded adapter file (413).")
    min_speech_seconds: float = Field(30.0, description="Least usable speech to clone (400).")
    clone_epochs: int = Field(3, description="Training epochs of a clone job.")
    job_lease_seconds: float = Field(
        15.0,
        gt=0,
        description="A clone job's runner renews its claim every third of this; a job whose "
        "runner stopped for this long is taken over from its checkpoint.",
    )
    speaker_encoder: str | None = Field(
        None, description="Speaker encoder: resemblyzer, package.module:factory or a folder."
    )
    speaker_min_similarity: float = Field(
        0.92, ge=-1.0, le=1.0, description="Clips of a voice this unlike the upload's are left out."
    )
    speaker_min_pitch_shift: float = Field(
        1.2,
        ge=0.0,
        description="Semitones a group of clips' pitch stands apart to be another voice.",
    )
    eval_min_similarity: float = Field(
        0.75, description="A clone's least mean speaker similarity to its references to go live."
    )
    eval_min_gain: float = Field(
        0.02, description="How much closer than the closest built-in voice a clone must be."
    )
    eval_max_wer: float = Field(
        0.3, description="A clone's highest word error rate to go live (when ASR measures it)."
    )
    eval_sentences: int = Field(
        6, ge=1, le=6, description="Evaluation sentences a new clone is heard on (of the six)."
    )
    eval_baselines: int = Field(
        3, ge=0, description="Built-in voices tried as a clone's baseline (0: no baseline)."
    )
    eval_report_only: bool | None = Field(
        None,
        description="Evaluate clones without holding any (default: only with the dev model).",
    )
    require_consent: bool | None = Field(
        None,
        description="Cloning from audio needs a consent record (default: yes, but not with --dev).",
    )
    consent_min_similarity: float = Field(
        0.75,
        ge=-1.0,
        le=1.0,
        description="A consent recording this unlike the training audio's speaker is refused.",
    )

    # HTTP
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8080, description="Port to bind.")
    max_input_chars: int = Field(100_000, description="Longest accepted input (413 beyond).")
    ws_idle_timeout_seconds: float = Field(
        30.0, gt=0, description="A WebSocket with no message and nothing to speak is closed."
    )

    # WebRTC (POST /v1/audio/speech/webrtc)
    ice_servers: list[IceServer] = Field(
        default_factory=list,
        description="STUN/TURN servers (RTCConfiguration's iceServers JSON), used for this "
        "service's candidates and sent to clients in the answer's Link headers. None: host "
        "candidates only, no server contacted.",
    )
    webrtc_udp_ports: str | None = Field(
        None,
        pattern=r"^\d{1,5}-\d{1,5}$",
        description="The UDP ports WebRTC binds, `first-last` (a firewall's or a Kubernetes "
        "hostPort range); default: any free port.",
    )
    webrtc_announced_address: str | None = Field(
        None,
        description="The IP address the host candidates announce, in place of the interface's "
        "(a node's or NAT's public address, its UDP ports mapped one to one: a Kubernetes "
        "hostPort, a published Docker port).",
    )
    webrtc_max_sessions: int = Field(
        64, ge=0, description="WebRTC sessions one process holds at once (503 beyond)."
    )
    webrtc_max_pending: int = Field(
        32,
        ge=0,
        description="WebRTC offers one process has answered that are still waiting for their "
        "peer (no data channel and config yet), in all (503 beyond). A pending offer holds no "
        "stream slot: it takes one when its config arrives.",
    )
    webrtc_max_pending_per_key: int = Field(
        8, ge=0, description="Pending WebRTC offers of one API key (429 beyond)."
    )
    webrtc_max_pending_per_address: int = Field(
        4,
        ge=0,
        description="Pending WebRTC offers from one client address (429 beyond): a page opens "
        "one session at a time.",
    )
    webrtc_private_candidates: bool = Field(
        False,
        description="Send ICE checks to a client's private addresses (10/8, 172.16/12, "
        "192.168/16, fc00::/7 and the like): on for a service on a private network. Link-local, "
        "unspecified, multicast and broadcast addresses are never checked, loopback only when "
        "the service binds a loopback address.",
    )
    webrtc_connect_timeout_seconds: float = Field(
        15.0, gt=0, description="A WebRTC session whose data channel has not opened by then ends."
    )
    webrtc_consent_seconds: float = Field(
        30.0,
        gt=0,
        description="A WebRTC peer that answers no ICE consent check for this long is gone: its "
        "session ends and its stream is freed.",
    )

    # Authentication
    api_keys: list[ApiKey] = Field(
        default_factory=list, description="API keys: a JSON list of {id, tenant, scopes, sha256}."
    )
    api_keys_file: Path | None = Field(None, description="A JSON file of more API keys.")
    internal_token: SecretStr | None = Field(
        None, description="Shared secret of gateways and workers (internal routes, forwarding)."
    )
    metrics_public: bool = Field(True, description="Serve /metrics without a key (else admin).")
    token_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description="Signs the speech tokens of POST /v1/tokens (the same on every gateway and "
        "worker). Default: derived from VOICEHOST_INTERNAL_TOKEN, else from the keys' hashes; "
        "changing it (or removing a key) ends the tokens minted before.",
    )

    # Audit trail and usage
    audit_path: Path | None = Field(
        None,
        description="The audit log, JSONL (default: audit.jsonl beside the adapters folder; in "
        "a cluster, the mirror on the shared store, audit/audit.jsonl).",
    )
    usage_path: Path | None = Field(
        None, description="One server's usage buckets, JSONL (default: beside the audit log)."
    )
    usage_flush_seconds: float = Field(
        1.0, gt=0, description="How often counted usage is added to its store (file or Redis)."
    )
    usage_retention_days: float = Field(
        400.0, gt=0, description="How long a cluster's per-minute usage buckets stay in Redis."
    )
    # Pronunciation lexicons
    lexicons_dir: Path = Field(
        Path("lexicons"), description="Lexicons of `serve`: <dir>/<tenant>/<name>.json."
    )
    lexicon_max_entries: int = Field(1000, ge=1, description="Entries one lexicon holds (413).")
    lexicon_max_entry_chars: int = Field(
        200, ge=1, description="Longest grapheme or alias of an entry (400)."
    )
    lexicons_per_tenant: int = Field(100, ge=1, description="Lexicons one tenant keeps (400).")

    # Text
    segment_max_chars: int = Field(
        300, ge=80, description="Longest text segment; longer input is split at sentences."
    )
    continuity_frames: int = Field(
        48, ge=0, description="Frames of the previous segment a segment's prompt carries."
    )
    segment_prefetch: int = Field(
        1, ge=1, description="Segments of a long input generated at once when continuity is off."
    )
    trim_threshold_db: float = Field(
        -45.0, description="Level under which leading audio is trimmed (trim_silence)."
    )
    aligner_model: Path | None = Field(
        None,
        description="Word timing by forced alignment: a local folder with a CTC model and its "
        "processor (wav2vec2 / MMS, as transformers saves them); none: the built-in estimate.",
    )

    # Engine
    quantization: str = Field(
        "auto", description="auto (FP8 on CUDA >= 8.9), none, or a vLLM name."
    )
    dtype: str = Field("auto", description="Model dtype (auto: bfloat16 on GPU, float32 on CPU).")
    kv_cache_dtype: str = Field(
        "auto", description="KV cache dtype (auto: fp8 on CUDA >= 8.9, the model's elsewhere)."
    )
    max_model_len: int = Field(8192, description="Context length (prompt + audio tokens).")
    max_loras: int | Literal["auto"] = Field(
        "auto", description="Distinct adapters in one batch (auto: 8 on CPU, 8-64 on a GPU)."
    )
    max_lora_rank: int = Field(16, description="Highest adapter rank accepted.")
    max_cpu_loras: int = Field(64, description="Adapters kept loaded in the engine's cache.")
    max_num_seqs: int = Field(64, description="Streams batched in one engine step.")
    frontends: int | Literal["auto"] = Field(
        1,
        description="Serving processes sharing one engine core, all on the one port "
        "(--frontends); auto: one per 2 cores beyond the engine core's 2, at most 16, on a GPU "
        "(1 on the CPU engine).",
    )
    stream_interval: int = Field(
        7,
        ge=1,
        description="Tokens vLLM gathers for a request before it hands them over (its first "
        "token at once): 7, a frame, wakes the serving process once per frame, not per token.",
    )
    gpu_memory_utilization: float | None = Field(
        None, description="Share of accelerator memory for vLLM (auto: 0.9 GPU, 0.3 CPU)."
    )
    cpu_kv_cache_gib: int = Field(1, description="KV cache GiB for the CPU engine.")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (faster start).")

    # Cluster (voicehost worker / gateway)
    redis_url: str | None = Field(None, description="Redis of the cluster (worker and gateway).")
    worker_id: str | None = Field(None, description="A worker's stable id (default: host-port).")
    advertise_url: str | None = Field(
        None, description="URL gateways use to reach this worker (default: http://host:port)."
    )
    heartbeat_seconds: float = Field(1.0, description="How often a worker heartbeats.")
    worker_ttl_seconds: float = Field(5.0, description="A silent worker leaves after this long.")
    membership_poll_seconds: float = Field(1.0, description="How often gateways read members.")
    registry_reconcile_seconds: float = Field(
        2.0, gt=0, description="How often the voice records are checked against the shared store."
    )
    session_ttl_seconds: float = Field(600.0, description="Life of an idle session pin.")
    load_factor: float = Field(1.25, description="Bounded-load c: a worker takes <= c x average.")
    hot_voice_streams: int = Field(
        8, description="In-flight streams of one voice per extra worker it is replicated to."
    )
    worker_capacity: int | None = Field(
        None,
        ge=1,
        description="Streams this process admits at once and reports to the cluster: those it "
        "keeps real-time (beyond: 503; default max_num_seqs).",
    )
    realtime_tokens_per_second: float | None = Field(
        None,
        ge=0,
        description="Audio tokens/s that play in real time (auto: 82, Orpheus' 7 per 85 ms "
        "frame; off with --dev, whose CPU engine is not real time); a new stream is admitted "
        "only while the per-stream rate measured and predicted with it stays at least margin x "
        "this (0: off, the static capacity alone).",
    )
    realtime_margin: float = Field(
        1.2, gt=0, description="How far above real time each stream must stay to admit one more."
    )
    key_max_streams: int = Field(
        0, ge=0, description="Streams one API key may hold at once (beyond: 429; 0: no quota)."
    )
    drain_timeout_seconds: float = Field(
        60.0, ge=0, description="On SIGTERM, how long streams in flight may take to finish."
    )
    shared_dir: Path = Field(
        Path("shared"), description="Shared store of the cluster: adapters and clone jobs."
    )
    adapter_cache_dir: Path = Field(
        default_factory=lambda: _default_dev_dir().parent / "adapters",
        description="A worker's local cache of adapters fetched from the shared store.",
    )
    adapter_cache_mb: float = Field(2048.0, description="Size cap of the adapter cache (LRU).")
    redis_timeout_seconds: float = Field(0.5, description="Redis socket and connect timeout.")
    redis_retries: int = Field(2, description="Retries of a failed Redis command.")
    redis_pool_size: int = Field(32, description="Redis connections per process.")
    proxy_connections: int = Field(256, description="Gateway keep-alive connections to workers.")
    upstream_timeout_seconds: float = Field(
        120.0, description="A worker silent this long (before or within a stream) has failed."
    )

    # Sampling (Orpheus' stable defaults)
    temperature: float = Field(0.6, description="Sampling temperature.")
    top_p: float = Field(0.8, description="Nucleus sampling.")
    repetition_penalty: float = Field(1.1, description="Higher also speeds speech up.")
    constrained_sampling: bool = Field(
        True, description="Sample only the audio tokens of the next frame position (whole frames)."
    )

    # Decoding
    lookahead_frames: Literal[0, 1, 2] = Field(
        2, description="Right context per decode: 2 is exact, 0 and 1 trade exactness for latency."
    )
    codec_device: str | None = Field(None, description="SNAC device (auto: cuda if available).")
    codec_batch_window_ms: float = Field(
        10.0, ge=0, description="Longest wait to batch SNAC decodes of other streams."
    )
    codec_max_batch: int = Field(64, ge=1, description="Most stream windows in one SNAC decode.")
    codec_max_chunk_frames: int = Field(
        16, ge=1, description="Most new frames per decode once a stream is well ahead."
    )
    codec_threads: int | None = Field(
        None, ge=1, description="CPU threads for SNAC on CPU (auto: half the cores)."
    )
    codec_cuda_graphs: bool = Field(
        True, description="On a GPU, replay SNAC calls from CUDA graphs of bucketed shapes."
    )
    codec_noise: bool = Field(True, description="Keep SNAC's decoder noise (as trained).")

    # Audio out
    encode_threads: int | None = Field(
        None, ge=1, description="Threads that resample and encode audio (auto: the cores)."
    )
    encode_processes: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description="Encoding processes per serving process, 0 to 64 (0: encode on its "
        "threads); auto: 2 on a GPU, 0 on the CPU engine.",
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

    @model_validator(mode="after")
    def _segments_fit_the_context(self) -> Settings:
        """A segment of ``segment_max_chars`` must fit: the speech it needs, its text and the
        previous segment's carried in the prompt (at worst a token per character)."""
        chars = self.segment_max_chars
        needed = orpheus.min_audio_tokens("x" * chars) + 2 * chars + 7 * self.continuity_frames
        if needed + 32 > self.max_model_len:
            raise ValueError(
                f"segment_max_chars {chars} needs up to {needed + 32} tokens of context with "
                f"continuity_frames {self.continuity_frames}; max_model_len is "
                f"{self.max_model_len}: lower segment_max_chars"
            )
        return self

    def udp_port_range(self) -> tuple[int, int] | None:
        """``webrtc_udp_ports`` as (first, last), or None for any port."""
        if self.webrtc_udp_ports is None:
            return None
        first, last = (int(port) for port in self.webrtc_udp_ports.split("-"))
        return first, last

    def served_model(self) -> str:
        """The weights to load: the dev model's directory or the configured model."""
        if self.dev:
            return str(DevModelPaths(self.dev_dir).model)
        if not self.model:
            raise ValueError("no model configured: pass --model (or VOICEHOST_MODEL) or --dev")
        return self.model

    def consent_required(self) -> bool:
        """Whether a clone from audio needs a consent record: ``require_consent``, by default
        everywhere but the dev model."""
        return not self.dev if self.require_consent is None else self.require_consent

    def realtime_rate(self) -> float:
        """The tokens/s measured-capacity admission keeps every stream above (0: off)."""
        if self.realtime_tokens_per_second is not None:
            return self.realtime_tokens_per_second
        return 0.0 if self.dev else orpheus.AUDIO_TOKENS_PER_SECOND

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

    def served_codec(self) -> str:
        return str(DevModelPaths(self.dev_dir).codec) if self.dev else self.codec

    def served_base_name(self) -> str:
        """The base model name that adapters must declare."""
        if self.base_model_name:
            return self.base_model_name
        return "voicehost-dev" if self.dev else self.served_model().rstrip("/").split("/")[-1]

    def adapter_rules(self, shape: ModelShape | None = None) -> AdapterRules:
        """What adapters must be to be served: the served model by its configured name, path or
        hub id, at most ``max_lora_rank``, and ``shape``'s projection sizes if known."""
        aliases = (self.served_model(),) if self.served_model() != self.served_base_name() else ()
        return AdapterRules(self.served_base_name(), self.max_lora_rank, shape, aliases)

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

    def lexicon_limits(self) -> LexiconLimits:
        return LexiconLimits(
            self.lexicon_max_entries, self.lexicon_max_entry_chars, self.lexicons_per_tenant
        )

    def adapter_roots(self) -> list[Path]:
        """Folders holding ``<voice_id>/`` adapters: the adapters dir, plus the dev voices."""
        roots = [self.adapters_dir]
        if self.dev:
            roots.append(DevModelPaths(self.dev_dir).adapters)
        return roots
