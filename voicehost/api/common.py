"""What every handler shares: the app keys and the one error shape."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from voicehost.api.schemas import ErrorDetail, ErrorResponse, SpeechOptions
from voicehost.audio import UnsupportedAudio, output_rate
from voicehost.auth import Principal, can_see
from voicehost.cloning import CloneJobs
from voicehost.config import Settings
from voicehost.metrics import SpeechMetrics
from voicehost.runtime import Runtime
from voicehost.synthesis import SpeakOptions
from voicehost.voices import Voice, VoiceDirectory


class VoiceService(Protocol):
    """What the voice and job routes need: a serving runtime and a gateway both provide it."""

    settings: Settings
    metrics: SpeechMetrics
    registry: VoiceDirectory
    jobs: CloneJobs


RUNTIME = web.AppKey("runtime", Runtime)
SERVICE = web.AppKey("service", VoiceService)


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(status: int, code: str, message: str) -> web.Response:
    body = ErrorResponse(error=ErrorDetail(code=code, message=message))
    return web.json_response(body.model_dump(), status=status)


def check_audio_options(body: SpeechOptions) -> int:
    """The output sample rate of ``body``'s format and rate; 400 if they cannot be served."""
    try:
        return output_rate(body.response_format, body.sample_rate)
    except UnsupportedAudio as exc:
        raise ApiError(400, "unsupported_format", str(exc)) from exc


def speak_options(body: SpeechOptions, settings: Settings) -> SpeakOptions:
    return SpeakOptions(
        seed=body.seed,
        normalize=body.normalize,
        continuity_frames=settings.continuity_frames if body.continuity else 0,
        prefetch=settings.segment_prefetch,
        trim_db=settings.trim_threshold_db if body.trim_silence else None,
    )


def voice_not_found(voice_id: str) -> ApiError:
    """The one answer for a voice that does not exist, or is another tenant's."""
    return ApiError(404, "voice_not_found", f"voice {voice_id!r} does not exist")


async def find_voice(runtime: Runtime, voice_id: str, principal: Principal | None) -> Voice:
    """The voice ``principal`` speaks with: 404 if there is none (or it is another tenant's), 422
    if its adapter is unusable (told only to an admin or in open mode: its tenant is unknown)."""
    voice = await runtime.registry.find(voice_id)
    if voice is None:
        broken = runtime.registry.broken(voice_id)
        if broken is not None and (principal is None or principal.admin):
            raise ApiError(422, "voice_unusable", f"voice {voice_id!r} is unusable: {broken}")
        raise voice_not_found(voice_id)
    if not can_see(principal, voice.tenant):
        raise voice_not_found(voice_id)
    return voice
