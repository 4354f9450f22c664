"""What every handler shares: the app's runtime key and the one error shape."""

from __future__ import annotations

from aiohttp import web

from voicehost.api.schemas import ErrorDetail, ErrorResponse
from voicehost.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)


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
