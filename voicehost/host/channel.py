"""The host's channel: how the front ends of one host speak to each other.

Each front end listens on a Unix socket in the host's folder (``frontend-<index>.sock``). A
message is a question and its answer on a connection of its own: one frame each way, a frame
being 4 bytes of length (big-endian) and that many bytes of a JSON object. The question is
``{"topic": ..., "body": {...}}``; the answer ``{"body": {...}}``, or ``{"error": "..."}`` when
the front end has no handler for the topic or its handler failed. Nothing is polled: a front
end's handler runs when a question arrives.

A front end that has gone (or has not opened its end yet) is not listening: asking it fails at
once with ``PeerGone``. One that does not answer within the asker's timeout is ``PeerSilent``;
one whose handler failed, ``PeerFailed``. Each is a ``ChannelError``, whose message names the
front end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Body = dict[str, Any]
Handler = Callable[[Body], Awaitable[Body]]

ASK_TIMEOUT_S = 2.0  # a question and its answer, connection included
MAX_FRAME_BYTES = 1 << 20  # what one frame may hold (a WebRTC trickle is at most 64 KiB)
_LENGTH = struct.Struct(">I")


class ChannelError(RuntimeError):
    """A front end of the host gave no answer to a question."""


class PeerGone(ChannelError):
    """Nothing listens at the front end's socket: it has ended, or not started yet."""


class PeerSilent(ChannelError):
    """The front end did not answer within the timeout."""


class PeerFailed(ChannelError):
    """The front end answered with an error: no handler for the topic, or its handler failed."""


def socket_path(folder: Path, index: int) -> Path:
    """Where front end ``index`` of the host whose folder is ``folder`` listens."""
    return folder / f"frontend-{index}.sock"


async def write_frame(writer: asyncio.StreamWriter, message: Body) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ValueError(f"a message is at most {MAX_FRAME_BYTES} bytes, not {len(data)}")
    writer.write(_LENGTH.pack(len(data)) + data)
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader) -> Body:
    """One frame's JSON object; ``ValueError`` for a frame too long or not an object, and
    ``asyncio.IncompleteReadError`` for a connection that ends inside one."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    message = json.loads(await reader.readexactly(length))
    if not isinstance(message, dict):
        raise ValueError("a frame that is not a JSON object")
    return message


class HostChannel:
    """Front end ``index`` of ``count``'s end of the channel of the host whose folder is
    ``folder``: it answers the topics given to ``on`` once ``open``, and asks the others."""

    def __init__(
        self, folder: Path, index: int, count: int, timeout: float = ASK_TIMEOUT_S
    ) -> None:
        self.folder = folder
        self.index = index
        self.count = count
        self.timeout = timeout
        self.path = socket_path(folder, index)
        self._handlers: dict[str, Handler] = {}
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.Task[None]] = set()

    @property
    def others(self) -> list[int]:
        """The other front ends of the host."""
        return [i for i in range(self.count) if i != self.index]

    def on(self, topic: str, handler: Handler) -> None:
        """Answer the questions of ``topic`` with what ``handler`` returns for their body."""
        if topic in self._handlers:
            raise ValueError(f"the topic {topic!r} has a handler already")
        self._handlers[topic] = handler

    async def open(self) -> None:
        """Listen on this front end's socket (a stale one left by a dead process is replaced)."""
        self._server = await asyncio.start_unix_server(self._answer, path=str(self.path))

    async def close(self) -> None:
        """Stop listening (the others' questions fail with ``PeerGone`` from now on) and drop
        the questions being answered."""
        if self._server is None:
            return
        self._server.close()
        self.path.unlink(missing_ok=True)
        for task in list(self._answering):
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def ask(self, peer: int, topic: str, body: Body, within: float | None = None) -> Body:
        """Front end ``peer``'s answer to ``topic`` with ``body``, within ``within`` seconds
        (the channel's timeout by default); a ``ChannelError`` that says why when there is
        none."""
        name = f"front end {peer} of this host"
        timeout = self.timeout if within is None else within
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(socket_path(self.folder, peer))
                try:
                    await write_frame(writer, {"topic": topic, "body": body})
                    answer = await read_frame(reader)
                finally:
                    writer.close()
                    with suppress(ConnectionError):
                        await writer.wait_closed()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise PeerGone(f"{name} is not listening ({exc.strerror})") from exc
        except TimeoutError as exc:
            raise PeerSilent(f"{name} did not answer {topic!r} in {timeout:g} s") from exc
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise PeerGone(f"{name} closed the connection before answering {topic!r}") from exc
        if "error" in answer:
            raise PeerFailed(f"{name} could not answer {topic!r}: {answer['error']}")
        return answer.get("body", {})

    async def ask_others(self, topic: str, body: Body) -> dict[int, Body | ChannelError]:
        """Every other front end's answer to ``topic``, asked at once, or why it gave none."""
        others = self.others
        answers = await asyncio.gather(
            *(self.ask(peer, topic, body) for peer in others), return_exceptions=True
        )
        found: dict[int, Body | ChannelError] = {}
        for peer, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, ChannelError):
                raise answer
            found[peer] = answer
        return found

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One question, answered; a connection that sends none in the timeout is closed."""
        task = asyncio.current_task()
        assert task is not None
        self._answering.add(task)
        try:
            async with asyncio.timeout(self.timeout):
                question = await read_frame(reader)
            answer = await self._handle(question)
            await write_frame(writer, answer)
        except (TimeoutError, ValueError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.warning("the host's channel: a question dropped (%s)", exc or type(exc).__name__)
        finally:
            self._answering.discard(task)
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    async def _handle(self, question: Body) -> Body:
        topic = question.get("topic")
        handler = self._handlers.get(topic) if isinstance(topic, str) else None
        if handler is None:
            return {"error": f"front end {self.index} has no handler for {topic!r}"}
        try:
            return {"body": await handler(question.get("body") or {})}
        except Exception as exc:
            log.exception("the host's channel: %r failed", topic)
            return {"error": f"{type(exc).__name__}: {exc}"}
