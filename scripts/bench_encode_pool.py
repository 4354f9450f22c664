"""What encoding costs through the server's pool, many streams at once, against the same streams
encoded one after another in one thread; and LAME's own speed at each ``compression_level``.

The server encodes each response on ``EncodingPool`` threads while its event loop runs:
PyAV releases the GIL around every codec call, so each release with the loop waiting is a hand-
over of the GIL between threads. This measures what those hand-overs add, in one run:

- ``serial``: ``--streams`` streams of ``--seconds`` of a speech-like signal, in chunks of 2048
  samples (one SNAC frame: the most chunks per audio second), one ``FormatWriter`` after
  another in this thread;
- ``pool N``: the same streams all at once through an ``EncodingPool`` of N threads, from
  an event loop, as ``voicehost.api.server`` sends them;
- ``procs N``: the same through a pool of N encoding processes (``VOICEHOST_ENCODE_PROCESSES``):
  the CPU of this process (its loop: one socket write and read per chunk) and of the encoding
  processes (``/proc``), split as ``procs_N_loop`` and ``procs_N_encoding``;
- ``lame level``: one mp3 stream through PyAV with LAME's ``compression_level`` set (its ``-q``:
  0 slowest, 9 fastest; unset is the codec's default), the least of 5.

CPU of the whole process (``os.times``) per second of audio. ``serial`` runs first and last: the
two bound the machine's drift over the run.

    python scripts/bench_encode_pool.py --formats mp3,opus
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voicehost.audio.encoding import EncodingPool
from voicehost.audio.formats import FormatWriter

CHUNK = 2048
RATE = 24000


def signal(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(RATE * seconds)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def serial(fmt: str, chunks: list[np.ndarray], streams: int, audio_s: float) -> float:
    started = cpu()
    for _ in range(streams):
        writer = FormatWriter(fmt)
        for chunk in chunks:
            writer.encode(chunk)
        writer.finish()
    return (cpu() - started) / audio_s * 1000


async def pooled(
    fmt: str, chunks: list[np.ndarray], streams: int, audio_s: float, threads: int, processes: int
) -> tuple[float, float]:
    """(this process's, the encoding processes') CPU in ms per audio second."""
    pool = EncodingPool(threads, processes)

    async def one() -> None:
        stream = pool.stream(fmt)
        for chunk in chunks:
            await stream.encode(chunk)
        await stream.finish()

    await one()  # each encoding process started and connected
    await asyncio.sleep(0.5)
    started, encoding = cpu(), pool.encoding_cpu()
    await asyncio.gather(*(one() for _ in range(streams)))
    spent, encoding = cpu() - started, pool.encoding_cpu() - encoding
    pool.close()
    return spent / audio_s * 1000, encoding / audio_s * 1000


class _Sink:
    def write(self, data: bytes) -> int:
        return len(data)


def lame(audio: np.ndarray, level: int | None) -> float:
    best = float("inf")
    for _ in range(5):
        container = av.open(_Sink(), "w", format="mp3")
        stream = container.add_stream("libmp3lame", rate=RATE, layout="mono")
        stream.codec_context.format = "fltp"
        stream.codec_context.bit_rate = 64000
        if level is not None:
            stream.codec_context.options = {"compression_level": str(level)}
        container.start_encoding()
        started = time.process_time()
        for start in range(0, audio.size, CHUNK):
            frame = av.AudioFrame.from_ndarray(
                audio[None, start : start + CHUNK], format="fltp", layout="mono"
            )
            frame.sample_rate = RATE
            frame.pts = start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
        container.close()
        best = min(best, time.process_time() - started)
    return best / (audio.size / RATE) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="mp3,opus")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--processes", default="1,2", help="encoding processes (0: none)")
    parser.add_argument("--lame-levels", default="default,0,2,5,7,9")
    args = parser.parse_args()
    audio = signal(args.seconds)
    chunks = [audio[i : i + CHUNK] for i in range(0, audio.size, CHUNK)]
    audio_s = args.streams * audio.size / RATE
    load_before = os.getloadavg()
    figures: dict[str, dict[str, float]] = {}
    for fmt in [f for f in args.formats.split(",") if f]:
        row = {"serial_first": serial(fmt, chunks, args.streams, audio_s)}
        for threads in [int(t) for t in args.threads.split(",") if t]:
            row[f"pool_{threads}"] = asyncio.run(
                pooled(fmt, chunks, args.streams, audio_s, threads, 0)
            )[0]
        for processes in [int(p) for p in args.processes.split(",") if p and p != "0"]:
            loop, encoding = asyncio.run(pooled(fmt, chunks, args.streams, audio_s, 1, processes))
            row[f"procs_{processes}_loop"], row[f"procs_{processes}_encoding"] = loop, encoding
            row[f"procs_{processes}"] = loop + encoding
        row["serial_last"] = serial(fmt, chunks, args.streams, audio_s)
        figures[fmt] = {k: round(v, 2) for k, v in row.items()}
    levels = {}
    for level in [v for v in args.lame_levels.split(",") if v]:
        levels[level] = round(lame(signal(10.0), None if level == "default" else int(level)), 2)
    print("| format | " + " | ".join(next(iter(figures.values()))) + " |")
    print("|---|" + "---:|" * len(next(iter(figures.values()))))
    for fmt, row in figures.items():
        print(f"| {fmt} | " + " | ".join(str(v) for v in row.values()) + " |")
    print("LAME, ms per audio second by compression_level:", levels)
    print(f"load average before {load_before}, after {os.getloadavg()}")
    print(json.dumps({"pool": figures, "lame": levels}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
