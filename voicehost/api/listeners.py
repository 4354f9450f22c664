"""Who a realtime session talks with: a WebSocket, or a WebRTC peer (its data channel for the
messages, its audio track for the audio). The session (``api/realtime.py``) and the gateway's
relay speak to a ``Listener`` and never to a transport, so the protocol is written once."""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from contextlib import suppress

from aiohttp import WSCloseCode, WSMsgType, web

from voicehost.api.speech import RealtimeConfig

log = logging.getLogger(__name__)


class NotText(Exception):
    """A message that is not text (the protocol's messages are JSON text)."""


class Listener(ABC):
    """The far end of a realtime session."""

    transport: str  # "websocket" or "webrtc"

    @property
    @abstractmethod
    def closed(self) -> bool: ...

    def shape(self, config: RealtimeConfig) -> RealtimeConfig:
        """The config as this transport speaks it (WebRTC: PCM at 48 kHz for its track)."""
        return config

    @abstractmethod
    async def receive(self, within: float | None) -> str | None:
        """The next message; None once the listener has gone. ``TimeoutError`` after
        ``within`` seconds without one, ``NotText`` for a message that is not text."""

    @abstractmethod
    async def send_text(self, text: str) -> None:
        """An event, as JSON text (``ConnectionError`` once the listener has gone)."""

    async def send_event(self, event: dict[str, object]) -> None:
        await self.send_text(json.dumps(event))

    @abstractmethod
    async def send_audio(self, data: bytes) -> None:
        """Audio in the session's format (a socket's ``response_format``; PCM for WebRTC)."""

    def played_seconds(self, sent: float, since: float | None) -> float:
        """How much of the ``sent`` seconds of audio the listener has played, by the server's
        clock: a socket's client is taken to play from its first audio (sent at ``since``)
        in real time."""
        return 0.0 if since is None else min(sent, time.monotonic() - since)

    @abstractmethod
    async def close(self, reason: str = "") -> None:
        """The end of a session that finished (``done``, or an idle timeout)."""

    @abstractmethod
    async def end_with(self, event: dict[str, object], retry_later: bool = False) -> None:
        """An ``error`` event, then the end: refused (``retry_later``: a refusal that waiting
        may lift), or failed on the server's side (``event`` an error after audio began)."""

    @abstractmethod
    async def fail(self, event: dict[str, object]) -> None:
        """A stream that failed mid-way: ``event``, then an end that reads as a failure."""


class SocketListener(Listener):
    """A realtime WebSocket (``/v1/audio/speech/ws``)."""

    transport = "websocket"

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def receive(self, within: float | None) -> str | None:
        message = await self.ws.receive(timeout=within)
        if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
            return None
        if message.type == WSMsgType.ERROR:
            log.info("websocket error: %s", self.ws.exception())
            return None
        if message.type != WSMsgType.TEXT:
            raise NotText
        return str(message.data)

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def send_audio(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close(self, reason: str = "") -> None:
        await self.ws.close(message=reason.encode())

    async def end_with(self, event: dict[str, object], retry_later: bool = False) -> None:
        """A policy-violation close; a try-again-later close (1013) for ``retry_later``."""
        close = WSCloseCode.TRY_AGAIN_LATER if retry_later else WSCloseCode.POLICY_VIOLATION
        error = event.get("error")
        code = str(error.get("code", "")) if isinstance(error, dict) else ""
        with suppress(ConnectionError):
            await self.ws.send_str(json.dumps(event))
            await self.ws.close(code=close, message=code.encode())

    async def fail(self, event: dict[str, object]) -> None:
        """Closed with 1011: an error on the server's side."""
        with suppress(ConnectionError):
            await self.ws.send_str(json.dumps(event))
            await self.ws.close(code=WSCloseCode.INTERNAL_ERROR)
