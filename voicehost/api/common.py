"""What every handler shares: the app keys and the one error shape."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from voicehost.api.schemas import ErrorDetail, ErrorResponse
from voicehost.cloning import CloneJobs
from voicehost.config import Settings
from voicehost.metrics import SpeechMetrics
from voicehost.runtime import Runtime
from voicehost.voices import VoiceDirectory


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
