"""The public API contract: pydantic models of requests and responses."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SUPPORTED_FORMATS = ("pcm", "wav")
PLANNED_FORMATS = ("mp3", "opus", "aac", "flac", "mulaw", "alaw")


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``: OpenAI's fields, plus ``seed``."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(
        "orpheus", description="Accepted for OpenAI compatibility; one model is served."
    )
    input: str = Field(description="The text to speak.")
    voice: str = Field(description="A voice id from GET /v1/audio/voices.")
    response_format: str = Field("wav", description="pcm (24 kHz s16le mono) or wav.")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="Playback speed; only 1.0 for now.")
    stream_format: Literal["audio", "sse"] = Field("audio", description="Raw audio or SSE events.")
    seed: int | None = Field(
        None, ge=0, lt=2**63, description="Sampling seed: same seed, same audio."
    )


class VoiceInfo(BaseModel):
    """One entry of ``GET /v1/audio/voices``."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    status: Literal["ready", "error"] = "ready"
    error: str | None = None


class VoiceList(BaseModel):
    voices: list[VoiceInfo]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error the API returns: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class VoiceDetail(BaseModel):
    """``GET /v1/voices/{id}``: a voice and its manifest (``voice.json``)."""

    id: str
    name: str
    kind: Literal["builtin", "adapter"]
    manifest: dict[str, object] = Field(default_factory=dict)


class CloneJobInfo(BaseModel):
    """A clone job: queued, preparing, training (with progress), done, failed or cancelled."""

    id: str
    voice_id: str
    status: Literal["queued", "preparing", "training", "done", "failed", "cancelled"]
    progress: float = Field(description="0..1 of the training steps")
    stage: str | None = None
    error: str | None = None
    eval_loss: list[float] = Field(default_factory=list)
    created: float
    updated: float
