"""voicehost's Pipecat TTS service (``voicehost.integrations.pipecat``) in a Pipecat pipeline of
Pipecat's own classes, on the shared dev server: an LLM's reply goes in as ``LLMTextFrame``s, the
service speaks it to an output transport that plays in real time, and Pipecat's assistant
aggregator writes what it is handed into the LLM context. Uninterrupted, every word comes back
timed, in order; interrupted mid-sentence, the context keeps only the words that had been
played."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from voicehost.client import AsyncClient, RealtimeSession
from voicehost.integrations.pipecat import VoicehostTTSService

TEXT = (
    "The first words of this answer will be heard, and then the listener cuts in. "
    "Everything after that point was never played, so it must not be kept in the history "
    "of the conversation, however much of it the server had already spoken."
)
SHORT = "Every word of this reply is heard, one after another, each at its own time."
RATE = 24000
PREBUFFER = 3.0  # the dev engine on these CPUs speaks slower than real time
NS = 1e9
Word = tuple[str, float]  # a word's text and its start in the reply's audio (seconds)


class Speaker(BaseOutputTransport):
    """Plays what it is written in real time, as a sound card does with a buffer of one chunk:
    a write returns when the chunk before it has played (so the transport's queue holds the rest,
    which an interruption clears), and when nothing is written the card falls silent."""

    def __init__(self) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=RATE))
        self.given = 0.0  # seconds of audio written
        self.ends = 0.0  # when (monotonic) what was written ends playing

    def position(self) -> float:
        """Seconds of audio played so far."""
        return self.given - max(0.0, self.ends - time.monotonic())

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = time.monotonic()
        starts = max(now, self.ends)
        duration = len(frame.audio) / (2 * RATE)
        self.ends = starts + duration
        self.given += duration
        await asyncio.sleep(starts - now)
        return True


class Recorder(FrameProcessor):
    """What the TTS service pushes, as it pushes it: the audio's length, and each word with its
    time in the reply's audio (its presentation time, from the clock at the reply's first
    audio, when Pipecat starts timing words)."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = 0.0  # seconds of audio pushed
        self.first_audio: int | None = None  # the clock (ns) at the first audio
        self.words: list[Word] = []  # (text, seconds into the audio)
        self.pts: list[int] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            if self.first_audio is None:
                self.first_audio = self.get_clock().get_time()
            self.audio += len(frame.audio) / (2 * frame.sample_rate)
        elif isinstance(frame, TTSTextFrame) and self.first_audio is not None:
            assert frame.pts, frame
            self.pts.append(frame.pts)
            self.words.append((frame.text, (frame.pts - self.first_audio) / NS))
        await self.push_frame(frame, direction)

    def position(self) -> float:
        """Seconds into the reply's audio by the pipeline's clock: the output transport hands
        on each word once this reaches its time."""
        if self.first_audio is None:
            return 0.0
        return (self.get_clock().get_time() - self.first_audio) / NS


class TappedSession(RealtimeSession):
    """voicehost's realtime session, keeping the word events it receives: the server's own
    word timing, to check Pipecat's against."""

    def __init__(self, client: AsyncClient, config: dict[str, Any], words: list[Word]) -> None:
        super().__init__(client, config)
        self.words = words

    async def __aiter__(self) -> AsyncIterator[bytes | dict[str, Any]]:
        async for item in super().__aiter__():
            if isinstance(item, dict) and item.get("type") == "word":
                self.words.append((item["text"], float(item["audio_start"])))
            yield item


class TappedClient(AsyncClient):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.words: list[Word] = []  # (text, start in the audio) as the server sent them

    def realtime(
        self, voice: str, *, response_format: str = "pcm", **config: Any
    ) -> RealtimeSession:
        body = {"type": "config", "voice": voice, "response_format": response_format}
        body.update((key, value) for key, value in config.items() if value is not None)
        return TappedSession(self, body, self.words)


def tokens(text: str) -> list[str]:
    """The text as an LLM streams it: a word and the space before it at a time."""
    return re.findall(r"\s*\S+", text)


def words(text: str) -> list[str]:
    return text.split()


class Conversation:
    """A Pipecat pipeline (the service, the recorder, the speaker, the assistant aggregator),
    run by Pipecat's runner for the length of an ``async with``."""

    def __init__(self, url: str) -> None:
        self.client = TappedClient(url)
        self.tts = VoicehostTTSService(
            voice="dev-a", client=self.client, seed=4, prebuffer_seconds=PREBUFFER
        )
        self.recorder, self.speaker = Recorder(), Speaker()
        self.context = LLMContext()
        self.assistant = LLMAssistantAggregator(self.context)
        self.cancelled: list[dict[str, Any]] = []  # the server's ``cancelled`` events
        self.turns: list[Any] = []  # the assistant aggregator's AssistantTurnStoppedMessages
        self.was_cancelled, self.turn_stopped = asyncio.Event(), asyncio.Event()

        @self.tts.event_handler("on_cancelled")
        async def on_cancelled(_: Any, context_id: str, event: dict[str, Any]) -> None:
            self.cancelled.append(event)
            self.was_cancelled.set()

        @self.assistant.event_handler("on_assistant_turn_stopped")
        async def on_turn_stopped(_: Any, message: Any) -> None:
            self.turns.append(message)
            self.turn_stopped.set()

        pipeline = Pipeline([self.tts, self.recorder, self.speaker, self.assistant])
        self.worker = PipelineWorker(
            pipeline,
            params=PipelineParams(audio_out_sample_rate=RATE),
            enable_rtvi=False,
            idle_timeout_secs=None,
        )
        self.runner = WorkerRunner(handle_sigint=False)

    async def __aenter__(self) -> Conversation:
        await self.runner.add_workers(self.worker)
        self.running = asyncio.create_task(self.runner.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.queue_frame(EndFrame())
        async with asyncio.timeout(60):
            await self.running
        await self.client.close()

    async def reply(self, text: str) -> None:
        """An LLM's reply, token by token."""
        await self.worker.queue_frame(LLMFullResponseStartFrame())
        for token in tokens(text):
            await self.worker.queue_frame(LLMTextFrame(token))
            await asyncio.sleep(0.02)
        await self.worker.queue_frame(LLMFullResponseEndFrame())

    async def turn(self) -> Any:
        """The assistant's turn, once the aggregator has stopped it."""
        async with asyncio.timeout(180):
            await self.turn_stopped.wait()
        return self.turns[-1]

    def kept(self) -> str:
        """The assistant's message in the LLM context."""
        messages = [m for m in self.context.get_messages() if m.get("role") == "assistant"]
        assert len(messages) == 1, messages
        return str(messages[0]["content"])


def word_clock_offset(pipecat: list[Word], server: list[Word]) -> float:
    """How far the recorder's clock runs behind Pipecat's word clock (``matches``), as the
    reply's first word shows it: 0, or less by the hop between them."""
    return pipecat[0][1] - server[0][1]


def matches(pipecat: list[Word], server: list[Word]) -> bool:
    """Whether Pipecat's words are the server's, each at the time the server gave it, to a
    hundredth of a second, on the reply's one timeline. Pipecat starts its words' clock as its
    TTS service takes the first audio, and the recorder reads the clock when that audio reaches
    it, a hop later: on a loaded machine that hop took 132 ms once, so every word is off by the
    same (the hop's, at most a second), and each word is where the server put it after that."""
    if not pipecat:
        return True
    hop = word_clock_offset(pipecat, server)
    return (
        len(pipecat) <= len(server)
        and -1.0 < hop < 0.01
        and all(
            text == said and abs(at - hop - start) < 0.01
            for (text, at), (said, start) in zip(pipecat, server, strict=False)
        )
    )


async def test_an_uninterrupted_reply_reaches_the_context_word_by_word_in_time(server):
    async with Conversation(server.url) as conversation:
        await conversation.reply(SHORT)
        turn = await conversation.turn()
    recorder, timing = conversation.recorder, conversation.client.words
    assert not turn.interrupted
    assert [text for text, _ in recorder.words] == words(SHORT)
    assert matches(recorder.words, timing), (recorder.words, timing)
    assert recorder.pts == sorted(set(recorder.pts)), recorder.words  # rising, none twice
    assert recorder.words[-1][1] < recorder.audio
    assert words(conversation.kept()) == words(SHORT)
    assert conversation.speaker.given >= recorder.audio  # all of it was played
    assert not conversation.cancelled


def cut_between_words(timed: list[Word]) -> tuple[int, float]:
    """Where to cut in: halfway between two words a quarter of a second apart or more, past the
    first second and inside the prebuffer (those words are known before it plays); the number
    of words before the cut, and its time."""
    for index, ((_, start), (_, after)) in enumerate(itertools.pairwise(timed)):
        if 1.0 <= start and after - start >= 0.25 and after <= PREBUFFER - 0.5:
            return index + 1, (start + after) / 2
    raise AssertionError(f"no two words to cut between: {timed}")


async def test_an_interrupted_reply_keeps_only_the_words_its_listener_heard(server):
    async with Conversation(server.url) as conversation:
        await conversation.reply(TEXT)
        speaker, recorder, timing = (
            conversation.speaker,
            conversation.recorder,
            conversation.client.words,
        )
        started = time.monotonic()
        while speaker.position() < 0.5:
            assert time.monotonic() - started < 120, "no audio played"
            await asyncio.sleep(0.02)
        before, cut = cut_between_words(timing)
        # the listener cuts in once the cut has played by the pipeline's clock, the one the
        # transport hands words on by (the speaker's own may lag it under load)
        while recorder.position() < cut:
            assert time.monotonic() - started < 120, "the cut never played"
            await asyncio.sleep(min(0.005, cut - recorder.position()))
        at, played, spoken = recorder.position(), speaker.position(), recorder.audio
        await conversation.worker.queue_frame(InterruptionFrame())
        turn = await conversation.turn()
        given = speaker.given
        async with asyncio.timeout(30):  # the server confirms the cancel
            await conversation.was_cancelled.wait()
        await asyncio.sleep(1.0)
        assert speaker.given == given  # nothing of the reply played after the interruption
    # the cut is halfway between two words; a loaded machine may wake this test later (the
    # words begun by then are the heard ones), not earlier. Pipecat hands on a word by its own
    # word clock, the hop ahead of the recorder's (132 ms once under load, when a word begun 11
    # ms after ``at`` by the recorder's clock was heard by Pipecat's)
    assert at >= cut
    heard_at = at - word_clock_offset(recorder.words, timing)
    heard_count = sum(1 for _, start in timing if start <= heard_at)
    assert heard_count >= before
    assert spoken >= played + 0.5  # more had been spoken than was played
    assert turn.interrupted
    # the context keeps exactly the words that, by the server's timing, began before the
    # listener cut in, though the server had spoken (and timed) more
    heard = words(conversation.kept())
    expected = [text for text, _ in timing[:heard_count]]
    assert heard == expected == words(TEXT)[:heard_count], (heard, heard_at, timing)
    assert len(timing) > heard_count and matches(recorder.words, timing), (recorder.words, timing)
    cancelled = conversation.cancelled[0]
    assert cancelled["type"] == "cancelled" and TEXT.startswith(cancelled["heard"]["text"])
