"""Where a response's audio is encoded: off the serving process's event loop, in threads or in
encoding processes of its own.

``EncodingPool`` hands out one ``FormatStream`` per response: ``await encode(pcm)`` per
chunk, then ``await finish()``, each returning the bytes of ``voicehost.audio.formats`` ready then.
pcm and wav at the model's rate and speed are encoded on the loop (a conversion to s16 costs less
than a hop); the rest (codecs, resampling, time stretch) goes to

- **threads** (``VOICEHOST_ENCODE_PROCESSES=0``, the CPU engine's default): PyAV and soxr
  release the GIL while they work, so streams encode on every core. But PyAV releases and takes
  it back around every codec call, hundreds of times per audio second, and each time the event
  loop waits for it the two hand it over: at 64 mp3 streams this costs a serving process 3.5-5
  ms of CPU per audio second more than the same encoding one stream after another
  (docs/BENCHMARKS.md).
- **processes** (``VOICEHOST_ENCODE_PROCESSES=N``, 2 on a GPU by default): N encoding
  processes per serving process, each one thread encoding its share of the streams one chunk
  at a time, fed the PCM over a Unix socket. The serving process's part is one write and one
  read per chunk, and no GIL is shared. A stream goes to the process with the fewest open
  streams. An encoding process that dies fails the calls of its streams (``EncodingFailed``:
  the response ends as any failed stream does) and is replaced for the next ones; one whose
  serving process is gone reads the end of its socket and exits.

Wire format, both ways: a header (``_HEADER``: stream id, op, payload length) and the payload.
To the encoding process: ``_OPEN`` (JSON: fmt, sample_rate, speed), ``_ENCODE`` (float32
samples), ``_FINISH``, ``_DROP`` (an abandoned stream). Back: one answer per ``_ENCODE`` or
``_FINISH``, in order, ``_OK`` with the bytes or ``_FAILED`` with the error's text.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import numpy as np

from voicehost.audio.formats import FormatWriter, check_stream, costly, output_samples

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IBI")  # stream id, op (or answer), payload bytes
_OPEN, _ENCODE, _FINISH, _DROP = range(4)
_OK, _FAILED = range(2)
CLOSE_SECONDS = 2.0  # how long a closed encoding process may take to read its socket's end


class EncodingFailed(RuntimeError):
    """A stream's encoding failed in its encoding process, or that process ended."""


def default_encode_threads() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class FormatStream:
    """One response's audio in its format, wherever it is encoded: ``await encode(pcm)`` per
    chunk of the model's float32 samples, then ``await finish()``; await each call before making
    the next. What they return, concatenated, is one whole stream of ``fmt`` (``FormatWriter``'s
    contract).

    This class encodes on the loop (cheap formats); its subclasses hop to a thread or to an
    encoding process. A call whose caller was cancelled is still done before the next one.
    """

    def __init__(self, fmt: str, sample_rate: int | None, speed: float) -> None:
        self.fmt = fmt
        self.sample_rate = check_stream(fmt, sample_rate, speed)  # the output rate
        self.speed = speed
        self._asked = sample_rate
        self._local: FormatWriter | None = None  # built at the first call, if on the loop

    def output_samples(self, model_samples: int) -> int:
        """How many samples of this stream ``model_samples`` of the model's audio become."""
        return output_samples(model_samples, self.sample_rate, self.speed)

    async def encode(self, samples: np.ndarray) -> bytes:
        """The bytes ``samples`` make ready now, possibly b""."""
        return self._writer().encode(samples)

    async def finish(self) -> bytes:
        """The rest of the stream, trailer included."""
        return self._writer().finish()

    def _writer(self) -> FormatWriter:
        if self._local is None:
            self._local = FormatWriter(self.fmt, self._asked, self.speed)
        return self._local


class _ThreadStream(FormatStream):
    """Encoded on the pool's threads, one call at a time (a lock: a cancelled caller's call
    still ends in its thread before the next starts)."""

    def __init__(
        self, fmt: str, sample_rate: int | None, speed: float, executor: ThreadPoolExecutor
    ) -> None:
        super().__init__(fmt, sample_rate, speed)
        self._executor = executor
        self._lock = threading.Lock()

    async def encode(self, samples: np.ndarray) -> bytes:
        return await self._run(lambda writer: writer.encode(samples))

    async def finish(self) -> bytes:
        return await self._run(FormatWriter.finish)

    async def _run(self, call: Callable[[FormatWriter], bytes]) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._locked, call)

    def _locked(self, call: Callable[[FormatWriter], bytes]) -> bytes:
        with self._lock:
            return call(self._writer())


class _ProcessStream(FormatStream):
    """Encoded in one encoding process; dropped there if abandoned before its ``finish``."""

    def __init__(
        self, fmt: str, sample_rate: int | None, speed: float, process: EncodingProcess
    ) -> None:
        super().__init__(fmt, sample_rate, speed)
        self._process = process
        self._id = process.open(fmt, sample_rate, speed)
        self._dropped = weakref.finalize(self, process.drop, self._id)

    async def encode(self, samples: np.ndarray) -> bytes:
        data = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        return await self._process.call(self._id, _ENCODE, data.tobytes())

    async def finish(self) -> bytes:
        self._dropped.detach()  # the encoding process forgets the stream after its finish
        return await self._process.call(self._id, _FINISH)


class EncodingProcess:
    """One encoding process, seen from the serving process: its socket, and the calls waiting
    for their answers (per stream, in order). Used from one event loop."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "voicehost.audio.encoding", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._socket = ours
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connected: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, deque[asyncio.Future[bytes]]] = {}
        self._unsent: list[bytes] = []  # opens, sent with their stream's first call
        self.streams = 0  # open streams: the pool gives a new one to the least busy process
        self.lost: str | None = None  # why it can take no more calls

    def open(self, fmt: str, sample_rate: int | None, speed: float) -> int:
        stream_id = next(self._ids)
        spec = {"fmt": fmt, "sample_rate": sample_rate, "speed": speed}
        self._waiting[stream_id] = deque()
        self.streams += 1
        self._unsent.append(self._frame(stream_id, _OPEN, json.dumps(spec).encode()))
        return stream_id

    async def call(self, stream_id: int, op: int, payload: bytes = b"") -> bytes:
        """Send one call of the stream and wait for its answer."""
        if self.lost is not None:
            raise EncodingFailed(self.lost)
        await self._connect()
        if self.lost is not None:  # lost while connecting
            raise EncodingFailed(self.lost)
        assert self._writer is not None and self._loop is not None
        answer: asyncio.Future[bytes] = self._loop.create_future()
        self._waiting[stream_id].append(answer)
        if op == _FINISH:
            self.streams -= 1
        header = _HEADER.pack(stream_id, op, len(payload))
        self._writer.writelines([*self._unsent, header, payload])  # no copy of the payload
        self._unsent.clear()
        return await answer

    def drop(self, stream_id: int) -> None:
        """The stream was abandoned (garbage-collected before its ``finish``): forget it here
        and in the encoding process, on the loop's thread (whichever thread collected it)."""

        def forget() -> None:
            self.streams -= 1
            self._waiting.pop(stream_id, None)
            unsent = len(self._unsent)
            self._unsent[:] = [f for f in self._unsent if _HEADER.unpack_from(f)[0] != stream_id]
            if len(self._unsent) == unsent and self._writer is not None and self.lost is None:
                self._writer.write(self._frame(stream_id, _DROP))  # it was opened there

        loop = self._loop
        if loop is None or loop.is_closed():  # never called, or no loop left: nothing to send
            forget()
            return
        try:
            loop.call_soon_threadsafe(forget)
        except RuntimeError:  # the loop closed meanwhile
            pass

    @staticmethod
    def _frame(stream_id: int, op: int, payload: bytes = b"") -> bytes:
        return _HEADER.pack(stream_id, op, len(payload)) + payload

    async def _connect(self) -> None:
        """The socket's transport, made by the first call (the others wait for it)."""
        if self._connected is None:
            self._loop = asyncio.get_running_loop()
            self._connected = self._loop.create_task(self._open())
        await asyncio.shield(self._connected)

    async def _open(self) -> None:
        assert self._loop is not None
        reader, self._writer = await asyncio.open_unix_connection(sock=self._socket)
        self._reading = self._loop.create_task(self._read(reader), name="encoding-answers")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                stream_id, status, length = _HEADER.unpack(await reader.readexactly(_HEADER.size))
                payload = await reader.readexactly(length) if length else b""
                waiting = self._waiting.get(stream_id)
                if not waiting:
                    continue  # dropped meanwhile
                answer = waiting.popleft()
                if answer.done():  # its caller was cancelled
                    continue
                if status == _OK:
                    answer.set_result(payload)
                else:
                    answer.set_exception(EncodingFailed(payload.decode(errors="replace")))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._lose(f"the encoding process ended ({type(exc).__name__})")

    def _lose(self, why: str) -> None:
        """No more calls: the waiting ones fail (said once in the log, unless closed)."""
        if self.lost is None:
            code = self.process.poll()
            self.lost = why if code is None else f"the encoding process ended (exit status {code})"
            log.warning("encoding process %d: %s", self.process.pid, self.lost)
        for waiting in self._waiting.values():
            for answer in waiting:
                if not answer.done():
                    answer.set_exception(EncodingFailed(self.lost))
        self._waiting.clear()

    def ended(self) -> bool:
        """Whether it takes no more calls: lost, or exited though the end of its socket has not
        been read yet (its loop reads it only while a call waits): a stream given to it now
        would fail at its first call, before any byte of its response."""
        if self.lost is None and (code := self.process.poll()) is not None:
            self._lose(f"the encoding process ended (exit status {code})")
        return self.lost is not None

    def close(self) -> None:
        """End the encoding process: it reads the end of its socket and exits (it ignores the
        signals a terminal or a service manager sends the whole group: its serving process
        drains first, and its streams with it)."""
        self.lost = "the encoding pool was closed"
        self._lose(self.lost)
        try:  # the end of its socket now: a transport closes only once its loop runs again
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._writer is not None and self._loop is not None and not self._loop.is_closed():
            assert self._reading is not None
            self._reading.cancel()
            self._writer.close()
        else:  # never used, or its loop is gone (the transport with it)
            self._socket.close()
        try:
            self.process.wait(CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class EncodingPool:
    """The serving process's encoding: one ``FormatStream`` per response, encoded on the loop
    (cheap formats), on ``threads`` threads, or in ``processes`` encoding processes when
    ``processes`` is above 0 (the module docstring says which costs what).

    Each stream sends one call at a time and waits for it, so a stream has at most one chunk in
    the pool and a stream whose encoding falls behind waits for it while the others go on.
    """

    def __init__(self, threads: int | None = None, processes: int = 0) -> None:
        self.threads = threads or default_encode_threads()
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="audio-encode")
        self._processes: list[EncodingProcess] = [EncodingProcess() for _ in range(processes)]

    def stream(self, fmt: str, sample_rate: int | None = None, speed: float = 1.0) -> FormatStream:
        """The format stream of one response (``FormatWriter``'s arguments and errors)."""
        if not costly(fmt, sample_rate, speed):
            return FormatStream(fmt, sample_rate, speed)
        if not self._processes:
            return _ThreadStream(fmt, sample_rate, speed, self._executor)
        for index, process in enumerate(self._processes):
            if process.ended():  # a new one for the next streams
                process.close()
                self._processes[index] = EncodingProcess()
        process = min(self._processes, key=lambda p: p.streams)
        return _ProcessStream(fmt, sample_rate, speed, process)

    @property
    def pids(self) -> list[int]:
        """The encoding processes' pids (none with threads)."""
        return [process.process.pid for process in self._processes]

    def encoding_cpu(self) -> float:
        """The CPU seconds (user and system) the live encoding processes have used so far."""
        ticks = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:  # ended, or no /proc here
                continue
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in self._processes:
            process.close()


def serve_streams(connection: BinaryIO, answer: Callable[[bytes], None]) -> None:
    """An encoding process's loop: read calls from ``connection`` until it ends, ``answer``
    each ``_ENCODE`` and ``_FINISH`` in order. A stream whose writer fails answers its error,
    and the others go on."""
    writers: dict[int, FormatWriter] = {}
    refused: dict[int, str] = {}  # streams whose writer could not be built: why
    while True:
        header = connection.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the serving process is gone, or closed the pool
        stream_id, op, length = _HEADER.unpack(header)
        payload = connection.read(length) if length else b""
        if op == _OPEN:
            try:
                writers[stream_id] = FormatWriter(**json.loads(payload))
            except Exception as exc:  # checked by the serving process first: not expected
                refused[stream_id] = f"{type(exc).__name__}: {exc}"
            continue
        if op == _DROP:
            writers.pop(stream_id, None)
            refused.pop(stream_id, None)
            continue
        try:
            writer = writers.get(stream_id)
            if writer is None:
                raise EncodingFailed(refused.pop(stream_id, f"no stream {stream_id}"))
            if op == _ENCODE:
                data = writer.encode(np.frombuffer(payload, dtype=np.float32))
            else:
                del writers[stream_id]
                data = writer.finish()
            answer(_HEADER.pack(stream_id, _OK, len(data)) + data)
        except Exception as exc:
            writers.pop(stream_id, None)
            error = f"{type(exc).__name__}: {exc}".encode()
            answer(_HEADER.pack(stream_id, _FAILED, len(error)) + error)


def main(argv: list[str]) -> None:
    """``python -m voicehost.audio.encoding FD``: an encoding process on the socket ``FD``."""
    for ending in (signal.SIGINT, signal.SIGTERM):  # the serving process's to act on
        signal.signal(ending, signal.SIG_IGN)
    connection = socket.socket(fileno=int(argv[0]))
    with connection.makefile("rb", buffering=1 << 16) as calls:
        try:
            serve_streams(calls, connection.sendall)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the serving process is gone


if __name__ == "__main__":
    main(sys.argv[1:])
