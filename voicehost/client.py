"""The Python client of a voicehost server: speech to a file, audio chunks as they stream, and
realtime sessions (text in as it comes, audio out, cancel on barge-in); async and sync.

    from voicehost.client import Client

    with Client("http://127.0.0.1:8080", api_key=None) as client:
        client.speak_to_file("Hello there.", "tara", "hello.mp3")  # the format from the suffix
        captioned = client.captioned("Hello there.", "tara")  # wav, and each word's timing
        for chunk in client.stream("Hello there.", "tara"):  # 24 kHz s16le pcm by default
            play(chunk)
        with client.realtime("tara") as session:
            session.send_text("Hello there, ")
            session.send_text("how are you?")
            session.end()
            for item in session:  # bytes: audio; dict: an event ("segment.started" ...)
                ...

``AsyncClient`` is the same with ``await`` (``async with``, ``async for``); ``Client`` runs one
on a loop of its own in a background thread, so it works from code that has no event loop. One
``aiohttp`` session per client, reused for every request. A refusal raises ``ApiError`` with the
server's status, code and message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
from yarl import URL

from voicehost.cloning.evaluation import Sample, Speak

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"
# A file's suffix -> the response format it holds (``voicehost say -o speech.mp3``).
SUFFIX_FORMATS: dict[str, str] = {
    ".mp3": "mp3",
    ".wav": "wav",
    ".pcm": "pcm",
    ".raw": "pcm",
    ".opus": "opus",
    ".ogg": "opus",
    ".flac": "flac",
    ".aac": "aac",
    ".ulaw": "mulaw",
    ".mulaw": "mulaw",
    ".alaw": "alaw",
}


class ApiError(Exception):
    """The server refused: its HTTP status (or a realtime ``error`` event's), code and message."""

    def __init__(self, status: int | None, code: str, message: str) -> None:
        super().__init__(f"{f'HTTP {status}: ' if status else ''}{message} ({code})")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class SpeechResult:
    """A speech saved to a file: where, in which format, how many bytes, and how long the first
    audio byte and the whole took."""

    path: Path
    response_format: str
    bytes: int
    first_byte_seconds: float
    total_seconds: float


@dataclass(frozen=True, slots=True)
class Captioned:
    """Speech with its words' timing (the captioned endpoint): the audio file's bytes, its
    format and sample rate, what timed the words, and each word as ``{"text", "said", "start",
    "end", "audio_start", "audio_end"}`` (its span in the text, what it was said as, its seconds
    in the audio)."""

    audio: bytes
    response_format: str
    sample_rate: int
    aligner: str
    words: list[dict[str, Any]]


def format_for(path: Path | str) -> str:
    """The response format a file's suffix names (``.mp3`` -> mp3); ``ValueError`` otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        known = ", ".join(SUFFIX_FORMATS)
        raise ValueError(f"cannot tell the audio format of {str(path)!r}: name it {known}")
    return SUFFIX_FORMATS[suffix]


def _speech_body(text: str, voice: str, response_format: str, options: dict[str, Any]) -> dict:
    body: dict[str, Any] = {"input": text, "voice": voice, "response_format": response_format}
    body.update((key, value) for key, value in options.items() if value is not None)
    return body


async def _error_of(response: aiohttp.ClientResponse) -> ApiError:
    text = await response.text()
    try:
        error = json.loads(text)["error"]
        return ApiError(response.status, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(response.status, "http_error", text.strip() or response.reason or "")


class AsyncClient:
    """A voicehost server's API from asyncio code. ``options`` of the speech methods are the
    request's other fields (``sample_rate``, ``speed``, ``seed``, ``normalize``, ``continuity``,
    ``trim_silence``, ``instructions``; see docs/API.md); ``None`` leaves one out."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 300.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owns_session = session is None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on first use: it needs the running loop
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def stream(
        self, text: str, voice: str, *, response_format: str = "pcm", **options: Any
    ) -> AsyncIterator[bytes]:
        """The audio of ``text`` in chunks as the server sends them (``pcm``: 24 kHz s16le mono
        unless ``sample_rate`` says otherwise). Closing the iterator early drops the request,
        and the server aborts its generation."""
        body = _speech_body(text, voice, response_format, options)
        url = f"{self.base_url}/v1/audio/speech"
        async with self.session.post(url, json=body, headers=self._headers) as response:
            if response.status != 200:
                raise await _error_of(response)
            async for chunk in response.content.iter_any():
                yield chunk

    async def speak(
        self, text: str, voice: str, *, response_format: str = "mp3", **options: Any
    ) -> bytes:
        """The whole audio of ``text``, as one file of ``response_format``."""
        chunks = [
            c async for c in self.stream(text, voice, response_format=response_format, **options)
        ]
        return b"".join(chunks)

    async def speak_to_file(
        self,
        text: str,
        voice: str,
        path: Path | str,
        *,
        response_format: str | None = None,
        **options: Any,
    ) -> SpeechResult:
        """Stream the speech of ``text`` into ``path`` as it arrives, in ``response_format``
        (by default the one its suffix names: ``format_for``). A WAV file gets its real sizes
        written into the header at the end, for players that do not stream."""
        path = Path(path)
        fmt = response_format or format_for(path)
        started = time.monotonic()
        first: float | None = None
        written = 0
        sink = await asyncio.to_thread(path.open, "wb")
        with sink:
            async for chunk in self.stream(text, voice, response_format=fmt, **options):
                if first is None:
                    first = time.monotonic() - started
                sink.write(chunk)
                written += len(chunk)
        if fmt == "wav":
            _fix_wav_sizes(path)
        return SpeechResult(path, fmt, written, first or 0.0, time.monotonic() - started)

    async def captioned(
        self, text: str, voice: str, *, response_format: str = "wav", **options: Any
    ) -> Captioned:
        """``POST /v1/audio/speech/captioned``: the whole audio of ``text`` and every word's
        timing (its span in ``text``, its start and end in seconds of the audio)."""
        body = _speech_body(text, voice, response_format, options)
        url = f"{self.base_url}/v1/audio/speech/captioned"
        async with self.session.post(url, json=body, headers=self._headers) as response:
            if response.status != 200:
                raise await _error_of(response)
            answer = await response.json()
        return Captioned(
            base64.b64decode(answer["audio"]),
            answer["response_format"],
            answer["sample_rate"],
            answer["aligner"],
            answer["words"],
        )

    async def voices(self) -> list[dict[str, Any]]:
        """``GET /v1/audio/voices``: every voice this key may use (id, name, kind, status,
        aliases)."""
        return (await self._get_json("/v1/audio/voices"))["voices"]

    async def models(self) -> list[str]:
        """``GET /v1/models``: the model names a speech request may send."""
        return [model["id"] for model in (await self._get_json("/v1/models"))["data"]]

    async def mint_token(
        self,
        ttl_seconds: float = 60.0,
        *,
        voices: list[str] | None = None,
        origin: str | None = None,
        max_streams: int | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/tokens``: a short-lived speech token for a browser (``token``,
        ``expires_at``): a client made with it as its ``api_key`` speaks and does nothing
        else; bound to ``voices``, an ``origin`` and ``max_streams`` at once if given. Mint it
        where the key lives (an app's backend) and hand the page only it."""
        body: dict[str, Any] = {"ttl_seconds": ttl_seconds}
        bounds = (("voices", voices), ("origin", origin), ("max_streams", max_streams))
        body.update((k, v) for k, v in bounds if v is not None)
        url = self.base_url + "/v1/tokens"
        async with self.session.post(url, json=body, headers=self._headers) as response:
            if response.status != 201:
                raise await _error_of(response)
            return await response.json()

    def realtime(
        self, voice: str, *, response_format: str = "pcm", **config: Any
    ) -> RealtimeSession:
        """A realtime session (``/v1/audio/speech/ws``) with ``voice``; ``config`` as for
        ``stream``. Use it as ``async with client.realtime(...) as session``."""
        body = {"type": "config", "voice": voice, "response_format": response_format}
        body.update((key, value) for key, value in config.items() if value is not None)
        return RealtimeSession(self, body)

    def webrtc(self, voice: str, **config: Any) -> WebRtcSession:
        """The same session over WebRTC (``/v1/audio/speech/webrtc``): audio on an Opus track,
        events on a data channel, with ``realtime``'s interface; its audio is PCM (s16le mono)
        at 48 kHz, as the track plays it."""
        body: dict[str, Any] = {"type": "config", "voice": voice}
        body.update((key, value) for key, value in config.items() if value is not None)
        return WebRtcSession(self, body)

    async def _get_json(self, path: str) -> Any:
        async with self.session.get(self.base_url + path, headers=self._headers) as response:
            if response.status != 200:
                raise await _error_of(response)
            return await response.json()


class RealtimeSession:
    """One realtime socket: send text as it comes, ``flush``, ``cancel``, ``end``; iterate for
    what the server sends: ``bytes`` of audio and ``dict`` events, until the socket closes.

    ``cancel`` is barge-in: after it, no audio of what was cancelled comes out of the iterator
    (what was already on the wire is dropped until the server's ``cancelled`` event, which is
    passed on). A config the server refuses raises ``ApiError`` on entering; a later ``error``
    event is passed on as an event.
    """

    def __init__(self, client: AsyncClient, config: dict[str, Any]) -> None:
        self._client = client
        self._config = config
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._cancelling = 0  # cancels sent whose ``cancelled`` has not come back yet
        self.ready: dict[str, Any] = {}  # the server's ``ready`` event

    async def __aenter__(self) -> RealtimeSession:
        url = self._client.base_url.replace("http", "ws", 1) + "/v1/audio/speech/ws"
        try:
            self._ws = await self._client.session.ws_connect(url, headers=self._client._headers)
        except aiohttp.WSServerHandshakeError as exc:
            code = (exc.headers or {}).get("X-Voicehost-Error-Code", "upgrade_refused")
            raise ApiError(exc.status, code, exc.message) from exc
        await self._ws.send_json(self._config)
        message = await self._ws.receive()
        event = json.loads(message.data) if message.type == aiohttp.WSMsgType.TEXT else {}
        if event.get("type") != "ready":
            await self._ws.close()
            error = event.get("error", {})
            raise ApiError(None, error.get("code", "closed"), error.get("message", str(event)))
        self.ready = event
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def send_text(self, text: str) -> None:
        await self._send({"type": "text", "text": text})

    async def flush(self) -> None:
        """Speak what is buffered now, without waiting for a sentence end."""
        await self._send({"type": "flush"})

    async def cancel(self) -> None:
        """Barge-in: the server stops at once and drops the queued text."""
        self._cancelling += 1
        await self._send({"type": "cancel"})

    async def end(self) -> None:
        """No more text: the server speaks what is left, sends ``done`` and closes."""
        await self._send({"type": "end"})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            raise RuntimeError("the session is not open: use it as `async with`")
        await self._ws.send_json(message)

    async def __aiter__(self) -> AsyncIterator[bytes | dict[str, Any]]:
        if self._ws is None:
            raise RuntimeError("the session is not open: use it as `async with`")
        async for message in self._ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                if not self._cancelling:
                    yield message.data
            elif message.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(message.data)
                if event.get("type") == "cancelled":
                    self._cancelling = max(0, self._cancelling - 1)
                yield event


class WebRtcSession:
    """One realtime session over WebRTC, used as ``RealtimeSession`` is: ``send_text``,
    ``flush``, ``cancel``, ``end``, and iterating for ``bytes`` of audio (PCM s16le mono at
    48 kHz, decoded from the track as it arrives) and ``dict`` events (the data channel's),
    until the session ends.

    After ``cancel``, the audio that arrives until the server's ``cancelled`` is dropped; the
    server drops what it had queued, so at most the packets already on their way (about 100 ms,
    this client's jitter buffer) may still come after it, as a listener would hear them."""

    def __init__(self, client: AsyncClient, config: dict[str, Any]) -> None:
        self._client = client
        self._config = config
        self._pc: Any = None  # aiortc's RTCPeerConnection
        self._channel: Any = None
        self._inbox: asyncio.Queue[bytes | dict[str, Any] | None] = asyncio.Queue()
        self._cancelling = 0
        self._reader: asyncio.Task[None] | None = None
        self.location: str | None = None  # the session's URL
        self.ready: dict[str, Any] = {}

    async def __aenter__(self) -> WebRtcSession:
        from aiortc import RTCPeerConnection, RTCSessionDescription

        self._pc = pc = RTCPeerConnection()
        self._channel = channel = pc.createDataChannel("voicehost")
        pc.addTransceiver("audio", direction="recvonly")
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", self._message)
        channel.on("close", lambda: self._inbox.put_nowait(None))

        @pc.on("track")
        def on_track(track: Any) -> None:
            self._reader = asyncio.create_task(self._read(track))

        try:
            await pc.setLocalDescription(await pc.createOffer())
            url = self._client.base_url + "/v1/audio/speech/webrtc"
            headers = {**self._client._headers, "Content-Type": "application/sdp"}
            async with self._client.session.post(
                url, data=pc.localDescription.sdp, headers=headers
            ) as response:
                if response.status != 201:
                    raise await _error_of(response)
                answer = await response.text()
                self.location = str(response.url.join(URL(response.headers["Location"])))
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            async with asyncio.timeout(20):
                await opened.wait()
            channel.send(json.dumps(self._config))
            event = await self._inbox.get()
        except BaseException:
            await self.close()
            raise
        if not isinstance(event, dict) or event.get("type") != "ready":
            await self.close()
            error = event.get("error", {}) if isinstance(event, dict) else {}
            raise ApiError(None, error.get("code", "closed"), error.get("message", str(event)))
        self.ready = event
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _message(self, message: str | bytes) -> None:
        if isinstance(message, str):
            self._inbox.put_nowait(json.loads(message))

    async def _read(self, track: Any) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            channels = frame.to_ndarray().reshape(-1, len(frame.layout.channels))
            self._inbox.put_nowait(channels[:, 0].astype("<i2").tobytes())

    async def close(self) -> None:
        """End the session (``DELETE`` its URL) and the peer connection."""
        if self.location is not None:
            location, self.location = self.location, None
            try:
                async with self._client.session.delete(location, headers=self._client._headers):
                    pass
            except aiohttp.ClientError:
                pass  # the peer connection's close ends it too
        if self._pc is not None:
            await self._pc.close()
        if self._reader is not None:
            self._reader.cancel()
        self._inbox.put_nowait(None)

    async def send_text(self, text: str) -> None:
        self._send({"type": "text", "text": text})

    async def flush(self) -> None:
        self._send({"type": "flush"})

    async def cancel(self) -> None:
        self._cancelling += 1
        self._send({"type": "cancel"})

    async def end(self) -> None:
        self._send({"type": "end"})

    def _send(self, message: dict[str, Any]) -> None:
        if self._channel is None or self._channel.readyState != "open":
            raise RuntimeError("the session is not open: use it as `async with`")
        self._channel.send(json.dumps(message))

    async def __aiter__(self) -> AsyncIterator[bytes | dict[str, Any]]:
        while (item := await self._inbox.get()) is not None:
            if isinstance(item, bytes):
                if not self._cancelling:
                    yield item
                continue
            if item.get("type") == "cancelled":
                self._cancelling = max(0, self._cancelling - 1)
            yield item


class Client:
    """``AsyncClient``'s methods without ``await``: an event loop of its own in a daemon thread
    runs them. Close it (or use ``with``) to stop the thread."""

    def __init__(
        self, base_url: str = DEFAULT_URL, api_key: str | None = None, *, timeout: float = 300.0
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="voicehost-client", daemon=True
        )
        self._thread.start()
        self._async = AsyncClient(base_url, api_key, timeout=timeout)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _next(self, items: AsyncIterator[T]) -> T:
        return await anext(items)

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """``items`` consumed on the client's loop, one at a time, as a plain iterator; leaving
        the loop early closes it there."""
        try:
            while True:
                try:
                    yield self._run(self._next(items))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                self._run(aclose())

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stream(
        self, text: str, voice: str, *, response_format: str = "pcm", **options: Any
    ) -> Iterator[bytes]:
        return self._iterate(
            self._async.stream(text, voice, response_format=response_format, **options)
        )

    def speak(
        self, text: str, voice: str, *, response_format: str = "mp3", **options: Any
    ) -> bytes:
        return self._run(self._async.speak(text, voice, response_format=response_format, **options))

    def speak_to_file(
        self,
        text: str,
        voice: str,
        path: Path | str,
        *,
        response_format: str | None = None,
        **options: Any,
    ) -> SpeechResult:
        return self._run(
            self._async.speak_to_file(text, voice, path, response_format=response_format, **options)
        )

    def captioned(
        self, text: str, voice: str, *, response_format: str = "wav", **options: Any
    ) -> Captioned:
        return self._run(
            self._async.captioned(text, voice, response_format=response_format, **options)
        )

    def voices(self) -> list[dict[str, Any]]:
        return self._run(self._async.voices())

    def models(self) -> list[str]:
        return self._run(self._async.models())

    def mint_token(
        self,
        ttl_seconds: float = 60.0,
        *,
        voices: list[str] | None = None,
        origin: str | None = None,
        max_streams: int | None = None,
    ) -> dict[str, Any]:
        return self._run(
            self._async.mint_token(
                ttl_seconds, voices=voices, origin=origin, max_streams=max_streams
            )
        )

    def realtime(
        self, voice: str, *, response_format: str = "pcm", **config: Any
    ) -> SyncRealtimeSession:
        return SyncRealtimeSession(
            self, self._async.realtime(voice, response_format=response_format, **config)
        )


class SyncRealtimeSession:
    """``RealtimeSession`` for ``Client``: ``with client.realtime(...) as session``."""

    def __init__(self, client: Client, session: RealtimeSession) -> None:
        self._client = client
        self._session = session

    @property
    def ready(self) -> dict[str, Any]:
        return self._session.ready

    def __enter__(self) -> SyncRealtimeSession:
        self._client._run(self._session.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client._run(self._session.close())

    def send_text(self, text: str) -> None:
        self._client._run(self._session.send_text(text))

    def flush(self) -> None:
        self._client._run(self._session.flush())

    def cancel(self) -> None:
        self._client._run(self._session.cancel())

    def end(self) -> None:
        self._client._run(self._session.end())

    def __iter__(self) -> Iterator[bytes | dict[str, Any]]:
        return self._client._iterate(self._session.__aiter__())


def http_speaker(client: AsyncClient, seed: int | None = None) -> Speak:
    """A ``Speak`` through ``client`` (24 kHz pcm): the evaluation's way to a running server.
    A refused request raises ``ApiError``."""

    async def speak(voice: str, sentence: str) -> Sample:
        started = time.monotonic()
        pcm = await client.speak(sentence, voice, response_format="pcm", seed=seed)
        samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float32) / 32768
        return Sample(voice, sentence, samples, time.monotonic() - started)

    return speak


def _fix_wav_sizes(path: Path) -> None:
    """Replace the streaming header's "unknown" sizes with the real ones, for strict players."""
    size = path.stat().st_size
    with path.open("r+b") as wav:
        wav.seek(4)
        wav.write((size - 8).to_bytes(4, "little"))
        wav.seek(40)
        wav.write((size - 44).to_bytes(4, "little"))
