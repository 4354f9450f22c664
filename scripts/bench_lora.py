"""Multi-LoRA cost on the engine: generated tokens/s of one batch with 1, 4 and 16 distinct
adapters in it, against the base model alone, at the same batch size.

Builds (once, cached in ``--work-dir``) 16 rank-16 dev voice adapters with distinct seeds, starts
one ``SpeechEngine`` in-process on the dev model (``max_loras`` and ``max_cpu_loras`` >= 16), and
for a fixed batch of ``--batch`` concurrent requests that each generate exactly ``--tokens``
tokens (``ignore_eos``) measures:

- ``base``: every request on a built-in voice, no LoRA (same engine: a batch in which no request
  uses an adapter skips the LoRA projections, but not vLLM's LoRA logits step, see below);
- ``1``: every request on the same adapter;
- ``4``: 4 distinct adapters, ``batch / 4`` requests each;
- ``16``: 16 distinct adapters, one request each at the default batch of 16.

Each configuration is warmed up first with a short batch (the first use of an adapter loads it),
then the measured runs are interleaved (base, 1, 4, 16, base, 1, ...) ``--repeats`` times so that
machine noise hits all alike. Every request has its own prompt (no prefix-cache hits) and all
prompts have the same length, so the configurations differ only in the LoRAs applied.

Reported per configuration: the median generated tokens/s (all tokens of the batch over its wall
time, prefill included), the median decode-only tokens/s (after the batch's last first token) and
the ratio to ``base``. Then, unless ``--no-plain-engine``, the engine is restarted with LoRA
disabled (every other setting the same) and the base model measured there too (``no-lora``):
what enabling LoRA costs every request, adapter or not (on CPU, for one, vLLM turns
torch.compile off when LoRA is enabled).

The engine wraps only the projections a voice adapter may target (``engine_args``, as when
serving). ``--all-modules`` starts it with vLLM's own default instead, which also wraps
``lm_head``: its LoRA logits step then runs at every step over the whole 157k-token vocabulary,
for base requests too.

``--sampling greedy`` (the default) samples greedily with no repetition penalty, so that the
model's forward pass, which LoRA changes, dominates each step; ``--sampling serving`` uses the
serving defaults (temperature, top-p, repetition penalty), whose top-p sort over Orpheus'
157k-token vocabulary outweighs the tiny dev model's forward pass on CPU.

Prints a table and, as the last line, one JSON object::

    {"batch": B, "tokens_per_request": n, "tokens_per_s": {"base": x, "1": x, "4": x, "16": x},
     "ratio_to_base": {"1": r, "4": r, "16": r}, ...}

Usage (engine settings from ``VOICEHOST_*`` variables, as when serving; the dev model is used)::

    python scripts/bench_lora.py [--batch 16] [--tokens 112] [--repeats 3] [--adapters 1,4,16]
        [--sampling greedy|serving] [--all-modules] [--no-plain-engine] [--work-dir DIR]
        [--json OUT]
    python scripts/bench_lora.py --batch 4 --tokens 56 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths, build_voice_adapter, ensure_dev_model
from voicehost.model.engine import SpeechEngine, engine_args, resolve_max_loras
from voicehost.model.served import served_languages
from voicehost.voices.validation import AdapterRules, ModelShape, validate_adapter
from voicehost.voices.voice import Voice

ADAPTER_SEED = 5000  # adapter i is built with seed ADAPTER_SEED + i
CACHE_VERSION = 1  # bump when the adapters built here change
WARMUP_TOKENS = 16  # a warm-up batch loads its adapters and runs prefill and decode steps
TEXT = "The quick brown fox jumps over the lazy dog while the sun slowly sets."


@dataclass(frozen=True, slots=True)
class Run:
    """One measured batch."""

    wall_s: float  # from submitting the batch to its last token
    first_token_s: float  # from submitting the batch to the last request's first token
    requests: int
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after each request's first one, over the time after the last first token."""
        return (self.tokens - self.requests) / max(self.wall_s - self.first_token_s, 1e-9)


def _default_work_dir() -> Path:
    return Settings().dev_dir.parent / "bench-lora"


def ensure_adapters(work_dir: Path, dev: DevModelPaths, count: int) -> list[Path]:
    """``count`` dev adapters ``bench-00``... under ``work_dir/adapters``, built once per dev
    model (adapter i from seed ``ADAPTER_SEED + i``); all rebuilt when the dev model changes."""
    root = work_dir / "adapters"
    stamp_path = work_dir / "stamp.json"
    stamp = {"version": CACHE_VERSION, "seed": ADAPTER_SEED, "dev_model": dev.stamp.read_text()}
    if not stamp_path.exists() or json.loads(stamp_path.read_text()) != stamp:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        stamp_path.write_text(json.dumps(stamp))
    folders = []
    for index in range(count):
        folder = root / f"bench-{index:02d}"
        if not folder.is_dir():
            started = time.monotonic()
            staging = root / f".{folder.name}.building"
            shutil.rmtree(staging, ignore_errors=True)
            build_voice_adapter(dev.model, staging, folder.name, ADAPTER_SEED + index)
            staging.rename(folder)
            print(f"built {folder} in {time.monotonic() - started:.1f} s", flush=True)
        folders.append(folder)
    return folders


def plan(adapters: Sequence[Voice], distinct: int, batch: int, base: Voice) -> list[Voice]:
    """The voice of each request: ``base`` for 0, else adapters 0..distinct-1 round-robin."""
    if distinct == 0:
        return [base] * batch
    return [adapters[i % distinct] for i in range(batch)]


class Bench:
    """Runs batches on an engine; every request of every batch gets a prompt of its own."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.batches = 0

    def sampling_params(self, settings: Settings, tokens: int) -> object:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self.args.sampling == "greedy":
            temperature, top_p, penalty = 0.0, 1.0, 1.0
        else:
            temperature, top_p = settings.temperature, settings.top_p
            penalty = settings.repetition_penalty
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            repetition_penalty=penalty,
            max_tokens=tokens,
            ignore_eos=True,  # every request generates exactly ``tokens``
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )

    async def batch(self, engine: SpeechEngine, voices: Sequence[Voice], tokens: int) -> Run:
        """Submit one request per voice at once; each generates exactly ``tokens`` tokens."""
        self.batches += 1

        def prompt(index: int) -> list[int]:
            # Unique to the batch and request (no prefix-cache hits), always the same length.
            text = f"Take {self.batches:06d}, line {index:04d}. {TEXT}"
            return orpheus.encode_prompt(orpheus.plain_text(engine.tokenizer), text, None)

        async def one(index: int, voice: Voice) -> float:
            first: float | None = None
            count = 0
            async for output in engine.llm.generate(
                {"prompt_token_ids": prompt(index)},
                self.sampling_params(engine.settings, tokens),
                f"bench-lora-{uuid.uuid4().hex}",
                lora_request=engine.lora_request(voice),
            ):
                new = len(output.outputs[0].token_ids)
                if new and first is None:
                    first = time.perf_counter() - started
                count += new
            if count != tokens or first is None:
                raise RuntimeError(f"request {index} ({voice.voice_id}) got {count}/{tokens}")
            return first

        started = time.perf_counter()
        firsts = await asyncio.gather(*(one(i, voice) for i, voice in enumerate(voices)))
        wall = time.perf_counter() - started
        return Run(wall, max(firsts), len(voices), len(voices) * tokens)

    async def measure(
        self, engine: SpeechEngine, configs: dict[str, list[Voice]]
    ) -> dict[str, list[Run]]:
        """Warm each configuration up once, then run them interleaved ``repeats`` times."""
        for name, voices in configs.items():
            clock = time.monotonic()
            await self.batch(engine, voices, min(self.args.tokens, WARMUP_TOKENS))
            print(f"warm-up {name}: {time.monotonic() - clock:.1f} s", flush=True)
        runs: dict[str, list[Run]] = {name: [] for name in configs}
        for repeat in range(self.args.repeats):
            for name, voices in configs.items():
                run = await self.batch(engine, voices, self.args.tokens)
                runs[name].append(run)
                print(
                    f"repeat {repeat + 1}/{self.args.repeats} {name:>7}: "
                    f"{run.tokens_per_s:8.1f} tok/s, decode {run.decode_tokens_per_s:8.1f} "
                    f"({run.wall_s:.2f} s, last first token at {run.first_token_s:.2f} s)",
                    flush=True,
                )
        return runs


async def start_engine(settings: Settings, overrides: dict[str, object]) -> SpeechEngine:
    """A ``SpeechEngine`` on the serving engine arguments with ``overrides`` applied."""
    from transformers import AutoTokenizer
    from vllm.v1.engine.async_llm import AsyncLLM

    def build() -> SpeechEngine:
        args = dataclasses.replace(engine_args(settings), **overrides)
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        return SpeechEngine(AsyncLLM.from_engine_args(args), tokenizer, settings)

    clock = time.monotonic()
    starting = asyncio.ensure_future(asyncio.to_thread(build))
    try:
        engine = await asyncio.shield(starting)
    except asyncio.CancelledError:  # let it finish starting, then stop its processes
        stop(await starting)
        raise
    changed = ", ".join(f"{key}={value}" for key, value in overrides.items())
    label = f"engine ({changed})" if changed else "engine"
    print(f"{label} started in {time.monotonic() - clock:.1f} s", flush=True)
    return engine


def stop(engine: SpeechEngine) -> None:
    engine.shutdown()
    # vLLM's AsyncLLM.__del__ shuts it down again, which fails with a traceback when the object
    # lingers until interpreter exit (a frame of its start-up keeps it); it is already down.
    engine.llm.shutdown = lambda *args, **kwargs: None


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def summary(runs: list[Run]) -> dict[str, object]:
    return {
        "tokens_per_s": median([r.tokens_per_s for r in runs]),
        "decode_tokens_per_s": median([r.decode_tokens_per_s for r in runs]),
        "runs_tokens_per_s": [round(r.tokens_per_s, 1) for r in runs],
    }


async def measure_on(
    runner: Bench, settings: Settings, configs: dict[str, list[Voice]], **overrides: object
) -> dict[str, list[Run]]:
    engine = await start_engine(settings, overrides)
    try:
        return await runner.measure(engine, configs)
    finally:
        stop(engine)


async def bench(args: argparse.Namespace) -> dict:
    # A SIGTERM (a timeout, say) cancels the run, so that the engine's processes are shut down.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    started = time.monotonic()
    distincts = sorted(set(args.adapters))
    env = Settings()
    settings = Settings(
        dev=True,
        max_loras=max(resolve_max_loras(env.max_loras, None, 1, 64), *distincts),
        max_cpu_loras=max(env.max_cpu_loras, *distincts),
        max_num_seqs=max(env.max_num_seqs, args.batch),
    )
    dev = await asyncio.to_thread(ensure_dev_model, settings.dev_dir)
    folders = await asyncio.to_thread(ensure_adapters, args.work_dir, dev, max(distincts))
    rules = AdapterRules(
        base_model=settings.served_base_name(),
        max_rank=settings.max_lora_rank,
        shape=ModelShape.from_config(dev.model / "config.json"),
    )
    adapters = [validate_adapter(folder, rules) for folder in folders]
    builtin = next(iter(served_languages(settings).voices))
    base = Voice(voice_id=builtin, name=builtin.title())
    configs = {"base": plan(adapters, 0, args.batch, base)}
    for distinct in distincts:
        configs[str(distinct)] = plan(adapters, distinct, args.batch, base)
    runner = Bench(args)

    targets = {"lora_target_modules": None} if args.all_modules else {}  # None: vLLM's default
    runs = await measure_on(runner, settings, configs, **targets)
    plain: list[Run] = []
    if args.plain_engine:
        only_base = {"no-lora": configs["base"]}
        plain = (await measure_on(runner, settings, only_base, enable_lora=False))["no-lora"]

    tps = {name: median([r.tokens_per_s for r in rs]) for name, rs in runs.items()}
    report: dict[str, object] = {
        "batch": args.batch,
        "tokens_per_request": args.tokens,
        "tokens_per_s": tps,
        "ratio_to_base": {
            name: round(value / tps["base"], 3) for name, value in tps.items() if name != "base"
        },
        "decode_tokens_per_s": {
            name: median([r.decode_tokens_per_s for r in rs]) for name, rs in runs.items()
        },
        "distinct_adapters": {
            name: len({v.voice_id for v in voices if v.adapter_path is not None})
            for name, voices in configs.items()
        },
        "runs_tokens_per_s": {
            name: [round(r.tokens_per_s, 1) for r in rs] for name, rs in runs.items()
        },
        "repeats": args.repeats,
        "sampling": args.sampling,
        "lora_target_modules": "vllm-default" if args.all_modules else "voice",
    }
    if plain:
        no_lora = summary(plain)
        report["no_lora_engine"] = no_lora
        report["ratio_to_no_lora"] = {
            name: round(value / no_lora["tokens_per_s"], 3) for name, value in tps.items()
        }
    report["seconds"] = round(time.monotonic() - started)
    return report


def table(report: dict) -> str:
    tps, decode = report["tokens_per_s"], report["decode_tokens_per_s"]
    plain = report.get("no_lora_engine")
    lines = [
        f"batch {report['batch']}, {report['tokens_per_request']} tokens per request, "
        f"{report['sampling']} sampling, median of {report['repeats']}, "
        f"LoRA target modules: {report['lora_target_modules']}",
        f"{'config':>8} {'adapters':>8} {'tok/s':>9} {'decode':>9} {'x base':>7}"
        + (f" {'x no-lora':>9}" if plain else ""),
    ]
    rows = [
        (name, report["distinct_adapters"][name], value, decode[name])
        for name, value in tps.items()
    ]
    if plain:
        rows.append(("no-lora", "-", plain["tokens_per_s"], plain["decode_tokens_per_s"]))
    for name, distinct, value, decoded in rows:
        line = f"{name:>8} {distinct:>8} {value:>9.1f} {decoded:>9.1f} {value / tps['base']:>7.3f}"
        if plain:
            line += f" {value / plain['tokens_per_s']:>9.3f}"
        lines.append(line)
    if plain:
        lines.append("no-lora: the base model on an engine started with LoRA disabled")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=16, help="concurrent requests per run")
    parser.add_argument("--tokens", type=int, default=112, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per configuration")
    parser.add_argument(
        "--adapters",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 4, 16],
        help="distinct adapters per configuration, comma-separated (default 1,4,16)",
    )
    parser.add_argument(
        "--sampling",
        choices=["greedy", "serving"],
        default="greedy",
        help="greedy (default), or the serving settings' temperature, top-p and penalty",
    )
    parser.add_argument(
        "--all-modules",
        action="store_true",
        help="start the LoRA engine with vLLM's default target modules (lm_head included) "
        "instead of the voice adapters' projections",
    )
    parser.add_argument(
        "--plain-engine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the base model on an engine with LoRA disabled (default: on)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=_default_work_dir(),
        help="where the adapters are built and kept (default: next to the dev model)",
    )
    parser.add_argument("--json", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    if args.batch < 1 or args.tokens < 2 or args.repeats < 1 or min(args.adapters) < 1:
        parser.error("--batch, --repeats and --adapters must be >= 1 and --tokens >= 2")
    if max(args.adapters) > args.batch:
        print(
            f"note: a batch of {args.batch} holds at most {args.batch} distinct adapters",
            file=sys.stderr,
        )
    # vLLM's CPU engine sizes its KV cache from this; set before vLLM is imported.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    try:
        report = asyncio.run(bench(args))
    except asyncio.CancelledError:
        print("stopped by SIGTERM; the engine is shut down", file=sys.stderr)
        return 128 + signal.SIGTERM
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
