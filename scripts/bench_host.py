"""Host capacity per format: what one serving process's CPU carries once the GPU is not the limit.

The real serving path of ``voicehost serve`` (``create_app``: middlewares, admission, the speech
handler, ``SpeechEngine.audio_tokens``, the ``Synthesizer``, ``FrameAssembler``, the
``DecodeScheduler`` and ``FrameDecoder``, the resampler and PyAV of ``voicehost.audio.formats``,
HTTP writes to a real client on this machine) with two stand-ins, both in this script only:

- the LLM: a token source (one "engine step" task, like vLLM's output handler) that gives each
  stream one valid audio token per step, ``--rate`` steps a second (90 by default, about a GPU
  step's pace), through ``SpeechEngine`` with the dev model's real tokenizer;
- SNAC: an instant decoder returning speech (espeak-ng, cut to the call's shape) for every call
  of the real ``SnacCodec`` (its batching, padding and code tensors run; only the network does
  not), as on a GPU where SNAC runs on the device.

Each server runs in a process of its own, pinned to ``--cores`` CPUs (``taskset``), its encoding
threads as many; the client (this process) reads every stream, timestamps each chunk, counts the
audio in it per format, and plays it against a clock (``voicehost.tools.bench.playback``). Per
format and stream count: the server's CPU per audio second (and so real-time streams per core),
underruns, the event loop's lag p99 (a 5 ms ticker in the server), and, with ``--profile``, the loop
thread's top entries (cProfile). ``--saturate``: streams at 10x real time, the audio seconds one
process delivers per second on 1 and on 2 cores (the scaling goal). ``--probe``: time to first byte
of a pcm request while N mp3 streams run. ``--baseline REV``: every figure also for the code of git
revision REV (a worktree of it), side by side in the same run. ``--vllm``: what vLLM's own output
handling costs per token in the serving process, with the dev model on the CPU engine at the
highest token rate it reaches (greedy, a batch of streams).

    python scripts/bench_host.py --baseline 2c7382d --json docs/host_bench.json

The last line of output is one JSON object of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "The quick brown fox jumps over the lazy dog while the sun slowly sets. "
SPEECH_TEXT = (
    "Production speech services send every stream through one process, and its CPU must keep "
    "up with the accelerator. This sentence is only here to give the encoding real speech."
)


# --- the server side: the real app, the LLM and SNAC replaced --------------------------------


class PassThroughRenderer:
    """vLLM's renderer's stand-in (``SpeechEngine.audio_tokens`` renders each prompt through
    ``llm.renderer``): the prompt as it came."""

    default_cmpl_tok_params = None

    def render_cmpl(self, prompts: list[Any], params: Any) -> list[Any]:
        return list(prompts)


class TokenSource:
    """The engine's stand-in: every ``1 / steps`` seconds, each live request gets ``per_step``
    audio tokens (a delta), as vLLM's output handler puts each step's outputs into every
    request's collector; a consumer that lags gets the deltas merged, as vLLM merges them."""

    def __init__(self, steps_per_second: float, per_step: int, frames: int) -> None:
        self.renderer = PassThroughRenderer()
        self.interval = 1.0 / steps_per_second
        self.per_step = per_step
        self.frames = frames
        self.live: dict[int, Collector] = {}
        self.tokens = 0
        self._task: asyncio.Task[None] | None = None
        self._ids = 0

    def generate(self, prompt: Any, params: Any, request_id: str, lora_request: Any = None):
        from voicehost.model import orpheus

        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        rng = np.random.default_rng(self._ids)
        codes = rng.integers(0, orpheus.CODEBOOK_SIZE, size=(self.frames, 7))
        positions = np.arange(7) * orpheus.CODEBOOK_SIZE + orpheus.AUDIO_TOKEN_BASE
        tokens = [*(codes + positions).reshape(-1).tolist(), orpheus.END_OF_SPEECH]
        tokens = tokens[: params.max_tokens]
        self._ids += 1
        collector = Collector(tokens)
        self.live[self._ids] = collector
        return self._outputs(self._ids, collector)

    async def _outputs(self, key: int, collector: Collector) -> AsyncIterator[Any]:
        try:
            while True:
                delta = await collector.get()
                outputs = [SimpleNamespace(token_ids=delta)]
                yield SimpleNamespace(outputs=outputs, finished=collector.done)
                if collector.done:
                    return
        finally:
            self.live.pop(key, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_step = loop.time()
        while True:
            for collector in list(self.live.values()):
                self.tokens += collector.step(self.per_step)
            next_step += self.interval
            await asyncio.sleep(max(0.0, next_step - loop.time()))

    # what SpeechEngine and the serving ask of an AsyncLLM
    errored = False

    def get_num_unfinished_requests(self) -> int:
        return len(self.live)

    def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Collector:
    """One request's output queue (vLLM's ``RequestOutputCollector``): deltas merge while the
    consumer has not taken them."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.sent = 0
        self.pending: list[int] = []
        self.done = False
        self.waiter: asyncio.Future[None] | None = None

    def step(self, count: int) -> int:
        if self.sent >= len(self.tokens):
            return 0
        new = self.tokens[self.sent : self.sent + count]
        self.sent += len(new)
        self.pending += new
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        return len(new)

    async def get(self) -> list[int]:
        if not self.pending:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        delta, self.pending = self.pending, []
        self.done = self.sent >= len(self.tokens)
        return delta


def speech_bank(rows: int, frames: int) -> np.ndarray:
    """``rows`` x 1 x ``frames`` * 2048 samples of espeak-ng speech at 24 kHz (each row from
    another offset), or a gliding tone under noise where espeak-ng is missing."""
    import soxr

    from voicehost.model import orpheus

    length = frames * orpheus.SAMPLES_PER_FRAME
    audio = None
    if shutil.which("espeak-ng"):
        with tempfile.NamedTemporaryFile(suffix=".wav") as out:
            subprocess.run(["espeak-ng", "-w", out.name, SPEECH_TEXT], check=True)
            import wave

            with wave.open(out.name) as wav:
                rate = wav.getframerate()
                pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
            audio = soxr.resample(pcm.astype(np.float32) / 32768, rate, orpheus.SAMPLE_RATE)
    if audio is None or audio.size < length:
        t = np.arange(length * 2) / orpheus.SAMPLE_RATE
        rng = np.random.default_rng(0)
        audio = 0.3 * np.sin(
            2 * np.pi * 180 * t * (1 + 0.1 * np.sin(t))
        ) + 0.03 * rng.standard_normal(t.size)
    audio = np.tile(audio, 2 + length // audio.size).astype(np.float32)
    step = max(1, (audio.size - length) // rows)
    bank = np.stack([audio[r * step : r * step + length] for r in range(rows)])
    return bank[:, np.newaxis, :]


def instant_codec(max_rows: int = 256, max_frames: int = 48):
    """The real ``SnacCodec`` whose network answers at once with speech of the call's shape."""
    import torch

    from voicehost.model import orpheus
    from voicehost.model.codec import GPU_CALL_FRAMES, SnacCodec

    bank = torch.from_numpy(speech_bank(max_rows, max_frames))

    class InstantSnac(SnacCodec):
        def _run_decoder(self, codes: list[torch.Tensor]) -> torch.Tensor:
            rows, frames = codes[0].shape
            if rows > bank.shape[0] or frames > max_frames:  # never at the default settings
                return torch.zeros((rows, 1, frames * orpheus.SAMPLES_PER_FRAME))
            return bank[:rows, :, : frames * orpheus.SAMPLES_PER_FRAME]

    return InstantSnac(torch.nn.Identity(), torch.device("cpu"), GPU_CALL_FRAMES, buckets=False)


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux ``/proc``)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LoopLag:
    """How late a 5 ms ticker on the event loop wakes up."""

    TICK = 0.005

    def __init__(self) -> None:
        self.lags: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.TICK)
            self.lags.append(loop.time() - start - self.TICK)

    def take(self) -> list[float]:
        lags, self.lags = self.lags, []
        return lags


def serve(port: int, rate: float, per_step: int, frames: int) -> None:
    """The bench's server: ``create_app`` with the stand-ins, plus ``/bench/*`` routes."""
    from aiohttp import web
    from transformers import AutoTokenizer

    from voicehost.api.server import SERVING, create_app
    from voicehost.config import Settings
    from voicehost.model.codec import DecodeScheduler
    from voicehost.model.devmodel import DevModelPaths, ensure_dev_model
    from voicehost.model.engine import SpeechEngine
    from voicehost.speech.synthesis import Synthesizer

    work = Path(tempfile.mkdtemp(prefix="bench-host-"))
    paths = DevModelPaths(Settings().dev_dir)
    ensure_dev_model(Settings().dev_dir)
    settings = Settings(
        model=str(paths.model),
        port=port,
        adapters_dir=work / "adapters",
        jobs_dir=work / "jobs",
        worker_capacity=4096,
        max_num_seqs=4096,
        # the token source's 90 tokens/s per stream is real time here; measured-capacity
        # admission (1.2 x 82) would refuse all but one stream of it
        realtime_tokens_per_second=0,
    )
    app = create_app(settings)
    serving = app[SERVING]
    source = TokenSource(rate, per_step, frames)
    lag = LoopLag()
    profile: dict[str, cProfile.Profile] = {}

    async def load() -> None:
        s = serving.settings
        tokenizer = AutoTokenizer.from_pretrained(str(paths.model))
        serving.engine = SpeechEngine(source, tokenizer, s)  # type: ignore[arg-type]
        serving.codec = instant_codec()
        serving.scheduler = DecodeScheduler(
            serving.codec, s.codec_batch_window_ms, s.codec_max_batch
        )
        synthesizer = Synthesizer(
            serving.engine,
            serving.scheduler,
            serving.metrics,
            s.lookahead_frames,
            s.codec_max_chunk_frames,
        )
        await synthesizer.warm_up(next(iter(serving.voices.builtin.values())))
        serving.synthesizer = synthesizer
        asyncio.get_running_loop().create_task(lag.run())

    serving._load = load  # type: ignore[method-assign]

    async def stats(request: web.Request) -> web.Response:
        times = os.times()
        lags = lag.take()
        return web.json_response(
            {
                "cpu_s": times.user + times.system,
                "loop_cpu_s": thread_cpu_s(threading.get_native_id()),
                "lag_p99_ms": float(np.percentile(lags, 99) * 1000) if lags else None,
                "lag_max_ms": float(max(lags) * 1000) if lags else None,
                "tokens": source.tokens,
                "encode_threads": getattr(getattr(serving, "encoding_pool", None), "threads", 0),
            }
        )

    async def idle(request: web.Request) -> web.Response:
        """The server's CPU per second with nothing to do (its timers, the lag ticker)."""
        start, wall = os.times(), time.perf_counter()
        await asyncio.sleep(float(request.query.get("seconds", "2")))
        end, wall = os.times(), time.perf_counter() - wall
        return web.json_response(
            {"cpu_per_s": (end.user + end.system - start.user - start.system) / wall}
        )

    async def source_only(request: web.Request) -> web.Response:
        """The token source's own cost: N streams of ``SpeechEngine.audio_tokens``, read and
        dropped (no frames, no decoding, no HTTP)."""
        from voicehost.model import orpheus

        streams = int(request.query["streams"])
        engine = serving.engine
        voice = next(iter(serving.voices.builtin.values()))
        text = text_for(frames * orpheus.FRAME_SECONDS)

        async def one() -> int:
            prompt = engine.prompt(text, voice)
            count = 0
            async for delta in engine.audio_tokens(
                prompt, voice, engine.sampling(text, None, len(prompt))
            ):
                count += len(delta)
            return count

        start, wall = os.times(), time.perf_counter()
        tokens = sum(await asyncio.gather(*(one() for _ in range(streams))))
        end, wall = os.times(), time.perf_counter() - wall
        return web.json_response(
            {
                "cpu_s": end.user + end.system - start.user - start.system,
                "wall_s": wall,
                "audio_s": tokens / orpheus.AUDIO_TOKENS_PER_SECOND,
            }
        )

    async def profile_start(request: web.Request) -> web.Response:
        profile["p"] = cProfile.Profile()
        profile["p"].enable()
        return web.json_response({})

    async def profile_stop(request: web.Request) -> web.Response:
        profile["p"].disable()
        out = io.StringIO()
        pstats.Stats(profile["p"], stream=out).sort_stats("tottime").print_stats(18)
        return web.json_response({"profile": out.getvalue()})

    app.router.add_get("/bench/stats", stats)
    app.router.add_get("/bench/idle", idle)
    app.router.add_get("/bench/source", source_only)
    app.router.add_post("/bench/profile/start", profile_start)
    app.router.add_post("/bench/profile/stop", profile_stop)
    from voicehost.api.server import serve as run_server

    run_server(settings, app)


# --- the client side --------------------------------------------------------------------------


class AudioCounter:
    """Samples (at the output rate) each chunk of a stream completes, for each format."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.fmt = fmt
        self.rate = rate
        self.buffer = b""
        self.skip = 44 if fmt == "wav" else 0
        self.granule = 0
        self.parser = None
        if fmt in ("mp3", "aac"):
            import av

            self.parser = av.CodecContext.create(fmt, "r")
            self.per_packet = 1024 if fmt == "aac" else (1152 if rate >= 32000 else 576)

    def count(self, data: bytes) -> int:
        if self.fmt in ("pcm", "wav"):
            cut = min(self.skip, len(data))  # the wav header
            self.skip -= cut
            data = self.buffer + data[cut:]
            whole = len(data) // 2 * 2
            self.buffer = data[whole:]
            return whole // 2
        if self.parser is not None:
            return len(self.parser.parse(data)) * self.per_packet
        if self.fmt == "opus":  # Ogg pages: the last granule position says the samples so far
            self.buffer += data
            samples = 0
            while len(self.buffer) >= 27 and self.buffer[:4] == b"OggS":
                segments = self.buffer[26]
                if len(self.buffer) < 27 + segments:
                    break
                size = 27 + segments + sum(self.buffer[27 : 27 + segments])
                if len(self.buffer) < size:
                    break
                (granule,) = struct.unpack_from("<q", self.buffer, 6)
                if granule > self.granule:
                    samples += granule - self.granule
                    self.granule = granule
                self.buffer = self.buffer[size:]
            return samples
        return len(data)


@dataclass
class StreamTrace:
    sent: float
    ttfb_s: float | None = None
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    error: str | None = None


def text_for(seconds: float) -> str:
    """About ``seconds`` of speech at 14 characters a second, in whole words."""
    text = (SENTENCE * (1 + int(seconds * 14) // len(SENTENCE)))[: int(seconds * 14)]
    return text.rsplit(" ", 1)[0] + "."


async def one_stream(
    session: Any, url: str, fmt: str, rate: int, seconds: float = 6.0
) -> StreamTrace:
    trace = StreamTrace(time.perf_counter())
    counter = AudioCounter(fmt, rate)
    body = {"input": text_for(seconds), "voice": "tara", "response_format": fmt}
    try:
        async with session.post(f"{url}/v1/audio/speech", json=body) as response:
            if response.status != 200:
                trace.error = f"{response.status} {await response.text()}"
                return trace
            async for data in response.content.iter_any():
                now = time.perf_counter()
                if trace.ttfb_s is None:
                    trace.ttfb_s = now - trace.sent
                trace.arrivals.append((now, counter.count(data)))
    except Exception as exc:  # the figure says it failed
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


def output_rate(fmt: str) -> int:
    return 48000 if fmt == "opus" else 24000


@dataclass
class Level:
    """One measurement: ``streams`` streams of ``fmt`` started at once on one server."""

    version: str  # "after" (this checkout) or "before" (--baseline)
    cores: int
    fmt: str
    streams: int
    mode: str  # "realtime", "saturate" (10x real time per stream), "probe", "profile"
    audio_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    cpu_ms_per_audio_s: float = 0.0  # the server's CPU (all its threads) per audio second
    loop_ms_per_audio_s: float = 0.0  # of which the event loop's thread (the serial part)
    # Amdahl: streams on 2 cores / on 1, if everything off the loop thread spreads over cores
    scaling_1_to_2: float = 0.0
    rt_streams_per_core: float = 0.0  # 1000 / cpu_ms_per_audio_s
    delivered_rt_streams: float = 0.0  # audio seconds delivered per wall second
    underrun_streams: int = 0
    underruns: int = 0
    stall_s: float = 0.0
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    ttfb_p50_ms: float | None = None
    probe_idle_ttfb_ms: list[float] = field(default_factory=list)
    probe_ttfb_ms: list[float] = field(default_factory=list)
    errors: int = 0


async def get_json(session: Any, url: str, method: str = "GET") -> dict[str, Any]:
    async with session.request(method, url) as response:
        return await response.json()


async def probe_ttfb(session: Any, url: str, count: int) -> list[float]:
    """Time to first byte of ``count`` short pcm requests, one after another."""
    times = []
    for _ in range(count):
        probe = await one_stream(session, url, "pcm", 24000, seconds=1.0)
        if probe.ttfb_s is not None:
            times.append(round(probe.ttfb_s * 1000, 1))
        await asyncio.sleep(0.2)
    return times


async def run_level(
    url: str, level: Level, seconds: float, jitter_s: float, idle_cpu_per_s: float, probes: int = 0
) -> Level:
    import aiohttp

    from voicehost.tools.bench.playback import simulate_playback

    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if probes:
            level.probe_idle_ttfb_ms = await probe_ttfb(session, url, probes)
        before = await get_json(session, f"{url}/bench/stats")
        started = time.perf_counter()
        rate = output_rate(level.fmt)
        tasks = [
            asyncio.create_task(one_stream(session, url, level.fmt, rate, seconds))
            for _ in range(level.streams)
        ]
        if probes:
            await asyncio.sleep(1.0)  # the streams are under way
            level.probe_ttfb_ms = await probe_ttfb(session, url, probes)
        traces = await asyncio.gather(*tasks)
        level.wall_s = round(time.perf_counter() - started, 3)
        after = await get_json(session, f"{url}/bench/stats")
    ttfbs = []
    for trace in traces:
        if trace.error:
            level.errors += 1
            print(f"  stream failed: {trace.error}", file=sys.stderr)
            continue
        samples = sum(n for _, n in trace.arrivals)
        level.audio_s += samples / rate
        playback = simulate_playback(trace.arrivals, rate, jitter_s)
        level.underruns += playback.underruns
        level.stall_s += playback.stall_s
        level.underrun_streams += playback.underruns > 0
        if trace.ttfb_s is not None:
            ttfbs.append(trace.ttfb_s)
    level.cpu_s = round(after["cpu_s"] - before["cpu_s"], 3)
    if level.audio_s:
        # Raw: the server's idle CPU (its lag ticker and token source, ``servers`` in the
        # report) is spread over the audio of busy levels, not subtracted.
        net = max(1e-9, level.cpu_s)
        loop_net = max(1e-9, after["loop_cpu_s"] - before["loop_cpu_s"])
        level.cpu_ms_per_audio_s = round(net / level.audio_s * 1000, 3)
        level.loop_ms_per_audio_s = round(loop_net / level.audio_s * 1000, 3)
        level.scaling_1_to_2 = round(min(2.0, net / loop_net), 2)
        level.rt_streams_per_core = round(level.audio_s / net, 1)
        level.delivered_rt_streams = round(level.audio_s / level.wall_s, 1)
    level.audio_s = round(level.audio_s, 2)
    level.lag_p99_ms = after["lag_p99_ms"] and round(after["lag_p99_ms"], 2)
    level.lag_max_ms = after["lag_max_ms"] and round(after["lag_max_ms"], 2)
    level.ttfb_p50_ms = round(float(np.median(ttfbs)) * 1000, 1) if ttfbs else None
    level.stall_s = round(level.stall_s, 3)
    return level


async def server_figures(url: str, streams: int) -> dict[str, float]:
    """The server's idle CPU per second, and its token source's own CPU per audio second."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        idle = await get_json(session, f"{url}/bench/idle?seconds=3")
        source = await get_json(session, f"{url}/bench/source?streams={streams}")
    net = source["cpu_s"]
    return {
        "idle_cpu_per_s": round(idle["cpu_per_s"], 4),
        "source_cpu_ms_per_audio_s": round(net / source["audio_s"] * 1000, 3),
    }


async def profiled(url: str, level: Level, seconds: float, jitter_s: float) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await get_json(session, f"{url}/bench/profile/start", "POST")
    await run_level(url, level, seconds, jitter_s, 0.0)
    async with aiohttp.ClientSession() as session:
        return (await get_json(session, f"{url}/bench/profile/stop", "POST"))["profile"]


@contextlib.contextmanager
def bench_server(
    tree: Path, cores: list[int], rate: float, per_step: int, frames: int
) -> Iterator[str]:
    """A bench server running the code of ``tree`` on ``cores``; yields its URL."""
    from voicehost.tools.devserver import free_port, http_status

    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "VOICEHOST_ENCODE_THREADS": str(len(cores)),
        "OMP_NUM_THREADS": "1",
    }
    log = tempfile.NamedTemporaryFile(prefix="bench-host-", suffix=".log", delete=False)
    command = ["taskset", "-c", ",".join(map(str, cores)), sys.executable, __file__]
    command += ["--serve", str(port), "--rate", str(rate), "--per-step", str(per_step)]
    command += ["--frames", str(frames)]
    process = subprocess.Popen(command, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while http_status(f"{url}/readyz") != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench server failed: {Path(log.name).read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def code_tree(revision: str | None) -> Iterator[Path]:
    """This checkout, or a temporary git worktree of ``revision``."""
    if revision is None:
        yield ROOT
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-host-baseline-"))
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run(
        [*git, "add", "--detach", str(folder), revision], check=True, capture_output=True
    )
    try:
        yield folder
    finally:
        subprocess.run([*git, "remove", "--force", str(folder)], check=False, capture_output=True)


@contextlib.contextmanager
def client_cores(server_cores: list[int], available: list[int]) -> Iterator[None]:
    """The client (this process) on the cores the server does not use, if there are any."""
    spare = [c for c in available if c not in server_cores]
    os.sched_setaffinity(0, spare or available)
    try:
        yield
    finally:
        os.sched_setaffinity(0, available)


# --- vLLM's own output handling -------------------------------------------------------------


async def vllm_output_cost(streams: int, tokens: int) -> dict[str, float]:
    """The serving process's CPU per generated token with the real CPU engine (dev model,
    greedy, ``streams`` at once, ``tokens`` each, the stop token ignored): vLLM's output
    handler (ZMQ, msgpack, output processing, the per-request queues) and a trivial consumer.
    The engine core runs in its own process, not counted."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from voicehost.config import Settings
    from voicehost.model.devmodel import DevModelPaths
    from voicehost.model.engine import engine_args

    settings = Settings(
        model=str(DevModelPaths(Settings().dev_dir).model), max_num_seqs=max(streams, 1)
    )
    llm = AsyncLLM.from_engine_args(engine_args(settings))
    params = SamplingParams(
        temperature=0.0,
        max_tokens=tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
    )

    async def one(index: int) -> int:
        count = 0
        async for output in llm.generate(
            {"prompt_token_ids": [128259, 128000, 100 + index, 128009, 128260, 128261, 128257]},
            params,
            f"bench-{index}-{time.monotonic_ns()}",
        ):
            count += len(output.outputs[0].token_ids)
        return count

    try:
        await asyncio.gather(*(one(i) for i in range(streams)))  # warm-up
        idle_start = os.times()
        await asyncio.sleep(3.0)
        idle_end = os.times()
        idle_cpu_per_s = (
            idle_end.user + idle_end.system - idle_start.user - idle_start.system
        ) / 3.0
        start, wall = os.times(), time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        end, wall = os.times(), time.perf_counter() - wall
    finally:
        llm.shutdown()
    cpu = end.user + end.system - start.user - start.system
    total = sum(counts)
    return {
        "streams": streams,
        "tokens": total,
        "tokens_per_s": round(total / wall, 1),
        "cpu_us_per_token": round(cpu / total * 1e6, 1),
        "idle_cpu_per_s": round(idle_cpu_per_s, 4),
        "cpu_us_per_token_less_idle": round((cpu - idle_cpu_per_s * wall) / total * 1e6, 1),
    }


# --- the front end with the real engine, as the batch grows ------------------------------------

FRONT_END_TEXT = "Hi there, how are you today?"  # about 2 s of speech: 160-odd tokens


async def vllm_front_end(
    counts: list[int],
    formats: list[str],
    engine: dict[str, Any] | None = None,
    first_audio_runs: int = 0,
    encode_processes: int = 0,
) -> list[dict[str, Any]]:
    """The serving process's CPU with the real CPU engine (dev model, its serving sampling and
    frame constraint, the built-in voice) at each batch size in ``counts``, in passes that each
    add one stage of the real path: ``vllm`` (``SpeechEngine.audio_tokens`` read and dropped:
    vLLM's output handling), ``pcm`` (the ``Synthesizer``: frames, the decode scheduler and
    decoder with SNAC answering at once, as on a GPU), then each format (an ``EncodingPool``
    stream per request, as the server encodes). The differences split the cost; each figure is
    per token and per audio second, less the process's idle CPU. ``engine``: settings changed
    for this run (e.g. ``{"stream_interval": 7}``). The engine core's own process is not
    counted. ``first_audio_runs``: that many streams one after another, alone, and a row of
    their time to first PCM (``stage`` ``first_audio``). ``encode_processes``: each format
    again as ``FORMAT@procs``, encoded by a pool of that many encoding processes, their CPU
    (from ``/proc``) counted with this process's (``serving_cpu_ms_per_audio_s``: this one's
    alone)."""
    from voicehost.audio.encoding import EncodingPool
    from voicehost.config import Settings
    from voicehost.metrics import SpeechMetrics
    from voicehost.model import orpheus
    from voicehost.model.codec import DecodeScheduler
    from voicehost.model.devmodel import ensure_dev_model
    from voicehost.model.engine import SpeechEngine
    from voicehost.speech.synthesis import Synthesizer
    from voicehost.voices.voice import Voice

    settings = Settings(dev=True, max_num_seqs=max([*counts, 1]), **(engine or {}))
    ensure_dev_model(settings.dev_dir)
    speech = await asyncio.to_thread(SpeechEngine.start, settings)
    scheduler = DecodeScheduler(
        instant_codec(), settings.codec_batch_window_ms, settings.codec_max_batch
    )
    synthesizer = Synthesizer(
        speech,
        scheduler,
        SpeechMetrics(),
        settings.lookahead_frames,
        settings.codec_max_chunk_frames,
    )
    pool = EncodingPool(settings.encode_threads)
    procs = EncodingPool(1, encode_processes) if encode_processes else None
    voice = Voice("tara", "Tara")
    samples_per_token = orpheus.SAMPLES_PER_FRAME / orpheus.TOKENS_PER_FRAME

    async def tokens_only(index: int) -> float:
        prompt = speech.prompt(FRONT_END_TEXT, voice)
        options = speech.sampling(FRONT_END_TEXT, index, len(prompt))
        tokens = 0
        async for delta in speech.audio_tokens(prompt, voice, options):
            tokens += len(delta)
        return tokens * samples_per_token  # as samples, to compare with the other passes

    firsts: list[float] = []  # seconds from a stream's start to its first PCM
    recorded: dict[int, list[np.ndarray]] = {}  # each stream's PCM chunks, as the pcm pass got them

    async def to_pcm(index: int, fmt: str | None) -> float:
        format_stream = None
        if fmt is not None and fmt.endswith("@procs"):
            assert procs is not None
            format_stream = procs.stream(fmt.removesuffix("@procs"))
        elif fmt is not None:
            format_stream = pool.stream(fmt)
        samples = 0
        started = time.perf_counter()
        chunks = recorded.setdefault(index, []) if fmt is None else []
        chunks.clear()
        async for pcm in synthesizer.stream(FRONT_END_TEXT, voice, seed=index):
            if not samples:
                firsts.append(time.perf_counter() - started)
            samples += pcm.size
            chunks.append(pcm)
            if format_stream is not None:
                await format_stream.encode(pcm)
        if format_stream is not None:
            await format_stream.finish()
        return samples

    async def replay(count: int, fmt: str) -> dict[str, Any]:
        """The pcm pass's chunks of ``count`` streams encoded again, all at once through the
        same pool, with the engine idle: encoding as the server does it (same chunks, same
        threads), without the engine core busy on the other core of this 2-core machine."""

        async def one(index: int) -> int:
            format_stream = pool.stream(fmt)
            for pcm in recorded[index]:
                await format_stream.encode(pcm)
            await format_stream.finish()
            return sum(pcm.size for pcm in recorded[index])

        start, wall = os.times(), time.perf_counter()
        samples = sum(await asyncio.gather(*(one(i) for i in range(count))))
        end, wall = os.times(), time.perf_counter() - wall
        cpu = end.user + end.system - start.user - start.system - idle * wall
        chunks = sum(len(recorded[i]) for i in range(count))
        return {
            "streams": count,
            "stage": f"replay_{fmt}",
            "audio_s": round(samples / orpheus.SAMPLE_RATE, 2),
            "chunks": chunks,
            "samples_per_chunk": round(samples / chunks),
            "wall_s": round(wall, 2),
            "cpu_ms_per_audio_s": round(cpu / (samples / orpheus.SAMPLE_RATE) * 1000, 2),
        }

    async def run(count: int, stage: str) -> dict[str, Any]:
        def one(i: int) -> Any:
            if stage == "vllm":
                return tokens_only(i)
            return to_pcm(i, None if stage == "pcm" else stage)

        firsts.clear()
        encoding = procs.encoding_cpu() if procs is not None else 0.0
        start, wall = os.times(), time.perf_counter()
        samples = sum(await asyncio.gather(*(one(i) for i in range(count))))
        end, wall = os.times(), time.perf_counter() - wall
        serving = end.user + end.system - start.user - start.system - idle * wall
        encoding = (procs.encoding_cpu() if procs is not None else 0.0) - encoding
        cpu = serving + encoding
        audio_s = samples / orpheus.SAMPLE_RATE
        tokens = samples / samples_per_token
        return {
            "streams": count,
            "stage": stage,
            "tokens": round(tokens),
            "audio_s": round(audio_s, 2),
            "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1),
            "cpu_us_per_token": round(cpu / tokens * 1e6, 1),
            "cpu_ms_per_audio_s": round(cpu / audio_s * 1000, 2),
            "serving_cpu_ms_per_audio_s": round(serving / audio_s * 1000, 2),
            "first_audio_ms_p50": round(float(np.median(firsts)) * 1000, 1) if firsts else None,
        }

    rows: list[dict[str, Any]] = []
    stages = [*formats, *(f"{fmt}@procs" for fmt in formats if procs is not None)]
    try:
        await asyncio.gather(*(to_pcm(i, f) for i, f in enumerate(["pcm", *stages])))  # warm
        idle_start = os.times()
        await asyncio.sleep(3.0)
        idle_end = os.times()
        idle = (idle_end.user + idle_end.system - idle_start.user - idle_start.system) / 3.0
        for count in counts:
            for stage in ["vllm", "pcm", *stages]:
                rows.append(await run(count, stage))
                print(json.dumps({"front_end": rows[-1], **(engine or {})}), flush=True)
            for fmt in formats:
                rows.append(await replay(count, fmt))
                print(json.dumps({"front_end": rows[-1], **(engine or {})}), flush=True)
        if first_audio_runs:
            firsts.clear()
            for index in range(first_audio_runs):
                await to_pcm(1000 + index, None)
            ms = sorted(1000 * f for f in firsts)
            rows.append(
                {
                    "streams": 1,
                    "stage": "first_audio",
                    "runs": len(ms),
                    "first_audio_ms_p50": round(float(np.median(ms)), 1),
                    "first_audio_ms_min": round(ms[0], 1),
                    "first_audio_ms_max": round(ms[-1], 1),
                }
            )
            print(json.dumps({"front_end": rows[-1], **(engine or {})}), flush=True)
    finally:
        pool.close()
        if procs is not None:
            procs.close()
        speech.shutdown()
    return rows


def frontends_compare(counts: list[int], streams: int, rounds: int) -> list[dict[str, Any]]:
    """``voicehost serve --dev --frontends N`` for each N in ``counts``, the whole real server
    (the dev model on vLLM's CPU engine, SNAC on the CPU as in ``--dev``): ``rounds`` rounds of
    ``streams`` pcm streams at once, each on a connection of its own. Per N: the CPU of every
    process of the host but the engine core's (the front ends, and the parent) per audio second
    delivered, the audio seconds delivered per wall second, and how many streams each front end
    carried (``X-Voicehost-Frontend``) and at most at once."""
    import psutil

    from voicehost.tools import devserver

    rows = []
    for count in counts:
        root = Path(tempfile.mkdtemp(prefix="bench-frontends-"))
        env = {
            "VOICEHOST_FRONTENDS": str(count),
            "VOICEHOST_CODEC_NOISE": "false",
            "VOICEHOST_WORKER_CAPACITY": str(streams),
        }
        with devserver.dev_server(root, **env) as server:
            host = psutil.Process(server.process.pid)

            asyncio.run(_frontend_round(server.url, 2))  # warm every front end a little
            before, started = _host_cpu(host), time.perf_counter()
            carried: dict[str, int] = {}
            peak: dict[str, int] = {}
            audio_s = 0.0
            for _ in range(rounds):
                answers = asyncio.run(_frontend_round(server.url, streams))
                round_count: dict[str, int] = {}
                for frontend, seconds in answers:
                    carried[frontend] = carried.get(frontend, 0) + 1
                    round_count[frontend] = round_count.get(frontend, 0) + 1
                    audio_s += seconds
                for frontend, n in round_count.items():
                    peak[frontend] = max(peak.get(frontend, 0), n)
            wall = time.perf_counter() - started
            cpu = _host_cpu(host) - before
        shutil.rmtree(root, ignore_errors=True)
        row = {
            "frontends": count,
            "streams_at_once": streams,
            "audio_s": round(audio_s, 2),
            "wall_s": round(wall, 2),
            "front_end_cpu_s": round(cpu, 2),
            "cpu_ms_per_audio_s": round(cpu / audio_s * 1000, 1),
            "audio_s_per_wall_s": round(audio_s / wall, 2),
            "streams_by_front_end": dict(sorted(carried.items())),
            "most_at_once_by_front_end": dict(sorted(peak.items())),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _host_cpu(host: Any) -> float:
    """CPU seconds of ``host`` (a ``psutil.Process``) and its processes, the engine core's
    (and what runs under it) left out."""
    import psutil

    total = 0.0
    for process in [host, *host.children(recursive=True)]:
        try:
            names = [p.name() for p in [process, *process.parents()]]
            if any("EngineCore" in name for name in names):
                continue
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


async def _frontend_round(url: str, streams: int) -> list[tuple[str, float]]:
    """``streams`` pcm streams at once, each on its own connection: (front end, audio s)."""
    import aiohttp

    from voicehost.api.edge import FRONTEND_HEADER

    async def one(seed: int) -> tuple[str, float]:
        body = {"input": SPEECH_TEXT, "voice": "tara", "response_format": "pcm", "seed": seed}
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(f"{url}/v1/audio/speech", json=body) as response:
                data = await response.read()
                assert response.status == 200, data[:300]
                return response.headers.get(FRONTEND_HEADER, "0"), len(data) / 2 / 24000

    return await asyncio.gather(*(one(i) for i in range(streams)))


def front_end_split(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per batch size, the CPU per audio second of each stage: vLLM's output handling, our
    pipeline to PCM (the ``pcm`` pass less the ``vllm`` one), each format's encoding (its pass
    less the ``pcm`` one), and the total per format."""
    split = []
    measured = [row for row in rows if row["stage"] != "first_audio"]  # replays are split too
    for count in sorted({row["streams"] for row in measured}):
        by_stage = {r["stage"]: r["cpu_ms_per_audio_s"] for r in measured if r["streams"] == count}
        vllm, pcm = by_stage.pop("vllm"), by_stage.pop("pcm")
        entry: dict[str, Any] = {
            "streams": count,
            "vllm_ms_per_audio_s": vllm,
            "pipeline_ms_per_audio_s": round(pcm - vllm, 2),
            "total_pcm_ms_per_audio_s": pcm,
        }
        for fmt, total in by_stage.items():
            if fmt.startswith("replay_"):  # encoding alone, the engine idle
                entry[f"encode_{fmt.removeprefix('replay_')}_replayed_ms_per_audio_s"] = total
                continue
            entry[f"encode_{fmt}_ms_per_audio_s"] = round(total - pcm, 2)
            entry[f"total_{fmt}_ms_per_audio_s"] = total
        split.append(entry)
    return split


# --- the run ----------------------------------------------------------------------------------


MARKDOWN_COLUMNS = (
    "version",
    "cores",
    "mode",
    "fmt",
    "streams",
    "cpu_ms_per_audio_s",
    "loop_ms_per_audio_s",
    "scaling_1_to_2",
    "rt_streams_per_core",
    "delivered_rt_streams",
    "underrun_streams",
    "lag_p99_ms",
    "ttfb_p50_ms",
    "probe_idle_ttfb_ms",
    "probe_ttfb_ms",
)


def markdown(levels: list[Level]) -> str:
    """The levels as a table, each "before" row above its "after" row."""
    rows = ["| " + " | ".join(MARKDOWN_COLUMNS) + " |", "|" + "---|" * len(MARKDOWN_COLUMNS)]
    for lv in sorted(levels, key=lambda lv: (lv.mode, lv.fmt, lv.cores, lv.streams)):
        values = asdict(lv)
        rows.append("| " + " | ".join(str(values[c]) for c in MARKDOWN_COLUMNS) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="pcm,mp3,opus")
    parser.add_argument("--streams", default="1,16,64", help="comma list of stream counts")
    parser.add_argument("--seconds", type=float, default=6.0, help="audio per stream")
    parser.add_argument("--rate", type=float, default=90.0, help="tokens/s per stream")
    parser.add_argument("--cores", default="1,2", help="comma list of core counts to pin to")
    parser.add_argument("--saturate", type=int, default=32, help="streams at 10x real time")
    parser.add_argument("--saturate-formats", default="mp3,opus")
    parser.add_argument("--probe", type=int, default=32, help="mp3 streams beside the probes")
    parser.add_argument("--profile", default="pcm:64,mp3:64", help="FORMAT:STREAMS,... profiled")
    parser.add_argument("--jitter-buffer-ms", type=float, default=100.0)
    parser.add_argument("--baseline", help="git revision measured too, as 'before'")
    parser.add_argument("--vllm", type=int, default=0, help="streams of the vLLM measurement")
    parser.add_argument(
        "--front-end",
        default="",
        help="comma list of batch sizes: the serving process's CPU with the real engine, "
        "split into vLLM's output handling, the pipeline to PCM and encoding",
    )
    parser.add_argument("--front-end-formats", default="mp3,opus")
    parser.add_argument(
        "--encode-processes",
        type=int,
        default=0,
        help="--front-end: each format again encoded by this many encoding processes",
    )
    parser.add_argument(
        "--first-audio-runs", type=int, default=0, help="lone streams timed to first PCM"
    )
    parser.add_argument(
        "--stream-interval",
        default="",
        help="comma list of engine stream intervals (tokens per output) to compare with "
        "--front-end",
    )
    parser.add_argument(
        "--frontends",
        default="",
        help="comma list of front-end counts: the whole dev server with each, "
        "--frontends-streams pcm streams at once, CPU per audio second",
    )
    parser.add_argument("--frontends-streams", type=int, default=8)
    parser.add_argument("--frontends-rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--per-step", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from voicehost.model import orpheus

    if args.serve:
        serve(args.serve, args.rate, args.per_step, args.frames)
        return 0
    frames = max(2, round(args.seconds / orpheus.FRAME_SECONDS))
    seconds = frames * orpheus.FRAME_SECONDS
    counts = [int(c) for c in args.streams.split(",") if c]
    available = sorted(os.sched_getaffinity(0))
    core_counts = [min(int(c), len(available)) for c in args.cores.split(",") if c]
    jitter = args.jitter_buffer_ms / 1000
    versions = [("before", args.baseline)] if args.baseline else []
    versions.append(("after", None))
    levels: list[Level] = []
    profiles: dict[str, str] = {}
    servers: dict[str, dict[str, float]] = {}

    def measure(
        url: str, level: Level, idle: float, probes: int = 0, seconds: float = seconds
    ) -> None:
        asyncio.run(run_level(url, level, seconds, jitter, idle, probes))
        levels.append(level)
        print(json.dumps(asdict(level)), flush=True)

    formats = [f for f in args.formats.split(",") if f]
    if not (formats or args.saturate or args.probe or args.profile):
        versions = []  # only --vllm, --front-end or --frontends
    for version, revision in versions:
        with code_tree(revision) as tree:
            for cores in core_counts:
                pinned = available[-cores:]
                with client_cores(pinned, available):
                    if args.saturate:  # 10 tokens a step, 3x as long: 11x real time
                        with bench_server(tree, pinned, args.rate, 10, 3 * frames) as url:
                            idle = asyncio.run(server_figures(url, 1))["idle_cpu_per_s"]
                            for fmt in args.saturate_formats.split(","):
                                level = Level(version, cores, fmt, args.saturate, "saturate")
                                measure(url, level, idle, seconds=3 * seconds)
                    if cores != max(core_counts):
                        continue
                    with bench_server(tree, pinned, args.rate, 1, frames) as url:
                        figures = asyncio.run(server_figures(url, max(counts)))
                        servers[version] = figures
                        print(version, figures, flush=True)
                        idle = figures["idle_cpu_per_s"]
                        for fmt in formats:
                            for count in counts:
                                measure(url, Level(version, cores, fmt, count, "realtime"), idle)
                        if args.probe:
                            measure(url, Level(version, cores, "mp3", args.probe, "probe"), idle, 5)
                        for spec in [p for p in args.profile.split(",") if p]:
                            fmt, count = spec.split(":")
                            level = Level(version, cores, fmt, int(count), "profile")
                            text = asyncio.run(profiled(url, level, seconds, jitter))
                            profiles[f"{version} {spec}"] = text
                            print(f"{version} {spec}\n{text}", flush=True)
    vllm = None
    if args.vllm:
        try:
            vllm = asyncio.run(vllm_output_cost(args.vllm, 512))
        except Exception as exc:  # the server figures above still stand
            vllm = {"error": f"{type(exc).__name__}: {exc}"}
    front_end: dict[str, Any] = {}
    if args.front_end or args.first_audio_runs:
        counts_fe = [int(c) for c in args.front_end.split(",") if c]
        fe_formats = [f for f in args.front_end_formats.split(",") if f]
        intervals = [int(i) for i in args.stream_interval.split(",") if i] or [0]
        for interval in intervals:
            engine = {"stream_interval": interval} if interval else None
            rows = asyncio.run(
                vllm_front_end(
                    counts_fe, fe_formats, engine, args.first_audio_runs, args.encode_processes
                )
            )
            key = f"stream_interval_{interval}" if interval else "default"
            front_end[key] = {"rows": rows, "split": front_end_split(rows)}
            print(json.dumps({"front_end_split": front_end[key]["split"], "run": key}))
    frontends = []
    if args.frontends:
        counts_n = [int(n) for n in args.frontends.split(",") if n]
        frontends = frontends_compare(counts_n, args.frontends_streams, args.frontends_rounds)
    report = {
        "frontends": frontends,
        "front_end": front_end,
        "rate_tokens_per_s": args.rate,
        "seconds_per_stream": round(seconds, 2),
        "jitter_buffer_ms": args.jitter_buffer_ms,
        "cores_available": len(available),
        "baseline": args.baseline,
        "servers": servers,
        "levels": [asdict(level) for level in levels],
        "profiles": profiles,
        "vllm_output_handling": vllm,
    }
    print(markdown(levels))
    if vllm:
        print(vllm)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
