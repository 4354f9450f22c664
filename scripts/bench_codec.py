"""SNAC decoding cost: the batching scheduler with growing chunks against the public decoders.

Both sides use the same SNAC weights at the real 24 kHz size (random, seeded; no download) and
the same CPU threads. Streams are simulated: each gets a frame of random codes every
``frame / --speed`` seconds of a simulated clock (the engine generating ``--speed`` x faster than
real time), streams starting a few frames apart. Decoding does not move that clock (as on a GPU,
where decoding takes a small share of the frame time), so the compute measured is what each
design needs per second of audio, whatever this machine's speed.

- naive (written here, as the public Orpheus decoders do it): per stream, once 4 frames exist,
  every new frame decodes the last 4 frames alone and keeps the second one; first audio after
  28 tokens; the first frame and the last two are never played.
- scheduler (``voicehost.model.codec``): ``FrameDecoder`` windows with 3 frames of left context and
  the lookahead on the right, chunks growing with each stream's lead, every stream's windows
  batched by one ``DecodeScheduler``.

Figures: process CPU-seconds per second of audio at each stream count, their ratio (speedup),
the tokens before the first audio, and frames never played. The last line of output is one JSON
object: ``{"speedup": {"1": x, "8": x, "32": x}, "first_audio_tokens": n,
"first_audio_tokens_naive": n, "frames_dropped": n, ...}``.

    python scripts/bench_codec.py [--streams 1,8,32] [--seconds 6] [--speed 2] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from voicehost.model import orpheus
from voicehost.model.codec import (
    DEFAULT_LOOKAHEAD_FRAMES,
    DEFAULT_MAX_CHUNK_FRAMES,
    DecodeScheduler,
    FrameDecoder,
    SnacCodec,
)

NAIVE_WINDOW = 4  # frames per decode in the public decoders
STAGGER_FRAMES = 3  # stream k starts k * 3 frames (mod 17) after stream 0


@dataclass
class Result:
    cpu_seconds: float
    audio_seconds: float
    first_audio_tokens: int
    frames_dropped: int
    decoded_frames: int
    snac_calls: int

    @property
    def cpu_per_audio_second(self) -> float:
        return self.cpu_seconds / self.audio_seconds


def random_stream(frames: int, seed: int) -> list[orpheus.Frame]:
    rng = random.Random(seed)
    return [
        orpheus.Frame(
            (rng.randrange(4096),),
            (rng.randrange(4096), rng.randrange(4096)),
            tuple(rng.randrange(4096) for _ in range(4)),  # type: ignore[arg-type]
        )
        for _ in range(frames)
    ]


def naive(codec: SnacCodec, streams: list[list[orpheus.Frame]]) -> Result:
    """Per stream, per frame: decode the last 4 frames alone, keep the second."""
    spf = orpheus.SAMPLES_PER_FRAME
    played = calls = 0
    first_frames = None
    started = time.process_time()
    for frames in streams:
        for count in range(NAIVE_WINDOW, len(frames) + 1):
            audio = codec.decode(frames[count - NAIVE_WINDOW : count])[spf : 2 * spf]
            calls += 1
            played += audio.size // spf
            if first_frames is None:
                first_frames = count
    cpu = time.process_time() - started
    total = sum(len(f) for f in streams)
    return Result(
        cpu_seconds=cpu,
        audio_seconds=played * orpheus.FRAME_SECONDS,
        first_audio_tokens=(first_frames or 0) * orpheus.TOKENS_PER_FRAME,
        frames_dropped=total - played,
        decoded_frames=calls * NAIVE_WINDOW,
        snac_calls=calls,
    )


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def scheduled(
    codec: SnacCodec, streams: list[list[orpheus.Frame]], speed: float, max_chunk: int
) -> Result:
    """Every stream through one ``DecodeScheduler``, frames arriving on a simulated clock."""
    clock = SimulatedClock()
    scheduler = DecodeScheduler(codec)
    decoders = [
        FrameDecoder(scheduler, DEFAULT_LOOKAHEAD_FRAMES, max_chunk, clock) for _ in streams
    ]
    offsets = [(k * STAGGER_FRAMES) % 17 for k in range(len(streams))]
    steps = max(o + len(f) for o, f in zip(offsets, streams, strict=True))
    samples = [0] * len(streams)
    first_frames: list[int | None] = [None] * len(streams)

    async def step(k: int, index: int) -> None:
        decoder = decoders[k]
        pcm = await decoder.push([streams[k][index]])
        if index == len(streams[k]) - 1:
            pcm = np.concatenate([pcm, await decoder.finish()])
            decoder.close()
        if pcm.size and first_frames[k] is None:
            first_frames[k] = index + 1
        samples[k] += pcm.size

    started = time.process_time()
    for tick in range(steps):
        clock.now = tick * orpheus.FRAME_SECONDS / speed
        due = [
            (k, tick - offsets[k])
            for k in range(len(streams))
            if 0 <= tick - offsets[k] < len(streams[k])
        ]
        await asyncio.gather(*(step(k, index) for k, index in due))
    cpu = time.process_time() - started
    await scheduler.close()
    spf = orpheus.SAMPLES_PER_FRAME
    played = sum(samples) // spf
    return Result(
        cpu_seconds=cpu,
        audio_seconds=played * orpheus.FRAME_SECONDS,
        first_audio_tokens=max(f or 0 for f in first_frames) * orpheus.TOKENS_PER_FRAME,
        frames_dropped=sum(len(f) for f in streams) - played,
        decoded_frames=scheduler.frames_decoded,
        snac_calls=scheduler.batches,
    )


def build_codec(seed: int) -> SnacCodec:
    from snac import SNAC

    torch.manual_seed(seed)
    model = SNAC(**orpheus.SNAC_24KHZ_CONFIG).eval()
    return SnacCodec(model, torch.device("cpu"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,8,32", help="comma list of stream counts")
    parser.add_argument("--seconds", type=float, default=6.0, help="audio per stream")
    parser.add_argument("--speed", type=float, default=2.0, help="generation x real time")
    parser.add_argument("--max-chunk", type=int, default=DEFAULT_MAX_CHUNK_FRAMES)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    codec = build_codec(args.seed)
    frames = round(args.seconds / orpheus.FRAME_SECONDS)
    report: dict[str, object] = {
        "snac": "24 kHz, random weights",
        "threads": args.threads,
        "seconds_per_stream": args.seconds,
        "speed": args.speed,
        "levels": {},
    }
    levels: dict[str, dict[str, object]] = {}
    speedup: dict[str, float] = {}
    print(f"{'streams':>7} {'design':>9} {'cpu s/audio s':>14} {'frames/frame':>13} {'calls':>6}")
    for count in (int(n) for n in args.streams.split(",")):
        streams = [random_stream(frames, args.seed * 1000 + k) for k in range(count)]
        codec.decode(streams[0][:NAIVE_WINDOW])  # warm-up
        ours = asyncio.run(scheduled(codec, streams, args.speed, args.max_chunk))
        theirs = naive(codec, streams)
        speedup[str(count)] = round(theirs.cpu_per_audio_second / ours.cpu_per_audio_second, 2)
        levels[str(count)] = {"scheduler": ours.__dict__, "naive": theirs.__dict__}
        for name, result in (("scheduler", ours), ("naive", theirs)):
            played = result.audio_seconds / orpheus.FRAME_SECONDS
            print(
                f"{count:>7} {name:>9} {result.cpu_per_audio_second:>14.3f} "
                f"{result.decoded_frames / played:>13.2f} {result.snac_calls:>6}",
                flush=True,
            )
        print(f"{count:>7} {'speedup':>9} {speedup[str(count)]:>14.2f}", flush=True)
    first = levels[args.streams.split(",")[0]]
    report["levels"] = levels
    summary = {
        "speedup": speedup,
        "first_audio_tokens": first["scheduler"]["first_audio_tokens"],  # type: ignore[index]
        "first_audio_tokens_naive": first["naive"]["first_audio_tokens"],  # type: ignore[index]
        "frames_dropped": max(
            level["scheduler"]["frames_dropped"]  # type: ignore[index]
            for level in levels.values()
        ),
        "frames_dropped_naive": max(
            level["naive"]["frames_dropped"]  # type: ignore[index]
            for level in levels.values()
        ),
    }
    if args.json:
        with open(args.json, "w") as sink:
            json.dump({**report, "summary": summary}, sink, indent=2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
