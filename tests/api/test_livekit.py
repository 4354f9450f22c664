"""voicehost's LiveKit Agents TTS (``voicehost.integrations.livekit``) with livekit-agents itself,
on the shared dev server: an ``AgentSession`` speaks through it to a speaker that plays in real
time (as a room's track does), with LiveKit's own transcript synchronizer between; interrupted,
the assistant message it keeps holds only the words the speaker had played."""

from __future__ import annotations

import asyncio
import time

from livekit import rtc
from livekit.agents import Agent, AgentSession, io
from livekit.agents.tts.tts import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.types import TimedString
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from voicehost.integrations.livekit import TTS

TEXT = (
    "The first words of this answer will be heard, and then the listener cuts in. "
    "Everything after that point was never played, so it must not be kept in the history "
    "of the conversation, however much of it the server had already spoken."
)


class Speaker(io.AudioOutput):
    """Plays what it is given in real time, as a room's audio track does, once it holds
    ``PREBUFFER`` seconds (the dev engine on these CPUs speaks slower than real time); a clear
    stops it where its clock has got to. It keeps the words' timing the frames carry."""

    PREBUFFER = 3.0

    def __init__(self) -> None:
        super().__init__(
            label="speaker",
            capabilities=io.AudioOutputCapabilities(pause=False),
            sample_rate=24000,
        )
        self.started: float | None = None  # when the segment began to play (monotonic)
        self.given = 0.0  # seconds of the segment given
        self.finishing: asyncio.TimerHandle | None = None
        self.played: list[float] = []  # each segment's playback position at its end
        self.words: list[TimedString] = []

    def position(self) -> float:
        if self.started is None:
            return 0.0
        return min(self.given, time.monotonic() - self.started)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self.words += frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
        self.given += frame.duration
        if self.started is None and self.given >= self.PREBUFFER:
            self.started = time.monotonic()
            self.on_playback_started(created_at=time.time())

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
    synchronizer = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=captions)
    session.output.audio = synchronizer.audio_output
    session.output.transcription = synchronizer.text_output
    await session.start(Agent(instructions="Say what you are told."))
    try:
        handle = session.say(TEXT, allow_interruptions=True)
        started = time.monotonic()
        while speaker.position() < 2.5:  # the listener hears 2.5 s, then cuts in
            assert time.monotonic() - started < 120, "no audio played"
            await asyncio.sleep(0.05)
        spoken = speaker.given  # what the server had sent when the listener cut in
        handle.interrupt()
        await handle
    finally:
        await session.aclose()
        await voicehost.aclose()
    played = speaker.played[-1]
    assert 2.5 <= played < 3.0
    assert spoken >= played + 0.5  # more had been spoken than was played
    messages = [m for m in session.history.items if getattr(m, "role", None) == "assistant"]
    assert messages and messages[-1].interrupted
    heard = messages[-1].text_content or ""
    assert TEXT.startswith(heard.rstrip()), heard
    assert TEXT.startswith("".join(speaker.words))  # the pieces are the text sent, whole
    # the transcript is what the words' timing says was played: LiveKit paces it between
    # them, so the last word under way may or may not be in; none that began after the
    # interruption is, and every one that had ended well before it is
    ended_before = "".join(w for w in speaker.words if w.end_time <= played - 0.5)
    begun_before = "".join(w for w in speaker.words if w.start_time <= played)
    timed = [(str(w), w.start_time, w.end_time) for w in speaker.words]
    assert ended_before, timed  # words that had ended were known by then
    assert len(ended_before.rstrip()) <= len(heard.rstrip()) <= len(begun_before), (
        heard,
        played,
        timed,
    )
