"""Encoding cost per second of audio, the format writers at a base commit against this tree's,
in one run: CPU, and the serial part of it (the CPU spent holding the GIL), per format and chunk
size.

Chunks are what the server hands ``FormatWriter``: each SNAC decode window's samples, whole
frames of 2048 samples at 24 kHz (``orpheus.SAMPLES_PER_FRAME``): 1 frame for the first window,
then as many as the stream's lead allows, at most ``codec_max_chunk_frames`` (16). So 2048 (a
stream at real time: the most chunks per audio second), 8192 and 32768 (a stream well ahead).
A stream is a fresh writer, ``--seconds`` of a speech-like signal in such chunks, and ``finish``
(as one response: the writer's set-up is in the figure). The base's ``voicehost/audio/formats.py``
is read with ``git show`` and imported beside this tree's; the two alternate, stream by stream, so
the machine's load falls on both alike. Each figure is the least over ``--repeats`` streams: the
machine's noise only adds to a stream's CPU (other tenants, a vCPU's steal time), by up to 30 % on
the machine this was written on.

The script runs itself again with a small shim preloaded (``LD_PRELOAD``, compiled here with
``cc``) that wraps ``PyEval_SaveThread``/``PyEval_RestoreThread`` (how C extensions, PyAV's
Cython, numpy and soxr, release and retake the GIL) and ``PyGILState_Ensure``/``Release`` (how a
callback retakes it inside such a region: PyAV's writes to our sink), and sums the thread's CPU
time from each release to the next retake. Per stream:

- **CPU**: the encoding thread's CPU time (``time.thread_time_ns``) per second of audio, less the
  shim's clock reads (two per release, their cost measured).
- **Serial**: the part of it spent holding the GIL: the thread's CPU less the released spans, less
  one clock read per held span. What the event loop and the other encoding threads cannot overlap
  with, so what caps a process's streams however many cores it has. Measured by accounting, not
  by concurrency: a probe thread's progress or Amdahl from 1 and 2 threads would need a free core
  for the GIL-free part, and the 2-vCPU machine this was written on runs two threads of GIL-free
  hashing only 1.05-1.3x faster than one; there a probe counted nearly all of a writer's CPU as
  serial (GIL hand-over latency, not GIL holding).
- **GIL releases**: how often per second of audio the thread gives the GIL up and takes it back.
  In a busy process each can be a hand-over to another thread, whose latency (not in the serial
  figure) holds the GIL idle.

    python scripts/bench_formats.py [--base 65e966b] [--formats pcm,wav,mp3,opus]
        [--chunks 2048,8192,32768] [--seconds 10] [--repeats 9]

A format may name a rate (``opus@48000``: resampled by soxr first). Prints a markdown table, the
load average before and after, and last one JSON object with every figure. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType

import numpy as np

from voicehost.audio import formats as this_tree
from voicehost.model.orpheus import SAMPLE_RATE, SAMPLES_PER_FRAME

BASE = "65e966b"  # the commit before one PyAV frame per chunk
FORMATS_PATH = "voicehost/audio/formats.py"
SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

static __thread long long released_at, released_ns, releases;

static long long thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void retaking(void) {
    if (released_at) released_ns += thread_ns() - released_at;
    released_at = 0;
}

static void released(void) {
    released_at = thread_ns();
    releases++;
}

void *PyEval_SaveThread(void) {
    static void *(*real)(void);
    if (!real) real = (void *(*)(void))dlsym(RTLD_NEXT, "PyEval_SaveThread");
    void *state = real();
    released();
    return state;
}

void PyEval_RestoreThread(void *state) {
    static void (*real)(void *);
    if (!real) real = (void (*)(void *))dlsym(RTLD_NEXT, "PyEval_RestoreThread");
    retaking();
    real(state);
}

int PyGILState_Ensure(void) {
    static int (*real)(void);
    if (!real) real = (int (*)(void))dlsym(RTLD_NEXT, "PyGILState_Ensure");
    retaking();
    return real();
}

void PyGILState_Release(int state) {
    static void (*real)(int);
    if (!real) real = (void (*)(int))dlsym(RTLD_NEXT, "PyGILState_Release");
    real(state);
    /* PyGILState_UNLOCKED: the GIL is given back (unless the inner SaveThread counted it) */
    if (state == 1 && !released_at) released();
}

long long gil_released_ns(void) { return released_ns; }
long long gil_releases(void) { return releases; }

long long clock_read_ns(void) {
    long long start = thread_ns();
    for (int i = 0; i < 20000; i++) thread_ns();
    return (thread_ns() - start) / 20000;
}
"""


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Float32 mono at 24 kHz: voiced syllables (harmonics of a gliding 100-220 Hz pitch under
    two formants) with noise bursts and pauses between them, peaking near -3 dBFS."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    pitch = 160 + 60 * np.sin(2 * np.pi * 0.7 * t) * np.sin(2 * np.pi * 0.13 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    formants = (700 + 300 * np.sin(2 * np.pi * 1.9 * t), 1800 + 500 * np.sin(2 * np.pi * 1.1 * t))
    voiced = np.zeros(n)
    for k in range(1, 30):
        gain = sum(1 / (1 + ((k * pitch - f) / 150) ** 2) for f in formants) / k**0.5
        voiced += gain * np.sin(k * phase)
    syllables = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 2
    pauses = (np.sin(2 * np.pi * 0.31 * t) > -0.8).astype(float)
    noise = rng.standard_normal(n) * (np.sin(2 * np.pi * 4 * t) < -0.7)
    signal = (voiced * syllables + 0.3 * noise) * pauses
    return (0.7 * signal / np.abs(signal).max()).astype(np.float32)


def formats_at(base: str, directory: Path) -> ModuleType:
    """``voicehost/audio/formats.py`` at ``base``, imported as a module of its own."""
    repo = Path(__file__).resolve().parents[1]
    show = ["git", "show", f"{base}:{FORMATS_PATH}"]
    source = subprocess.run(show, cwd=repo, check=True, capture_output=True, text=True).stdout
    path = directory / "formats_at_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("formats_at_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def encode_stream(module: ModuleType, target: str, signal: np.ndarray, chunk: int) -> int:
    """One response: a fresh writer, ``signal`` in chunks of ``chunk``, ``finish``; bytes out."""
    fmt, _, rate = target.partition("@")
    # FormatWriter, or FormatEncoder, its name before, at a base commit from before the rename
    writer_class = getattr(module, "FormatWriter", None) or module.FormatEncoder
    writer = writer_class(fmt, int(rate) if rate else None)
    size = 0
    for start in range(0, len(signal), chunk):
        size += len(writer.encode(signal[start : start + chunk]))
    return size + len(writer.finish())


def cases(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [(fmt, chunk) for fmt in args.formats.split(",") for chunk in args.chunks]


@dataclass
class Stream:
    """One encoded stream's figures, per second of audio."""

    cpu_ms: float
    serial_ms: float
    releases: float


FIELDS = tuple(field.name for field in fields(Stream))


def measure(args: argparse.Namespace, shim: ctypes.PyDLL) -> dict[tuple[str, str, int], list]:
    """Every stream's ``Stream`` figures, by (implementation, format, chunk)."""
    work = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    impls = {"base": formats_at(args.base, work), "new": this_tree}
    signal = speech_like(args.seconds)
    audio_s = len(signal) / SAMPLE_RATE
    read_ns = shim.clock_read_ns()
    streams: dict[tuple[str, str, int], list] = {}
    for fmt, chunk in cases(args):
        for module in impls.values():
            encode_stream(module, fmt, signal, chunk)  # warm-up: codec tables, imports
        for _ in range(args.repeats):
            for name, module in impls.items():
                start_ns = time.thread_time_ns()
                released, releases = shim.gil_released_ns(), shim.gil_releases()
                encode_stream(module, fmt, signal, chunk)
                releases = shim.gil_releases() - releases
                cpu_ns = time.thread_time_ns() - start_ns
                held_ns = cpu_ns - (shim.gil_released_ns() - released)
                # A released span holds one clock read, the held span beside it one more.
                figures = Stream(
                    (cpu_ns - 2 * releases * read_ns) / 1e6 / audio_s,
                    (held_ns - releases * read_ns) / 1e6 / audio_s,
                    releases / audio_s,
                )
                streams.setdefault((name, fmt, chunk), []).append(figures)
    return streams


def with_shim() -> ctypes.PyDLL:
    """The shim, loaded: this process runs again with it preloaded if it is not."""
    library = os.environ.get("BENCH_FORMATS_SHIM")
    if library is None or library not in os.environ.get("LD_PRELOAD", ""):
        directory = Path(tempfile.mkdtemp(prefix="bench-formats-shim-"))
        source, library = directory / "gilshim.c", str(directory / "gilshim.so")
        source.write_text(SHIM_C)
        command = ["cc", "-O2", "-shared", "-fPIC", "-o", library, str(source), "-ldl"]
        subprocess.run(command, check=True)
        env = {**os.environ, "BENCH_FORMATS_SHIM": library, "LD_PRELOAD": library}
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)
    shim = ctypes.PyDLL(library)  # calls that keep the GIL, so count no release
    for name in ("gil_released_ns", "gil_releases", "clock_read_ns"):
        getattr(shim, name).restype = ctypes.c_longlong
    return shim


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def table(args: argparse.Namespace, streams: dict) -> tuple[str, dict]:
    rows = [
        "| format | chunk (samples) | CPU ms per audio s base / new | serial ms per audio s "
        "base / new | serial share base / new | GIL releases per audio s base / new |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    result: dict[str, dict] = {}
    for fmt, chunk in cases(args):
        least = {
            name: Stream(
                *(min(getattr(s, field) for s in streams[name, fmt, chunk]) for field in FIELDS)
            )
            for name in ("base", "new")
        }
        base, new = least["base"], least["new"]
        rows.append(
            f"| {fmt} | {chunk} | {base.cpu_ms:.2f} / {new.cpu_ms:.2f} "
            f"| {base.serial_ms:.2f} / {new.serial_ms:.2f} "
            f"| {base.serial_ms / base.cpu_ms:.0%} / {new.serial_ms / new.cpu_ms:.0%} "
            f"| {base.releases:.0f} / {new.releases:.0f} |"
        )
        result[f"{fmt} {chunk}"] = {
            f"{field}_{name}": round(getattr(least[name], field), 3)
            for name in least
            for field in FIELDS
        }
    return "\n".join(rows), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help="the commit whose format writers to compare")
    parser.add_argument("--formats", default="pcm,wav,mp3,opus")
    parser.add_argument(
        "--chunks",
        type=lambda text: [int(value) for value in text.split(",")],
        default=[SAMPLES_PER_FRAME, 4 * SAMPLES_PER_FRAME, 16 * SAMPLES_PER_FRAME],
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    shim = with_shim()
    load_before = load()
    text, result = table(args, measure(args, shim))
    print(f"base {args.base}, {args.seconds:g} s streams, the least of {args.repeats}")
    print(text)
    print(f"load average (1, 5, 15 min) before: {load_before}; after: {load()}")
    print(json.dumps({"base": args.base, "load_before": load_before, "figures": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
