"""SNAC frames -> 24 kHz PCM: the process-wide codec, its batching scheduler and the per-stream
``FrameDecoder``.

SNAC's decoder is not causal: the audio of frame i depends on the codes of frames i-3 .. i+2.
A ``FrameDecoder`` therefore decodes each run of new frames inside a window with 3 frames of left
context and ``lookahead`` frames of right context, and keeps only the new frames' samples. With a
lookahead of 2 the stream equals a one-shot decode of the whole sequence (to float rounding).

Every stream's windows go to one ``DecodeScheduler`` per process, which decodes the windows of all
live streams that are pending together in one batched SNAC call. Chunks grow with each stream's
lead over playback: the first chunk is one frame (first audio after 1 + lookahead frames), and a
stream far ahead of its listener decodes many new frames per window, so the decoded frames per
played frame fall from 1 + 5 towards 1 + 5/K.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voicehost.model import orpheus

log = logging.getLogger(__name__)

LEFT_CONTEXT_FRAMES = 3
RIGHT_REACH_FRAMES = 2  # how far ahead the decoder sees
DEFAULT_LOOKAHEAD_FRAMES = 2
DEFAULT_BATCH_WINDOW_MS = 10.0
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_CHUNK_FRAMES = 16
CPU_CALL_FRAMES = 48
MAX_SPEED_ESTIMATE = 4.0
# Frames held for a bigger window are decoded anyway once the listener's lead falls to this
# (an engine that stalls must not leave decodable audio unplayed while the listener runs dry).
STALL_MARGIN_SECONDS = 0.25
GPU_CALL_FRAMES = 8192
# Shapes SNAC calls are padded to when ``buckets`` is on (on a GPU, each has a CUDA graph):
# windows are at most max_chunk + 5 frames, so a few lengths cover them.
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FRAME_BUCKETS = (4, 8, 12, 16, 24, 32)
# Only calls of at most this many padded frames (rows x frames) are padded to a bucket: they are
# bound by kernel launches, which a graph removes. A bigger call is bound by the GPU's arithmetic,
# so padding would cost more than it saves; it runs eagerly at its own shape (measured on an
# H200: docs/BENCHMARKS.md).
GRAPH_CALL_FRAMES = 256


def is_graph_shape(rows: int, frames: int) -> bool:
    """Whether calls of this shape are replayed from a CUDA graph (on a GPU, buckets on)."""
    return rows in ROW_BUCKETS and frames in FRAME_BUCKETS and rows * frames <= GRAPH_CALL_FRAMES


def padded_shape(rows: int, frames: int) -> tuple[int, int]:
    """The (rows, frames) a bucketed call is padded to: its buckets where padding pays (see
    ``GRAPH_CALL_FRAMES``), else its own shape."""
    padded = bucket(rows, ROW_BUCKETS), bucket(frames, FRAME_BUCKETS)
    if padded[0] and padded[1] and is_graph_shape(padded[0], padded[1]):
        return padded[0], padded[1]
    return rows, frames


def bucket(value: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding ``value`` (``None``: larger than every bucket)."""
    return next((b for b in buckets if b >= value), None)


@dataclass(frozen=True, slots=True)
class Span:
    """Frames to decode, of which the samples of frames ``[keep_start, keep_stop)`` are wanted."""

    frames: tuple[orpheus.Frame, ...]
    keep_start: int
    keep_stop: int

    @classmethod
    def whole(cls, frames: Sequence[orpheus.Frame]) -> Span:
        return cls(tuple(frames), 0, len(frames))

    def pad_side(self) -> str | None:
        """Where padding reaches no kept frame: "after", "before", or nowhere (``None``)."""
        if len(self.frames) - self.keep_stop >= RIGHT_REACH_FRAMES:
            return "after"
        if self.keep_start >= LEFT_CONTEXT_FRAMES:
            return "before"
        return None


class SnacCodec:
    """One SNAC model for the whole process; every decode runs on its single worker thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        max_call_frames: int | None = None,
        buckets: bool | None = None,
    ) -> None:
        self.model = model
        self.device = device
        # Calls padded to fixed (rows, frames) shapes; on a GPU each shape is replayed from a
        # CUDA graph captured on its first use (no launch overhead per layer). Default: GPU only.
        self.buckets = device.type == "cuda" if buckets is None else buckets
        self._graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._pool: tuple[int, int] | None = None
        # One SNAC call holds at most this many (padded) frames: a CPU gains little from large
        # batches and its activations grow with them (32 windows of 21 frames take gigabytes).
        self.max_call_frames = max_call_frames or (
            GPU_CALL_FRAMES if device.type == "cuda" else CPU_CALL_FRAMES
        )
        self.calls = 0  # SNAC decoder calls made
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snac")
        # On a GPU SNAC runs on a stream of its own, beside whatever else the process launches.
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @classmethod
    def load(
        cls,
        name: str | Path,
        *,
        device: str | None = None,
        noise: bool = True,
        threads: int | None = None,
        cuda_graphs: bool = True,
    ) -> SnacCodec:
        """Load SNAC from a directory (``config.json`` + ``pytorch_model.bin``) or a hub id.

        ``noise=False`` removes the decoder's random noise blocks, making decoding deterministic.
        On CPU, SNAC gets ``threads`` threads (default half the cores: the engine has the rest).
        On a GPU, ``cuda_graphs`` replays calls from graphs of fixed shapes.
        """
        from snac import SNAC

        model = SNAC.from_pretrained(str(name))
        if not noise:
            remove_noise(model)
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if target.type == "cpu":
            torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))
        model = model.to(target).eval()
        return cls(model, target, buckets=cuda_graphs and target.type == "cuda")

    @property
    def captured_graphs(self) -> int:
        """How many call shapes have a CUDA graph (0 off a GPU or with graphs off)."""
        return len(self._graphs)

    def encode(self, audio: np.ndarray) -> list[orpheus.Frame]:
        """Frames of 24 kHz mono float audio (padded up to whole frames)."""
        samples = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        with torch.inference_mode():
            codes = self.model.encode(samples.view(1, 1, -1).to(self.device))
        l0, l1, l2 = (layer[0].tolist() for layer in codes)
        return orpheus.codes_to_frames(l0, l1, l2)

    def decode(self, frames: Sequence[orpheus.Frame]) -> np.ndarray:
        """One-shot decode of consecutive frames: float32 samples, ``len(frames) * 2048`` long."""
        return self.decode_batch([Span.whole(frames)])[0]

    def decode_batch(self, spans: Sequence[Span]) -> list[np.ndarray]:
        """The kept samples of each span, decoded in as few SNAC calls as ``max_call_frames``
        allows.

        Spans of different lengths share a call by padding the shorter ones, on a side where
        the padding reaches no kept frame: the decoder sees 2 frames ahead and 3 behind, so
        padding after a span changes only its last 2 frames and padding before it only its
        first 3. A span that keeps frames that close to both of its ends shares a call only
        with spans of its own length.
        """
        results = [np.zeros(0, dtype=np.float32) for _ in spans]
        paddable = [i for i, span in enumerate(spans) if span.frames and span.pad_side()]
        fixed = [i for i, span in enumerate(spans) if span.frames and not span.pad_side()]
        groups: list[list[int]] = []
        for index in sorted(paddable, key=lambda i: len(spans[i].frames)):
            call = groups[-1] if groups else None  # ascending length: the last is the longest
            if call is None or (len(call) + 1) * len(spans[index].frames) > self.max_call_frames:
                groups.append(call := [])
            call.append(index)
        for length in sorted({len(spans[i].frames) for i in fixed}):
            same = [i for i in fixed if len(spans[i].frames) == length]
            size = max(1, self.max_call_frames // length)
            groups += [same[k : k + size] for k in range(0, len(same), size)]
        for call in groups:
            self._decode_call(spans, call, results)
        return results

    def _decode_call(
        self, spans: Sequence[Span], call: list[int], results: list[np.ndarray]
    ) -> None:
        longest = max(len(spans[i].frames) for i in call)
        rows_needed = len(call)
        if self.buckets and all(spans[i].pad_side() for i in call):
            rows_needed, longest = padded_shape(rows_needed, longest)
        rows, shifts = [], []
        for index in call:
            frames, short = list(spans[index].frames), longest - len(spans[index].frames)
            if short and spans[index].pad_side() == "before":
                rows.append([frames[0]] * short + frames)
                shifts.append(short)
            else:
                rows.append(frames + [frames[-1]] * short)
                shifts.append(0)
        rows += [rows[0]] * (rows_needed - len(rows))  # bucket padding: decoded, never read
        layers = [orpheus.frames_to_codes(row) for row in rows]
        codes = [
            torch.tensor([row[level] for row in layers], dtype=torch.long, device=self.device)
            for level in range(3)
        ]
        stream = torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()
        with torch.inference_mode(), stream:
            audio = self._run_decoder(codes)[: len(call), 0].float().cpu().numpy()
        self.calls += 1
        spf = orpheus.SAMPLES_PER_FRAME
        for row, (index, shift) in enumerate(zip(call, shifts, strict=True)):
            span = spans[index]
            results[index] = audio[
                row, (shift + span.keep_start) * spf : (shift + span.keep_stop) * spf
            ]

    def capture_graphs(self) -> int:
        """Capture a CUDA graph of every bucketed shape now, so that no stream waits for a
        capture (hundreds of ms) on its first call of a shape. Returns how many there are."""
        if self._stream is None or not self.buckets:
            return 0
        for rows in ROW_BUCKETS:
            for frames in FRAME_BUCKETS:
                if is_graph_shape(rows, frames) and self.buckets:
                    codes = [
                        torch.zeros((rows, frames * n), dtype=torch.long, device=self.device)
                        for n in (1, 2, 4)
                    ]
                    with torch.inference_mode(), torch.cuda.stream(self._stream):
                        self._run_decoder(codes)
        return len(self._graphs)

    def _run_decoder(self, codes: list[torch.Tensor]) -> torch.Tensor:
        """SNAC's decoder on ``codes``: replayed from the shape's CUDA graph where there is one
        (captured on first use; a capture that fails turns graphs off, decoding goes on)."""
        shape = (codes[0].shape[0], codes[0].shape[1])
        if self._stream is None or not self.buckets or not is_graph_shape(*shape):
            return self.model.decode(codes)
        graph = self._graphs.get(shape)
        if graph is None:
            try:
                # one memory pool for all shapes: a graph's output is read before the next replay
                self._pool = self._pool or torch.cuda.graph_pool_handle()
                graph = DecodeGraph(self.model, codes, self._stream, self._pool)
                self._graphs[shape] = graph
            except Exception:
                log.exception("capturing a CUDA graph of SNAC failed; decoding without graphs")
                self.buckets = False
                self._graphs.clear()
                return self.model.decode(codes)
        return graph.replay(codes)

    async def decode_batch_async(self, spans: Sequence[Span]) -> list[np.ndarray]:
        """``decode_batch`` on the codec thread, so the event loop never waits on SNAC."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.decode_batch, list(spans))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class DecodeGraph:
    """A CUDA graph of one SNAC decoder call at a fixed shape: replay copies the codes into
    its static inputs and returns (a view of) its static output, valid until the next replay."""

    def __init__(
        self,
        model: torch.nn.Module,
        codes: list[torch.Tensor],
        stream: torch.cuda.Stream,
        pool: tuple[int, int],
    ) -> None:
        self.inputs = [c.clone() for c in codes]
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (cuDNN picks its algorithms)
                model.decode(self.inputs)
        stream.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            self.output = model.decode(self.inputs)

    def replay(self, codes: list[torch.Tensor]) -> torch.Tensor:
        for static, new in zip(self.inputs, codes, strict=True):
            static.copy_(new)
        self.graph.replay()
        return self.output


def remove_noise(model: torch.nn.Module) -> None:
    """Replace SNAC's random noise blocks with identities: decoding becomes deterministic."""
    from snac.layers import NoiseBlock

    _replace_modules(model, NoiseBlock, torch.nn.Identity)


def _replace_modules(root: torch.nn.Module, kind: type, factory: type) -> None:
    for name, child in root.named_children():
        if isinstance(child, kind):
            setattr(root, name, factory())
        else:
            _replace_modules(child, kind, factory)


class DecodeScheduler:
    """One decode loop per process: batches the pending windows of every live stream.

    A batch is flushed when it holds ``max_batch`` windows, when every live stream has one
    pending (no one else can join), or ``window_ms`` after its first window arrived. Each stream
    waits for its own window before it sends the next, so its audio stays in order and a codec
    that falls behind slows the streams down (their chunks grow) instead of queueing without end.
    """

    def __init__(
        self,
        codec: SnacCodec,
        window_ms: float = DEFAULT_BATCH_WINDOW_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        record: Callable[[float, float], None] | None = None,
    ) -> None:
        self.codec = codec
        # told of each batch: the wall seconds it took, the seconds of audio it gave
        # (``voicehost.speech.capacity.DecodeCost``: admission counts what decoding costs)
        self.record = record
        self.window_s = window_ms / 1000
        self.max_batch = max_batch
        self.live = 0  # streams that may send windows
        self.batches = 0
        self.windows = 0
        self.frames_decoded = 0
        self._pending: list[tuple[Span, asyncio.Future[np.ndarray]]] = []
        # What the decode loop sleeps on; a window's arrival wakes it only when it is idle or
        # the batch is full (not once per window), a detach too (the batch may now be full).
        self._wakeup: asyncio.Future[None] | None = None
        self._until_full = False
        self._task: asyncio.Task[None] | None = None

    def attach(self) -> None:
        self.live += 1

    def detach(self) -> None:
        self.live -= 1
        self._arrived()

    def _arrived(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done() and (not self._until_full or self._full()):
            wakeup.set_result(None)

    async def _sleep(self, seconds: float | None, until_full: bool) -> None:
        """Until ``_arrived`` wakes the loop (a window came, or with ``until_full`` the batch
        is full) or ``seconds`` pass."""
        loop = asyncio.get_running_loop()
        self._wakeup, self._until_full = loop.create_future(), until_full
        timer = None if seconds is None else loop.call_later(seconds, self._timed_out)
        try:
            await self._wakeup
        finally:
            self._wakeup = None
            if timer is not None:
                timer.cancel()

    def _timed_out(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def decode(self, span: Span) -> np.ndarray:
        """The kept samples of ``span``, decoded in the next batch."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            # windows left by a loop that is gone can never be answered
            self._pending = [(s, f) for s, f in self._pending if f.get_loop() is loop]
            self._wakeup = None
            self._task = loop.create_task(self._run(), name="snac-decode-loop")
            self._task.add_done_callback(self._fail_waiting)
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._pending.append((span, future))
        self._arrived()
        return await future

    async def _run(self) -> None:
        batch: list[tuple[Span, asyncio.Future[np.ndarray]]] = []
        try:
            while True:
                batch = await self._next_batch()
                if batch:
                    await self._decode(batch)
                batch = []
        finally:  # closed, or a bug: no stream waits on this loop for ever
            self._fail([*batch, *self._pending])
            self._pending = []

    async def _next_batch(self) -> list[tuple[Span, asyncio.Future[np.ndarray]]]:
        """Wait for a window, then for the batch to fill or the window to expire."""
        while not self._pending:
            await self._sleep(None, until_full=False)
        if not self._full() and self.window_s > 0:
            await self._sleep(self.window_s, until_full=True)
        batch = self._pending[: self.max_batch]
        del self._pending[: self.max_batch]
        return [(span, future) for span, future in batch if not future.cancelled()]

    async def _decode(self, batch: list[tuple[Span, asyncio.Future[np.ndarray]]]) -> None:
        started = time.monotonic()
        try:
            results = await self.codec.decode_batch_async([span for span, _ in batch])
        except Exception as exc:  # every stream of the batch sees the codec's error
            log.exception("SNAC decode of %d windows failed", len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if self.record is not None:
            audio = sum(len(samples) for samples in results) / orpheus.SAMPLE_RATE
            self.record(time.monotonic() - started, audio)
        self.batches += 1
        self.windows += len(batch)
        self.frames_decoded += sum(len(span.frames) for span, _ in batch)
        for (_, future), audio in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(audio)

    def _fail_waiting(self, task: asyncio.Task[None]) -> None:
        """A loop task cancelled before it ever ran: fail the windows it was started for."""
        if task is self._task:
            waiting, self._pending = self._pending, []
            self._fail(waiting)

    @staticmethod
    def _fail(waiting: list[tuple[Span, asyncio.Future[np.ndarray]]]) -> None:
        for _, future in waiting:
            if not future.done() and not future.get_loop().is_closed():
                future.set_exception(RuntimeError("the SNAC decode loop stopped"))

    def _full(self) -> bool:
        return len(self._pending) >= min(self.max_batch, max(self.live, 1))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """Decode frames ``[start, stop)``; keep the samples of frames ``[emit_start, emit_stop)``."""

    start: int
    stop: int
    emit_start: int
    emit_stop: int

    def span(self, frames: Sequence[orpheus.Frame]) -> Span:
        return Span(
            tuple(frames[self.start : self.stop]),
            self.emit_start - self.start,
            self.emit_stop - self.start,
        )


class FrameDecoder:
    """Streams one request's frames into PCM: every frame played once, in order, frame 0 first.

    The first window plays frame 0 as soon as its right context has arrived. After that a window
    waits for ``chunk_frames()`` new frames: as many as the stream generates, at its speed so
    far, in its lead over playback (assumed to start with the first audio); at least 1 and at
    most ``max_chunk``. The lead shrinks while frames accumulate and the target is recomputed at
    every frame, so the window is cut when the frames waited for match the remaining lead: after
    n = s * L / 2 frames at speed s, with half the lead L still queued for the listener.
    """

    def __init__(
        self,
        scheduler: DecodeScheduler,
        lookahead: int = DEFAULT_LOOKAHEAD_FRAMES,
        max_chunk: int = DEFAULT_MAX_CHUNK_FRAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lookahead not in (0, 1, 2):
            raise ValueError("lookahead must be 0, 1 or 2 frames")
        if max_chunk < 1:
            raise ValueError("max_chunk must be at least 1 frame")
        self.scheduler = scheduler
        self.lookahead = lookahead
        self.max_chunk = max_chunk
        self.clock = clock
        self.frames: list[orpheus.Frame] = []
        self.emitted = 0
        self.decoded = 0  # frames decoded, context included
        self.first_audio_at: float | None = None
        self._frames_at_first_audio = 0
        self._attached = True
        scheduler.attach()

    def lead_seconds(self) -> float:
        """Audio handed out so far minus the time it has been playing."""
        if self.first_audio_at is None:
            return 0.0
        played = self.clock() - self.first_audio_at
        return self.emitted * orpheus.FRAME_SECONDS - played

    def generation_speed(self) -> float:
        """Seconds of audio generated per second since the first audio (1 until measurable,
        at most ``MAX_SPEED_ESTIMATE``)."""
        if self.first_audio_at is None:
            return 1.0
        elapsed = self.clock() - self.first_audio_at
        generated = (len(self.frames) - self._frames_at_first_audio) * orpheus.FRAME_SECONDS
        if elapsed <= 0 or generated <= 0:
            return 1.0
        return min(MAX_SPEED_ESTIMATE, generated / elapsed)

    def chunk_frames(self) -> int:
        """New frames the next window waits for: as many as the stream generates in its lead."""
        if self.emitted == 0:
            return 1
        frames = self.lead_seconds() * self.generation_speed() / orpheus.FRAME_SECONDS
        return max(1, min(self.max_chunk, int(frames)))

    def _ready(self, final: bool) -> int:
        """Frames whose right context has arrived (every frame, when final)."""
        return len(self.frames) if final else len(self.frames) - self.lookahead

    def due_in(self) -> float | None:
        """Seconds until the decodable frames held for a bigger window must be played anyway
        (``None`` while none is held): the listener's lead less ``STALL_MARGIN_SECONDS``."""
        if self.first_audio_at is None or self._ready(final=False) <= self.emitted:
            return None
        return max(0.0, self.lead_seconds() - STALL_MARGIN_SECONDS)

    def next_window(self, final: bool, force: bool = False) -> DecodeWindow | None:
        """The window that plays the next frames whose right context has arrived (all, when
        final), at most ``max_chunk`` of them; ``None`` while fewer than ``chunk_frames()`` are
        ready (``force``: any ready frame will do)."""
        ready = self._ready(final)
        if ready <= self.emitted:
            return None
        if not (final or force) and ready - self.emitted < self.chunk_frames():
            return None
        emit_stop = min(ready, self.emitted + self.max_chunk)
        start = max(0, self.emitted - LEFT_CONTEXT_FRAMES)
        stop = min(len(self.frames), emit_stop + self.lookahead)
        return DecodeWindow(start, stop, self.emitted, emit_stop)

    async def push(self, frames: Sequence[orpheus.Frame]) -> np.ndarray:
        """Add frames; returns the samples now ready (possibly none)."""
        self.frames.extend(frames)
        return await self._emit(final=False)

    async def flush(self) -> np.ndarray:
        """The samples of every frame whose right context has arrived, whatever the chunk
        target (the engine has stalled and ``due_in()`` has run out)."""
        return await self._emit(final=False, force=True)

    async def finish(self) -> np.ndarray:
        """The samples of every frame not yet played, decoded with the context that exists."""
        return await self._emit(final=True)

    def close(self) -> None:
        """The stream has ended: the scheduler stops waiting for it."""
        if self._attached:
            self._attached = False
            self.scheduler.detach()

    async def _emit(self, final: bool, force: bool = False) -> np.ndarray:
        """Decode window after window (each of at most ``max_chunk`` new frames) while one is
        due; a burst of frames (a client that read slowly) never becomes one huge decode."""
        pieces = []
        while (window := self.next_window(final, force)) is not None:
            pieces.append(await self.scheduler.decode(window.span(self.frames)))
            self.emitted = window.emit_stop
            self.decoded += window.stop - window.start
            if self.first_audio_at is None:
                self.first_audio_at = self.clock()
                self._frames_at_first_audio = len(self.frames)
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
