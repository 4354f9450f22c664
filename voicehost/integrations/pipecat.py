"""voicehost as a Pipecat TTS service: ``voicehost.integrations.pipecat.VoicehostTTSService``.

Each reply (a Pipecat audio context: one LLM turn, or one ``TTSSpeakFrame``) is one realtime
session (``/v1/audio/speech/ws``, through ``voicehost.client``) with word timing on: the text is
sent as the LLM writes it (token by token by default: the server cuts it into segments itself),
the audio comes back as PCM at the pipeline's rate, and each ``word`` event is handed to Pipecat
as a word timestamp (``add_word_timestamps``, the word's text and its start in the reply's
audio), from which Pipecat makes the ``TTSTextFrame`` the output transport releases when the
word's time comes. On an interruption the session is sent ``cancel`` (the server stops at once)
and Pipecat drops the words whose time had not come, so the assistant's context keeps only what
was heard. So that ``cancel`` can reach the server while the reply plays, the end of the reply's
text is a ``flush``; ``end`` follows once the server has spoken all of it (the server takes no
message after ``end``).

    from pipecat.pipeline.pipeline import Pipeline
    from voicehost.integrations.pipecat import VoicehostTTSService

    tts = VoicehostTTSService(voice="tara", base_url="http://gpu-box:8000", speed=1.1)
    pipeline = Pipeline([..., llm, tts, transport.output(), context_aggregator.assistant()])

Needs ``pipecat-ai`` (not a dependency of the service: ``pip install "voicehost[pipecat]"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pipecat.frames.frames import (
    CancelFrame,
    ErrorFrame,
    Frame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService

from voicehost.client import DEFAULT_URL, ApiError, AsyncClient, RealtimeSession
from voicehost.text.stage import has_speech

# A reply's audio context waits this long for its next item before Pipecat takes it as
# finished; a voicehost reply always ends with ``done`` (or an error), so this only guards a
# server gone silent, and is long enough for a server slower than real time.
STOP_FRAME_TIMEOUT_S = 20.0


@dataclass
class Reply:
    """One reply's realtime session, and what its receiver has seen of it."""

    session: RealtimeSession
    receiver: asyncio.Task[None] | None = None
    text: str = ""  # the text sent
    flushed: bool = False  # the text is complete: the server speaks all of it
    segment_ends: dict[int, int] = field(default_factory=dict)  # each segment's end in ``text``
    spoken_to: int = 0  # the end of the last segment spoken, in ``text``
    ended: bool = False  # ``end`` was sent: the server's ``done`` ends the reply
    cancelled: bool = False  # ``cancel`` was sent: the rest is dropped until ``cancelled``
    held: list[bytes | tuple[str, float]] = field(default_factory=list)  # audio and words
    held_seconds: float = 0.0
    playing: bool = False  # past the prebuffer: audio and words go straight to Pipecat

    def spoken(self) -> bool:
        """Whether the server has spoken all the text (what is left has nothing to say)."""
        return self.flushed and not has_speech(self.text[self.spoken_to :])


class VoicehostTTSService(TTSService):
    """A voice of a voicehost server, its words timed. The session's config: ``speed``,
    ``seed``, ``lexicons`` (the tenant's lexicon names), ``normalize``, ``continuity``,
    ``trim_silence`` (as for ``POST /v1/audio/speech``; unset: the server's defaults); the format
    is always PCM at the pipeline's output rate (``sample_rate`` to fix another: 8000, 16000,
    22050, 24000, 44100 or 48000), resampled by the server. Other keywords are Pipecat's own
    (``TTSService``: ``text_transforms``, ``skip_text_types``, ...).

    ``prebuffer_seconds``: how much of each reply's audio to gather before any of it is played.
    Pipecat times words from a reply's first audio, so on a server slower than real time
    (voicehost on a CPU) the words would run ahead of the audio; a prebuffer that covers what may
    be interrupted keeps them together. 0 (the default) on a server faster than real time.

    Event ``on_cancelled(service, context_id, event)``: the server's ``cancelled`` event after an
    interruption, with what its own clock says was heard (``heard``, ``played_seconds``).
    """

    def __init__(
        self,
        *,
        voice: str,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        client: AsyncClient | None = None,
        speed: float | None = None,
        seed: int | None = None,
        lexicons: list[str] | None = None,
        normalize: bool | None = None,
        continuity: bool | None = None,
        trim_silence: bool | None = None,
        sample_rate: int | None = None,
        prebuffer_seconds: float = 0.0,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("stop_frame_timeout_s", STOP_FRAME_TIMEOUT_S)
        super().__init__(
            settings=TTSSettings(model="orpheus", voice=voice, language=None),
            sample_rate=sample_rate,
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # the words come timed, as they are heard
            push_start_frame=True,
            append_trailing_space=True,  # sentences, when aggregated, are sent apart
            **kwargs,
        )
        self.options: dict[str, Any] = {
            "speed": speed,
            "seed": seed,
            "lexicons": lexicons,
            "normalize": normalize,
            "continuity": continuity,
            "trim_silence": trim_silence,
        }
        self.prebuffer_seconds = prebuffer_seconds
        self._own_client = client is None
        self._client = client or AsyncClient(base_url, api_key)
        self._replies: dict[str, Reply] = {}
        self._failed: str | None = None  # the reply whose session could not be opened
        self._register_event_handler("on_cancelled")

    def can_generate_metrics(self) -> bool:
        return True

    def session(self) -> RealtimeSession:
        """A realtime session of the current voice, PCM at the pipeline's rate, words timed."""
        return self._client.realtime(
            str(self._settings.voice),
            response_format="pcm",
            sample_rate=self.sample_rate,
            timestamps="word",
            **self.options,
        )

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Sends ``text`` to the reply's session, opened on its first text; the audio and words
        come back through the session's receiver."""
        if context_id == self._failed:
            return
        reply = self._replies.get(context_id)
        try:
            if reply is None:
                reply = await self._open(context_id)
            if not reply.cancelled:
                reply.text += text
                reply.flushed = False
                await reply.session.send_text(text)
        except (ApiError, aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            self._failed = context_id  # the reply's end closes its audio context
            await self._close(context_id)
            yield ErrorFrame(error=f"voicehost: {describe(exc)}")
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The reply's text is complete: ``flush``, so the server speaks all of it now."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id is not None and context_id == self._failed:
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
            return
        reply = self._replies.get(context_id or "")
        if reply is None or reply.flushed or reply.ended or reply.cancelled:
            return
        reply.flushed = True
        try:
            await reply.session.flush()
            await self._end_if_spoken(reply)
        except (aiohttp.ClientError, ConnectionError) as exc:
            await self.push_error(error_msg=f"voicehost: {describe(exc)}", exception=exc)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: ``cancel``, so the server stops generating at once; its ``cancelled``
        (passed to ``on_cancelled``) ends the session. In the moment between ``end`` and
        ``done``, when the server takes no more messages, the session is closed instead."""
        await self.stop_all_metrics()
        reply = self._replies.get(context_id)
        if reply is not None and not reply.cancelled:
            reply.cancelled = True
            try:
                if reply.ended:  # the server takes no ``cancel`` after ``end``: a close aborts
                    await self._close(context_id)
                else:
                    await reply.session.cancel()
            except (aiohttp.ClientError, ConnectionError):
                await self._close(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close_all()

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._close_all()
        if self._own_client:
            await self._client.close()

    async def _open(self, context_id: str) -> Reply:
        session = self.session()
        await session.__aenter__()
        reply = Reply(session=session, playing=self.prebuffer_seconds <= 0)
        self._replies[context_id] = reply
        reply.receiver = self.create_task(self._receive(context_id, reply), "voicehost-receive")
        return reply

    async def _receive(self, context_id: str, reply: Reply) -> None:
        """The session's audio and words into the reply's audio context, until ``done``."""
        try:
            async for item in reply.session:
                if reply.cancelled:  # what comes before ``cancelled`` was never heard
                    if isinstance(item, dict) and item.get("type") == "cancelled":
                        await self._call_event_handler("on_cancelled", context_id, item)
                        return
                elif isinstance(item, bytes):
                    await self._hold(context_id, reply, item)
                elif item.get("type") == "word":
                    await self._hold(context_id, reply, (item["text"], float(item["audio_start"])))
                elif item.get("type") == "segment.started":
                    reply.segment_ends[int(item["segment"])] = int(item["end"])
                elif item.get("type") == "segment.done":
                    reply.spoken_to = reply.segment_ends.pop(int(item["segment"]), reply.spoken_to)
                    await self._end_if_spoken(reply)
                elif item.get("type") == "done":
                    await self._end(context_id, reply)
                    return
                elif item.get("type") == "error":
                    error = item.get("error", {})
                    message = f"{error.get('code')}: {error.get('message')}"
                    await self._end(context_id, reply, error=message)
                    return
            if not reply.cancelled:
                await self._end(context_id, reply, error="the session closed before its end")
        except (aiohttp.ClientError, ConnectionError) as exc:
            await self._end(context_id, reply, error=describe(exc))
        finally:
            if self._replies.get(context_id) is reply:
                del self._replies[context_id]
            await reply.session.close()

    async def _end_if_spoken(self, reply: Reply) -> None:
        """``end`` once the server has spoken the whole reply, so that it sends ``done``."""
        if reply.spoken() and not reply.ended and not reply.cancelled:
            reply.ended = True
            await reply.session.end()

    async def _hold(self, context_id: str, reply: Reply, item: bytes | tuple[str, float]) -> None:
        """Audio or a word of the reply, held while the prebuffer fills, then played."""
        reply.held.append(item)
        if isinstance(item, bytes):
            reply.held_seconds += len(item) / (2 * self.sample_rate)
        if reply.playing or reply.held_seconds >= self.prebuffer_seconds:
            await self._play(context_id, reply)

    async def _play(self, context_id: str, reply: Reply) -> None:
        """What is held into the reply's audio context, in the order it came."""
        reply.playing = True
        held, reply.held = reply.held, []
        for item in held:
            if reply.cancelled:
                return
            if isinstance(item, bytes):
                frame = TTSAudioRawFrame(item, self.sample_rate, 1, context_id=context_id)
                await self.append_to_audio_context(context_id, frame)
            else:
                await self.add_word_timestamps([item], context_id)

    async def _end(self, context_id: str, reply: Reply, *, error: str | None = None) -> None:
        """The reply is over (``done``, or an error): what is held plays, then it stops."""
        await self._play(context_id, reply)
        if error is not None:
            await self.push_error(error_msg=f"voicehost: {error}")
        await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
        await self.remove_audio_context(context_id)

    async def _close(self, context_id: str) -> None:
        reply = self._replies.pop(context_id, None)
        if reply is None:
            return
        if reply.receiver is not None and reply.receiver is not asyncio.current_task():
            await self.cancel_task(reply.receiver)
        await reply.session.close()

    async def _close_all(self) -> None:
        for context_id in list(self._replies):
            await self._close(context_id)


def describe(exc: Exception) -> str:
    """A failure of the server or of the connection to it, in a line."""
    if isinstance(exc, ApiError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
