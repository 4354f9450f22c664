"""voicehost's LiveKit Agents TTS (``voicehost.integrations.livekit``) with livekit-agents itself,
on the shared dev server: an ``AgentSession`` speaks through it to a speaker that plays in real
time (as a room's track does), with LiveKit's own transcript synchronizer between; interrupted,
the assistant message it keeps holds only the words the speaker had played."""

from __future__ import annotations

import asyncio
import time

from livekit import rtc
from livekit.agents import Agent, AgentSession, io
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from voicehost.integrations.livekit import TTS

TEXT = (
    "The first words of this answer will be heard, and then the listener cuts in. "
    "Everything after that point was never played, so it must not be kept in the history "
    "of the conversation, however much of it the server had already spoken."
)


class Speaker(io.AudioOutput):
    """Plays what it is given in real time from the first frame of a segment, as a room's
    audio track does; a clear stops it where the clock has got to."""

    def __init__(self) -> None:
        super().__init__(
            label="speaker",
            capabilities=io.AudioOutputCapabilities(pause=False),
            sample_rate=24000,
        )
        self.started: float | None = None  # the segment's first frame (monotonic)
        self.given = 0.0  # seconds of the segment given
        self.finishing: asyncio.TimerHandle | None = None
        self.played: list[float] = []  # each segment's playback position at its end

    def position(self) -> float:
        if self.started is None:
            return 0.0
        return min(self.given, time.monotonic() - self.started)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self.started is None:
            self.started = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self.given += frame.duration

    def flush(self) -> None:
        super().flush()
        if self.started is not None:  # it ends once what was given has played
            left = self.started + self.given - time.monotonic()
            loop = asyncio.get_running_loop()
            self.finishing = loop.call_later(max(0.0, left), self._finish, False)

    def clear_buffer(self) -> None:
        if self.started is not None:
            self._finish(True)

    def _finish(self, interrupted: bool) -> None:
        if self.finishing is not None:
            self.finishing.cancel()
            self.finishing = None
        position = self.position() if interrupted else self.given
        self.started, self.given = None, 0.0
        self.played.append(position)
        self.on_playback_finished(playback_position=position, interrupted=interrupted)


class Captions(io.TextOutput):
    def __init__(self) -> None:
        super().__init__(label="captions", next_in_chain=None)
        self.text = ""

    async def capture_text(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


async def test_an_interrupted_agent_keeps_only_the_words_its_listener_heard(server):
    voicehost = TTS(voice="dev-a", base_url=server.url, seed=4)
    session = AgentSession(tts=voicehost, use_tts_aligned_transcript=True)
    speaker, captions = Speaker(), Captions()
    synchronizer = TranscriptSynchronizer(
        next_in_chain_audio=speaker, next_in_chain_text=captions
    )
    session.output.audio = synchronizer.audio_output
    session.output.transcription = synchronizer.text_output
    await session.start(Agent(instructions="Say what you are told."))
    try:
        handle = session.say(TEXT, allow_interruptions=True)
        started = time.monotonic()
        while speaker.position() < 2.5:  # the listener hears 2.5 s, then cuts in
            assert time.monotonic() - started < 120, "no audio played"
            await asyncio.sleep(0.05)
        handle.interrupt()
        await handle
    finally:
        await session.aclose()
        await voicehost.aclose()
    played = speaker.played[-1]
    assert 2.5 <= played < 3.5
    print(played, session.history.items, captions.text)
    messages = [m for m in session.history.items if getattr(m, "role", None) == "assistant"]
    heard = messages[-1].text_content
    assert messages[-1].interrupted
    assert heard and TEXT.startswith(heard.rstrip()), heard
    assert len(heard) < len(TEXT) / 2  # far from all of what the server had spoken
