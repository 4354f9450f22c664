"""EncodingPool: streams encoded on threads, or in encoding processes, keep their chunks in
order, and one stream's slow encoding holds up only that stream; an encoding process that dies
fails its own streams only and is replaced. Real encoding (PyAV, soxr), real threads, real
processes over a real socket."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import signal
import time
from collections.abc import AsyncIterator

import av
import numpy as np
import pytest

from voicehost.audio.encoding import EncodingFailed, EncodingPool, FormatStream
from voicehost.audio.formats import FormatWriter
from voicehost.model.orpheus import SAMPLE_RATE

pytestmark = pytest.mark.unit

# (format, sample rate): every codec, and pcm resampled (which also runs on the pool)
STREAMS = [("mp3", None), ("opus", None), ("aac", 16000), ("flac", None), ("mulaw", None)]
STREAMS += [("pcm", 16000), ("mp3", 48000), ("opus", 16000)]


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """A tone gliding under noise, loud enough that every codec has work to do."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t * (1 + 0.2 * t))
    return (tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def chunked(samples: np.ndarray, seed: int) -> list[np.ndarray]:
    """Chunks of 1 to 8 frames of 2048 samples, as the synthesizer makes them."""
    rng = np.random.default_rng(seed)
    cuts = np.cumsum(rng.integers(1, 9, size=samples.size // 2048) * 2048)
    return np.split(samples, cuts[cuts < samples.size])


def sequential(fmt: str, rate: int | None, chunks: list[np.ndarray]) -> bytes:
    writer = FormatWriter(fmt, rate)
    return b"".join(writer.encode(chunk) for chunk in chunks) + writer.finish()


def packets(fmt: str, data: bytes) -> list[bytes] | bytes:
    """What must match between two encodings: the bytes, but for Ogg its packets (each Ogg
    stream has a random serial number, in every page header and checksum)."""
    if fmt != "opus":
        return data
    with av.open(io.BytesIO(data), "r") as container:
        return [bytes(packet) for packet in container.demux() if packet.size]


async def encode_all(stream: FormatStream, chunks: list[np.ndarray], sent: list[int]) -> bytes:
    out = []
    for chunk in chunks:
        sent.append(chunk.size)
        out.append(await stream.encode(chunk))
    out.append(await stream.finish())
    return b"".join(out)


def on_the_loop(stream: FormatStream) -> bool:
    return type(stream) is FormatStream  # the base class encodes on the loop; the rest hop


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
def test_chunks_of_each_stream_leave_in_order_under_concurrent_encoding(processes: int) -> None:
    """Eight streams of 1.5 s each, every codec, encoded at once by 4 threads (or 2 encoding
    processes): each stream's bytes are exactly what one FormatWriter fed its chunks in order writes
    (a chunk encoded out of turn, or by two threads at once, would change them)."""
    chunks = [chunked(speechlike(1.5, seed), seed) for seed in range(len(STREAMS))]
    pool = EncodingPool(4, processes)

    async def run() -> list[bytes]:
        streams = [pool.stream(fmt, rate) for fmt, rate in STREAMS]
        assert not any(on_the_loop(stream) for stream in streams)  # all on the pool
        if processes:  # shared out: each process has half of the streams
            assert sorted(p.streams for p in pool._processes) == [4, 4]
        return await asyncio.gather(
            *(encode_all(e, c, []) for e, c in zip(streams, chunks, strict=True))
        )

    try:
        encoded = asyncio.run(run())
    finally:
        pool.close()
    for (fmt, rate), stream_chunks, data in zip(STREAMS, chunks, encoded, strict=True):
        expected = sequential(fmt, rate, stream_chunks)
        assert packets(fmt, data) == packets(fmt, expected), (fmt, rate)


def test_a_slow_stream_slows_only_itself() -> None:
    """Stream A's writer is held (its lock taken, as a call left running by a cancelled caller
    holds it): A waits with one chunk in the pool and takes no more, while stream B on the
    same 2-thread pool encodes all of its chunks; released, A finishes with its bytes intact."""
    a_chunks = chunked(speechlike(2.0, 1), 1)
    b_chunks = chunked(speechlike(2.0, 2), 2)
    pool = EncodingPool(2)

    async def run() -> tuple[list[int], bytes, bytes]:
        a, b = pool.stream("mp3"), pool.stream("opus")
        a_sent: list[int] = []
        a._lock.acquire()
        try:
            a_task = asyncio.create_task(encode_all(a, a_chunks, a_sent))
            b_data = await encode_all(b, b_chunks, [])
            assert not a_task.done()
            held_sent = list(a_sent)
        finally:
            a._lock.release()
        return held_sent, await a_task, b_data

    try:
        held_sent, a_data, b_data = asyncio.run(run())
    finally:
        pool.close()
    assert held_sent == [a_chunks[0].size]  # backpressure: one chunk in the pool, no queue
    assert packets("opus", b_data) == packets("opus", sequential("opus", None, b_chunks))
    assert a_data == sequential("mp3", None, a_chunks)


def test_encoding_runs_off_the_event_loop_and_pcm_stays_on_it() -> None:
    """While a 6 s mp3 chunk encodes, the loop runs and sees the stream's lock held by the
    pool's thread; pcm at the model's rate is converted on the loop, with no thread."""
    pool = EncodingPool(1)

    async def run() -> tuple[bool, int]:
        mp3 = pool.stream("mp3")
        task = asyncio.create_task(mp3.encode(speechlike(6.0, 3)))
        seen_held = False
        while not task.done():
            seen_held = seen_held or mp3._lock.locked()
            await asyncio.sleep(0.001)
        pcm = pool.stream("pcm")
        assert on_the_loop(pcm)
        return seen_held, len(await pcm.encode(np.zeros(2048, np.float32)))

    try:
        seen_held, pcm_bytes = asyncio.run(run())
    finally:
        pool.close()
    assert seen_held
    assert pcm_bytes == 2 * 2048


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_encoding_process_that_dies_fails_its_streams_and_is_replaced() -> None:
    """kill -9 of one of two encoding processes mid-stream: its stream's next call raises
    ``EncodingFailed`` (the response ends as a failed stream does), the other process's stream
    ends whole, and the next stream goes to a new process and ends whole."""
    chunks = chunked(speechlike(2.0, 4), 4)
    pool = EncodingPool(1, processes=2)

    async def run() -> tuple[BaseException, bytes, bytes, list[int]]:
        doomed, spared = pool.stream("mp3"), pool.stream("mp3")
        assert doomed._process is not spared._process
        await doomed.encode(chunks[0])
        spared_task = asyncio.create_task(encode_all(spared, chunks, []))
        os.kill(doomed._process.process.pid, signal.SIGKILL)
        with pytest.raises(EncodingFailed) as failed:
            for chunk in chunks[1:]:
                await doomed.encode(chunk)
            await doomed.finish()
        later = pool.stream("mp3")
        return failed.value, await spared_task, await encode_all(later, chunks, []), pool.pids

    try:
        failure, spared_data, later_data, pids = asyncio.run(run())
    finally:
        pool.close()
    assert "encoding process ended" in str(failure)
    assert spared_data == later_data == sequential("mp3", None, chunks)
    assert len(pids) == 2 and all(not alive(pid) for pid in pids)  # closed: both ended


def exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited and can be waited for (left so: ``WNOWAIT``). A
    zombie's ``Z`` in /proc comes first while its other threads still end, and its parent's
    wait does not see it until they have."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_a_stream_never_goes_to_an_encoding_process_that_has_ended_unnoticed() -> None:
    """An encoding process killed while no call waited on it, the next stream asked for before
    its loop has read the end of its socket: the stream goes to a new process and ends whole.
    It was given the dead one, whose first call failed before the response's first byte (a 500
    for an mp3 request: test_frontends' encoding test, once)."""
    chunks = chunked(speechlike(1.0, 5), 5)
    pool = EncodingPool(1, processes=1)
    (dead,) = pool.pids

    async def run() -> tuple[bytes, list[int]]:
        first = pool.stream("mp3")
        await encode_all(first, chunks, [])  # used: its answers' reader runs, then idles
        os.kill(dead, signal.SIGKILL)
        while not exited(dead):  # and the loop not run meanwhile: its reader has seen nothing
            time.sleep(0.01)  # noqa: ASYNC251 (blocking on purpose: the loop must not run)
        return await encode_all(pool.stream("mp3"), chunks, []), pool.pids

    try:
        data, pids = asyncio.run(run())
    finally:
        pool.close()
    assert data == sequential("mp3", None, chunks)
    assert dead not in pids


def test_a_response_whose_encoding_process_dies_before_its_first_chunk_ends_broken(
    tmp_path,
) -> None:
    """A response's stream was given a live encoding process, which died before the first
    chunk (no pool can foresee it): ``send_encoded`` hands the failure back, for the response
    to end as a broken stream, rather than raising it past a response that has begun (a 500
    after its headers, and a client left waiting for the rest)."""
    from voicehost.api.server import Outgoing, send_encoded
    from voicehost.tenancy.usage import FileUsageStore, UsageLedger

    pool = EncodingPool(1, processes=1)
    (dead,) = pool.pids
    ledger = UsageLedger(FileUsageStore(tmp_path / "usage.jsonl"), None)

    async def rest() -> AsyncIterator[np.ndarray]:
        yield speechlike(0.5, 6)

    async def run() -> tuple[int | Exception, list[bytes]]:
        stream = pool.stream("mp3")
        os.kill(dead, signal.SIGKILL)
        while not exited(dead):
            time.sleep(0.01)  # noqa: ASYNC251 (blocking on purpose: the loop must not run)
        written: list[bytes] = []

        async def write(data: bytes) -> None:
            written.append(data)

        out = Outgoing(stream, speechlike(0.5, 7), rest(), ledger.tally(None, "tara"), {})
        return await send_encoded(out, write), written

    try:
        sent, written = asyncio.run(run())
    finally:
        pool.close()
    assert isinstance(sent, EncodingFailed) and written == [], (sent, written)


def test_an_abandoned_stream_is_forgotten_and_the_processes_ignore_the_groups_signals() -> None:
    """A stream dropped mid-way (its client left) is freed in its encoding process, which goes
    on with the next; SIGTERM and SIGINT (a service manager's, a terminal's, to the whole
    group) leave the process to its serving process, and closing the pool ends it."""
    chunks = chunked(speechlike(1.0, 5), 5)
    pool = EncodingPool(1, processes=1)
    (process,) = pool._processes

    async def run() -> bytes:
        abandoned = pool.stream("opus")
        await abandoned.encode(chunks[0])
        assert process.streams == 1
        del abandoned
        gc.collect()
        await asyncio.sleep(0.1)  # the drop is sent from the loop
        assert process.streams == 0 and not process._waiting
        os.kill(process.process.pid, signal.SIGTERM)
        os.kill(process.process.pid, signal.SIGINT)
        await asyncio.sleep(0.3)
        return await encode_all(pool.stream("opus"), chunks, [])

    try:
        data = asyncio.run(run())
        assert alive(process.process.pid)
    finally:
        pool.close()
    assert packets("opus", data) == packets("opus", sequential("opus", None, chunks))
    deadline = time.monotonic() + 5
    while alive(process.process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(process.process.pid)
