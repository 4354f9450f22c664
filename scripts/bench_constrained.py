"""Position-constrained sampling (``voicehost/model/frame_constraint.py``): malformed frames and
stray tokens per 1000 frames with and without it, and the tokens/s it costs.

Starts one ``SpeechEngine`` in-process on the dev model with the logits processor loaded
(``VOICEHOST_CONSTRAINED_SAMPLING`` on, as when serving) at a high temperature (``--temperature``
1.5, ``--top-p`` 1: where unconstrained sampling goes wrong), and runs the serving path
(``engine.prompt``, ``engine.sampling``, ``engine.audio_tokens``, ``orpheus.FrameAssembler``) with
each request opting in or not (``SamplingOptions.constrained``), so both modes run on the same
engine in the same run, in alternating rounds of ``--batch`` concurrent requests on the built-in
and dev adapter voices:

1. **Quality**: rounds until the constrained requests have assembled at least ``--frames``
   frames (5000) and the unconstrained ones ``--baseline-frames`` (2000: their rate shows
   sooner); counts the assembler's malformed frames, stray tokens and incomplete tails per mode.
2. **Cost**: ``--repeats`` pairs of batches of ``--batch`` requests that each generate exactly
   ``--tokens`` tokens (``ignore_eos``), constrained and not, in alternating order; the median
   tokens/s of each mode and the median of the paired ratios. Measured at the benchmark's
   temperature and at the serving sampler (``--serving-temperature`` 0.6, top-p 0.8), whose
   top-p sort over the 157k vocabulary dominates a step of the tiny dev model on CPU.

Prints a table and, as the last line, one JSON object. Usage::

    python scripts/bench_constrained.py [--frames 5000] [--batch 8] [--tokens 112]
        [--repeats 8] [--temperature 1.5] [--top-p 1.0] [--hot-only] [--json OUT]

``--frames 0 --baseline-frames 0`` skips the quality rounds (only the cost is measured).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths, ensure_dev_model
from voicehost.model.engine import SpeechEngine
from voicehost.model.frame_constraint import EXTRA_ARG
from voicehost.voices.voice import Voice

TEXTS = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A long time ago, in a quiet town by the sea, there lived an old clockmaker.",
    "Numbers like forty two and one thousand nine hundred should be read aloud.",
)


@dataclasses.dataclass
class Tally:
    requests: int = 0
    tokens: int = 0
    frames: int = 0
    malformed_frames: int = 0
    stray_tokens: int = 0
    incomplete_tokens: int = 0

    def per_1000_frames(self, count: int) -> float:
        return round(1000 * count / max(self.frames, 1), 2)


def voices(dev: DevModelPaths) -> list[Voice]:
    adapters = sorted(p for p in dev.adapters.iterdir() if p.is_dir())
    return [Voice("tara", "tara"), Voice("leo", "leo")] + [
        Voice(p.name, p.name, "plain", p, checksum=p.name) for p in adapters
    ]


async def speak(
    engine: SpeechEngine, text: str, voice: Voice, seed: int, constrained: bool, tally: Tally
) -> None:
    prompt = engine.prompt(text, voice)
    options = dataclasses.replace(engine.sampling(text, seed, len(prompt)), constrained=constrained)
    assembler = orpheus.FrameAssembler()
    async for token_ids in engine.audio_tokens(prompt, voice, options):
        tally.tokens += len(token_ids)
        assembler.push(token_ids)
    tally.requests += 1
    tally.frames += assembler.frames
    tally.malformed_frames += assembler.malformed_frames
    tally.stray_tokens += assembler.stray_tokens
    tally.incomplete_tokens += assembler.incomplete_tokens


async def quality(engine: SpeechEngine, pool: list[Voice], args: argparse.Namespace) -> dict:
    tallies = {True: Tally(), False: Tally()}
    seed = 0
    rounds = 0
    targets = {True: args.frames, False: args.baseline_frames}
    while any(tallies[mode].frames < targets[mode] for mode in (True, False)):
        for constrained in (rounds % 2 == 0, rounds % 2 == 1):
            if tallies[constrained].frames >= targets[constrained]:
                continue
            jobs = []
            for i in range(args.batch):
                seed += 1
                text = f"Take {seed}. {TEXTS[seed % len(TEXTS)]}"
                voice = pool[i % len(pool)]
                jobs.append(speak(engine, text, voice, seed, constrained, tallies[constrained]))
            await asyncio.gather(*jobs)
        rounds += 1
        on, off = tallies[True], tallies[False]
        print(
            f"round {rounds}: constrained {on.frames} frames, {on.malformed_frames} malformed, "
            f"{on.stray_tokens} stray | unconstrained {off.frames} frames, "
            f"{off.malformed_frames} malformed, {off.stray_tokens} stray",
            flush=True,
        )
    return {
        ("constrained" if mode else "unconstrained"): {
            **dataclasses.asdict(t),
            "malformed_per_1000_frames": t.per_1000_frames(t.malformed_frames),
            "stray_per_1000_frames": t.per_1000_frames(t.stray_tokens),
        }
        for mode, t in tallies.items()
    }


async def timed_batch(
    engine: SpeechEngine,
    pool: list[Voice],
    constrained: bool,
    temperature: float,
    top_p: float,
    args: argparse.Namespace,
) -> float:
    """Tokens/s of ``--batch`` requests of exactly ``--tokens`` tokens each."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        repetition_penalty=engine.settings.repetition_penalty,
        max_tokens=args.tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        extra_args={EXTRA_ARG: True} if constrained else None,
    )

    async def one(index: int) -> int:
        voice = pool[index % len(pool)]
        prompt = engine.prompt(f"Run {uuid.uuid4().hex[:8]}. {TEXTS[index % len(TEXTS)]}", voice)
        count = 0
        async for output in engine.llm.generate(
            {"prompt_token_ids": prompt},
            params,
            f"bench-constrained-{uuid.uuid4().hex}",
            lora_request=engine.lora_request(voice),
        ):
            count += len(output.outputs[0].token_ids)
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(args.batch)))
    return sum(counts) / (time.perf_counter() - started)


async def cost(
    engine: SpeechEngine, pool: list[Voice], temperature: float, top_p: float, args
) -> dict:
    for constrained in (True, False):  # warm-up
        await timed_batch(engine, pool, constrained, temperature, top_p, args)
    rates: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        pair = {}
        for constrained in order:
            pair[constrained] = await timed_batch(
                engine, pool, constrained, temperature, top_p, args
            )
            rates[constrained].append(pair[constrained])
        ratios.append(pair[True] / pair[False])
        print(
            f"T={temperature} top_p={top_p} repeat {repeat + 1}: constrained "
            f"{pair[True]:.1f} tok/s, unconstrained {pair[False]:.1f} tok/s",
            flush=True,
        )
    return {
        "temperature": temperature,
        "top_p": top_p,
        "constrained_tokens_per_s": round(statistics.median(rates[True]), 1),
        "unconstrained_tokens_per_s": round(statistics.median(rates[False]), 1),
        "median_paired_ratio": round(statistics.median(ratios), 4),
        "cost_percent": round(100 * (1 - statistics.median(ratios)), 2),
    }


def processor_step_ms(batch: int, steps: int = 50) -> float:
    """Milliseconds of one ``FrameConstraint.apply`` on ``batch`` rows of Orpheus' vocabulary
    (float32 logits, every row constrained, positions spread over the frame), on this CPU."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from voicehost.model.frame_constraint import FrameConstraint

    processor = FrameConstraint(None, torch.device("cpu"), False)
    params = SamplingParams(extra_args={EXTRA_ARG: True})
    outputs = [[0] * (i % 30) for i in range(batch)]
    added = [(i, params, None, outputs[i]) for i in range(batch)]
    processor.update_state(BatchUpdate(batch, removed=(), added=added, moved=()))
    logits = torch.randn(batch, orpheus.VOCAB_SIZE)
    processor.apply(logits.clone())
    started = time.perf_counter()
    for step in range(steps):
        outputs[step % batch].append(0)
        processor.apply(logits)
    return 1000 * (time.perf_counter() - started) / steps


async def bench(args: argparse.Namespace) -> dict:
    base = Settings()
    dev = ensure_dev_model(base.dev_dir)
    settings = base.model_copy(
        update={
            "dev": True,
            "constrained_sampling": True,
            "temperature": args.temperature,
            "top_p": args.top_p,
        }
    )
    clock = time.monotonic()
    engine = await asyncio.to_thread(SpeechEngine.start, settings)
    print(f"engine started in {time.monotonic() - clock:.1f} s", flush=True)
    pool = voices(dev)
    try:
        clock = time.monotonic()
        report: dict = {"quality": await quality(engine, pool, args)}
        report["quality_seconds"] = round(time.monotonic() - clock, 1)
        report["processor_ms_per_step"] = {
            str(b): round(processor_step_ms(b), 3) for b in (1, args.batch, 64)
        }
        report["cost"] = [await cost(engine, pool, args.temperature, args.top_p, args)]
        if not args.hot_only:
            report["cost"].append(
                await cost(engine, pool, args.serving_temperature, args.serving_top_p, args)
            )
    finally:
        engine.shutdown()
        engine.llm.shutdown = lambda *a, **k: None
    report.update(batch=args.batch, tokens=args.tokens, repeats=args.repeats)
    return report


def table(report: dict) -> str:
    lines = [
        "| sampling | requests | frames | malformed | stray tokens | malformed / 1000 frames "
        "| stray / 1000 frames |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, t in report["quality"].items():
        lines.append(
            f"| {mode} | {t['requests']} | {t['frames']} | {t['malformed_frames']} | "
            f"{t['stray_tokens']} | {t['malformed_per_1000_frames']} | "
            f"{t['stray_per_1000_frames']} |"
        )
    lines += [
        "",
        "| sampler | constrained tok/s | unconstrained tok/s | paired ratio | cost |",
        "|---|---|---|---|---|",
    ]
    for c in report["cost"]:
        lines.append(
            f"| T {c['temperature']}, top-p {c['top_p']} | {c['constrained_tokens_per_s']} | "
            f"{c['unconstrained_tokens_per_s']} | {c['median_paired_ratio']} | "
            f"{c['cost_percent']} % |"
        )
    lines.append("")
    lines.append(
        "FrameConstraint.apply alone, ms per step by batch: "
        + ", ".join(f"{b}: {ms}" for b, ms in report["processor_ms_per_step"].items())
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=5000, help="constrained frames to reach")
    parser.add_argument(
        "--baseline-frames", type=int, default=2000, help="unconstrained frames to reach"
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.5)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--serving-temperature", type=float, default=0.6)
    parser.add_argument("--serving-top-p", type=float, default=0.8)
    parser.add_argument(
        "--hot-only", action="store_true", help="measure the cost at --temperature only"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
