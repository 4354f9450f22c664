"""voicehost as a LiveKit Agents TTS: ``voicehost.integrations.livekit.TTS``.

Each synthesis is one realtime session (``/v1/audio/speech/ws``, through ``voicehost.client``)
with word timing on: the text is sent as it comes (an LLM's tokens), the audio is played as it
arrives (PCM, 24 kHz mono), and each ``word`` event becomes a ``TimedString`` of the aligned
transcript: the text sent up to the word's end, timed from the session's first audio. So an
``AgentSession`` with ``use_tts_aligned_transcript`` keeps, when the user interrupts, only the
words the listener heard.

    from livekit.agents import AgentSession
    from voicehost.integrations.livekit import TTS

    session = AgentSession(tts=TTS(voice="tara", base_url="http://gpu-box:8000"), ...)

Needs ``livekit-agents`` (not a dependency of the service: ``pip install livekit-agents``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from livekit.agents import (
    APIConnectionError,
    APIConnectOptions,
    APIStatusError,
    tts,
    utils,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, TimedString

from voicehost.client import DEFAULT_URL, ApiError, AsyncClient, RealtimeSession
from voicehost.model.orpheus import SAMPLE_RATE


class TTS(tts.TTS):
    """A voice of a voicehost server. ``options``: the session's config (``speed``, ``seed``,
    ``lexicons``, ``normalize``, ...; see the API reference); word timing is always on."""

    def __init__(
        self,
        *,
        voice: str,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        client: AsyncClient | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=SAMPLE_RATE,
            num_channels=1,
        )
        self.voice = voice
        self.options = options
        self._client = client or AsyncClient(base_url, api_key)

    @property
    def model(self) -> str:
        return "orpheus"

    @property
    def provider(self) -> str:
        return "voicehost"

    def session(self) -> RealtimeSession:
        """A realtime session of this voice, its words timed."""
        return self._client.realtime(
            self.voice, response_format="pcm", timestamps="word", **self.options
        )

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        await self._client.close()


class Transcript:
    """The text sent so far, and the aligned transcript of it: each word event becomes the
    text from the last word's end to this one's (its spaces and punctuation included), so the
    pieces join into exactly the text sent."""

    def __init__(self) -> None:
        self.text = ""
        self.given = 0  # characters of ``text`` given as timed pieces

    def piece(self, word: dict[str, Any]) -> TimedString:
        end = int(word["end"])
        piece = TimedString(
            self.text[self.given : end],
            start_time=float(word["audio_start"]),
            end_time=float(word["audio_end"]),
        )
        self.given = end
        return piece


async def play(session: RealtimeSession, emitter: tts.AudioEmitter, transcript: Transcript) -> None:
    """The session's audio and aligned transcript into ``emitter``, until ``done``."""
    async for item in session:
        if isinstance(item, bytes):
            emitter.push(item)
        elif item.get("type") == "word":
            emitter.push_timed_transcript(transcript.piece(item))
        elif item.get("type") == "error":
            error = item.get("error", {})
            raise APIStatusError(
                f"voicehost: {error.get('code')}: {error.get('message')}",
                status_code=500,
                body=error,
                retryable=False,
            )
        elif item.get("type") == "done":
            return


def api_error(exc: Exception) -> Exception:
    """LiveKit's error for a failure of the server or of the connection to it."""
    if isinstance(exc, ApiError):
        retryable = exc.status in (None, 429, 502, 503)
        return APIStatusError(
            f"voicehost: {exc}", status_code=exc.status or 500, body=None, retryable=retryable
        )
    return APIConnectionError(f"voicehost: {type(exc).__name__}: {exc}")


class ChunkedStream(tts.ChunkedStream):
    """One text, spoken in one session."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._voicehost = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=SAMPLE_RATE,
            num_channels=1,
            mime_type="audio/pcm",
        )
        transcript = Transcript()
        try:
            async with self._voicehost.session() as session:
                transcript.text = self._input_text
                await session.send_text(self._input_text)
                await session.end()
                await play(session, output_emitter, transcript)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            raise api_error(exc) from exc


class SynthesizeStream(tts.SynthesizeStream):
    """Text as it comes (``push_text``; ``flush`` speaks what is buffered), spoken in one
    session as it arrives."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._voicehost = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id,
            sample_rate=SAMPLE_RATE,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        output_emitter.start_segment(segment_id=request_id)
        transcript = Transcript()
        try:
            async with self._voicehost.session() as session:

                async def send() -> None:
                    async for data in self._input_ch:
                        if isinstance(data, self._FlushSentinel):
                            await session.flush()
                            continue
                        self._mark_started()
                        transcript.text += data
                        await session.send_text(data)
                    await session.end()

                sender = asyncio.create_task(send(), name="voicehost-livekit-send")
                try:
                    await play(session, output_emitter, transcript)
                finally:
                    await utils.aio.gracefully_cancel(sender)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            raise api_error(exc) from exc
        output_emitter.end_segment()
