"""GPU capacity benchmark: SNAC 24 kHz batched decode and Orpheus-3B decode steps with LoRA voices.

Runs on one CUDA GPU with torch, transformers, peft, snac and numpy only (no vLLM), on random
weights at the real sizes, so nothing is downloaded. Two parts, each time-boxed:

1. SNAC decode through the project's own ``SnacCodec.decode_batch``: windows of K new frames plus
   3 left-context and 2 lookahead frames (K = 16: the steady state; K = 1: the worst case), at
   batch 1, 2, 4, ..., 256, as served (small calls padded and replayed from CUDA graphs captured
   up front) and, on a GPU, eagerly at each call's own shape. Real-time streams =
   B * K * 85.33 ms / (time of one call). Before that, a check: graph replays against eager
   decodes of a noise-free SNAC, and what capturing and first calls cost.
2. Decode steps of a Llama-3.2-3B-shaped model (Orpheus' vocabulary, bf16) over a KV cache of
   ``--context`` tokens per sequence, at batch 16 .. 256: the base model alone; PEFT LoRA
   (rank 16, all projections) with 1, 16 and 64 adapters mixed in one batch via
   ``adapter_names`` (eager: an upper bound on LoRA cost, vLLM uses Punica/SGMV kernels); and a
   grouped-GEMM LoRA stand-in for SGMV (rows sorted by adapter, two ``bmm`` per projection).
   Base and grouped steps are timed eagerly and replayed from a CUDA graph (as vLLM runs them):
   eager HF steps are bound by Python and kernel launches, not by the GPU. One stream needs
   82.03 audio tokens/s, so a batch of B is real time when its step takes at most 12.19 ms.

0. Before both (``--sampler-only`` runs just this): the constrained sampler's cost at the real
   vocabulary, ``frame_constraint.keep_frame_positions`` on float32 logits [B, 156940] (what
   vLLM's sampler sees) at B = 16 .. 256, against a top-p sampling step of the same logits
   (temperature, softmax, sort, cumulative sum, multinomial: what the serving sampler does);
   and the KV cache's reads of one decode step at the real sizes (28 layers, 8 KV heads of 128,
   ``--context`` tokens), bf16 against FP8 e4m3 (``VOICEHOST_KV_CACHE_DTYPE=auto`` on >= 8.9):
   attention of one query token per sequence over K/V stored in each dtype (the FP8 rows
   convert to bf16 first, so they bound FP8 attention's cost from above: fused kernels read
   the FP8 bytes directly) and a plain read of the stored bytes; plus the KV bytes per token
   and the streams each dtype fits in 10 GiB.

``--budget-s`` is wall time from the start: part 1 gets the first 30 %, part 2 the rest; a point
predicted to end past its part's time is skipped (the table says so), as is every larger batch
of a series whose point failed (out of memory, say). The table goes to stdout at the end, then
one JSON line with every figure (the last line); progress goes to stderr.

    python scripts/gpu_bench.py [--budget-s 420] [--context 512] [--no-graphs] [--snac-only]
                                [--sampler-only] [--json OUT]
    python scripts/gpu_bench.py --smoke    # CPU, tiny sizes: a test of the script itself
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from voicehost.model import orpheus
from voicehost.model.codec import (
    DEFAULT_LOOKAHEAD_FRAMES,
    LEFT_CONTEXT_FRAMES,
    SnacCodec,
    Span,
    remove_noise,
)
from voicehost.model.frame_constraint import keep_frame_positions, next_positions

TOKENS_PER_STREAM_S = orpheus.AUDIO_TOKENS_PER_SECOND  # 82.03
REALTIME_STEP_S = 1 / TOKENS_PER_STREAM_S  # 12.19 ms
CONTEXT_FRAMES = LEFT_CONTEXT_FRAMES + DEFAULT_LOOKAHEAD_FRAMES
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SNAC_SHARE = 0.3  # of the budget, for part 1


@dataclass(frozen=True)
class Scale:
    """Sizes and repeat counts of one run."""

    device: torch.device
    snac_decoder_dim: int
    snac_batches: tuple[int, ...]
    chunk_frames: tuple[int, ...]
    llama: dict[str, int]
    llm_batches: tuple[int, ...]
    adapter_counts: tuple[int, ...]
    lora_rank: int = 16
    lora_alpha: int = 32
    warmup: int = 2
    repeats: int = 5
    graph_repeats: int = 10
    max_point_s: float = 6.0  # stop repeating a point after this long (at least 2 samples)
    strict: bool = False  # raise on a failed point instead of noting it and skipping larger ones


FULL_LLAMA = {
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
}
SMOKE_LLAMA = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def full_scale() -> Scale:
    return Scale(
        device=torch.device("cuda"),
        snac_decoder_dim=1024,
        snac_batches=tuple(2**i for i in range(9)),
        chunk_frames=(16, 1),
        llama=FULL_LLAMA,
        llm_batches=(16, 32, 64, 128, 256),
        adapter_counts=(1, 16, 64),
    )


def smoke_scale() -> Scale:
    return Scale(
        device=torch.device("cpu"),
        snac_decoder_dim=64,
        snac_batches=(1, 2, 4),
        chunk_frames=(16, 1),
        llama=SMOKE_LLAMA,
        llm_batches=(1, 2, 4),
        adapter_counts=(1, 2),
        warmup=1,
        repeats=2,
        graph_repeats=2,
        max_point_s=2.0,
        strict=True,
    )


@dataclass
class Row:
    """One line of the table: a measured point, a skipped one, or a summary."""

    part: str
    config: str
    batch: int | None = None
    adapters: int | None = None
    ms: float | None = None
    throughput: float | None = None
    unit: str = ""
    streams: float | None = None
    note: str = ""


@dataclass
class Deadline:
    """Wall-clock end of a part; a point runs only if it is predicted to end in time."""

    at: float

    def allows(self, predicted_s: float) -> bool:
        return time.monotonic() + predicted_s <= self.at


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        progress(" ".join(f"{k}={v}" for k, v in dataclasses.asdict(row).items() if v))


def skip_note(deadline: Deadline, predicted_s: float, failed: bool) -> str | None:
    """Why the next point of a series is skipped, or ``None`` to run it."""
    if failed:
        return "skipped: a smaller batch failed"
    return None if deadline.allows(predicted_s) else "skipped: budget"


def failure_note(exc: Exception, scale: Scale) -> str:
    """The note for a point that raised (re-raised in strict runs: the smoke test)."""
    if scale.strict:
        raise exc
    progress(f"point failed: {type(exc).__name__}: {exc}")
    free_memory(scale.device)
    return f"failed: {type(exc).__name__}: {str(exc)[:80]}"


def progress(message: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], device: torch.device, scale: Scale, repeats: int
) -> float:
    """Median wall time of ``fn`` after warm-up, each call synchronised on both ends."""
    for _ in range(scale.warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 2 and time.perf_counter() - started > scale.max_point_s:
            break
    return statistics.median(samples)


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- Part 1: SNAC ---------------------------------------------------------------------------


def build_snac(decoder_dim: int, device: torch.device) -> torch.nn.Module:
    """SNAC 24 kHz (the real config but ``decoder_dim``), random weights."""
    from snac import SNAC

    torch.manual_seed(0)
    model = SNAC(**{**orpheus.SNAC_24KHZ_CONFIG, "decoder_dim": decoder_dim})
    return model.to(device).eval()


def random_windows(rng: np.random.Generator, batch: int, chunk: int) -> list[Span]:
    """``batch`` steady-state windows: 3 frames of left context, ``chunk`` new, 2 of lookahead."""
    frames = chunk + CONTEXT_FRAMES
    codes = rng.integers(0, orpheus.CODEBOOK_SIZE, size=(batch, frames, 7)).tolist()
    return [
        Span(
            tuple(orpheus.Frame.from_codes(c[:1], c[1:3], c[3:]) for c in window),
            LEFT_CONTEXT_FRAMES,
            LEFT_CONTEXT_FRAMES + chunk,
        )
        for window in codes
    ]


def check_graphs(scale: Scale, report: Report) -> None:
    """Bucketed calls (CUDA graphs on a GPU) against plain eager calls of the same noise-free
    SNAC: the largest difference in samples, and what capturing a new shape costs."""
    model = build_snac(scale.snac_decoder_dim, scale.device)
    remove_noise(model)
    bucketed = SnacCodec(model, scale.device, buckets=True)
    plain = SnacCodec(model, scale.device, buckets=False)
    rng = np.random.default_rng(1)
    worst, first_ms, again_ms, eager_ms = 0.0, [], [], []
    try:
        synchronize(scale.device)
        t0 = time.perf_counter()
        captured = bucketed.capture_graphs()
        synchronize(scale.device)
        report.notes.append(
            f"snac: capture_graphs() captured {captured} shapes in {time.perf_counter() - t0:.1f} s"
        )
        for batch, chunk in ((1, 1), (3, 16), (8, 16), (37, 1), (100, 16)):
            windows = random_windows(rng, batch, chunk)
            for timings in (first_ms, again_ms):  # the first call captures, the second replays
                synchronize(scale.device)
                t0 = time.perf_counter()
                got = bucketed.decode_batch(windows)
                synchronize(scale.device)
                timings.append(1e3 * (time.perf_counter() - t0))
            plain.decode_batch(windows)  # warm-up: cuDNN picks its algorithms
            synchronize(scale.device)
            t0 = time.perf_counter()
            want = plain.decode_batch(windows)
            synchronize(scale.device)
            eager_ms.append(1e3 * (time.perf_counter() - t0))
            worst = max(
                worst, *(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
            )
        graphs = bucketed.captured_graphs
        report.notes.append(
            f"snac bucketed/graph calls vs eager: max |diff| {worst:.2e} over 5 shapes;"
            f" {graphs} graphs in all; first call per shape {statistics.median(first_ms):.1f} ms"
            f" (max {max(first_ms):.1f}); second call per shape (B,K = 1,1 3,16 8,16 37,1 100,16):"
            f" bucketed {' '.join(f'{t:.1f}' for t in again_ms)} ms,"
            f" eager {' '.join(f'{t:.1f}' for t in eager_ms)} ms"
        )
    finally:
        bucketed.close()
        plain.close()
        del model
        free_memory(scale.device)


def bench_snac(scale: Scale, deadline: Deadline, report: Report) -> None:
    """The serving codec (buckets and graphs on a GPU, graphs captured up front), then on a GPU
    the same calls eagerly at their own shapes."""
    model = build_snac(scale.snac_decoder_dim, scale.device)
    modes = [("", True), (" eager", False)] if scale.device.type == "cuda" else [("", None)]
    try:
        for label, buckets in modes:
            codec = SnacCodec(model, scale.device, buckets=buckets)
            codec.capture_graphs()
            rng = np.random.default_rng(0)
            try:
                for chunk in scale.chunk_frames:
                    bench_snac_series(codec, chunk, label, rng, scale, deadline, report)
            finally:
                codec.close()
    finally:
        del model
        free_memory(scale.device)


def bench_snac_series(
    codec: SnacCodec,
    chunk: int,
    label: str,
    rng: np.random.Generator,
    scale: Scale,
    deadline: Deadline,
    report: Report,
) -> None:
    window = chunk + CONTEXT_FRAMES
    config = f"K={chunk} ({window}-frame windows){label}"
    last_s, failed = 0.0, False
    for batch in scale.snac_batches:
        if note := skip_note(deadline, 2.5 * last_s, failed):
            report.add(Row("snac", config, batch, note=note))
            continue
        windows = random_windows(rng, batch, chunk)
        started = time.monotonic()
        try:
            with torch.inference_mode():
                seconds = median_seconds(
                    lambda w=windows: codec.decode_batch(w), scale.device, scale, scale.repeats
                )
        except Exception as exc:
            failed = True
            report.add(Row("snac", config, batch, note=failure_note(exc, scale)))
            continue
        last_s = time.monotonic() - started
        audio_s = batch * chunk * orpheus.FRAME_SECONDS
        rate = audio_s / seconds
        report.add(Row("snac", config, batch, None, 1e3 * seconds, rate, "audio s/s", rate))


# --- Part 2: LLM decode steps ---------------------------------------------------------------


def build_llama(scale: Scale) -> LlamaForCausalLM:
    """A Llama-3.2-3B-shaped model with Orpheus' vocabulary: random bf16 weights on the device."""
    config = LlamaConfig(
        **scale.llama,
        vocab_size=orpheus.VOCAB_SIZE,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    with default_dtype(torch.bfloat16), scale.device:
        model = LlamaForCausalLM(config)
    return model.to(scale.device, torch.bfloat16).eval()


def head_dim(config: LlamaConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def random_cache(model: LlamaForCausalLM, batch: int, context: int) -> StaticCache:
    """A static KV cache of ``context`` random tokens per sequence and room for one more."""
    config, device = model.config, model.device
    try:  # transformers >= 4.56: lazily allocated on the first update
        cache = StaticCache(config=config, max_cache_len=context + 1)
    except TypeError:
        cache = StaticCache(
            config=config,
            max_batch_size=batch,
            max_cache_len=context + 1,
            device=device,
            dtype=torch.bfloat16,
        )
    shape = (batch, config.num_key_value_heads, context, head_dim(config))
    positions = torch.arange(context, device=device)
    for layer in range(config.num_hidden_layers):
        keys = torch.randn(shape, device=device, dtype=torch.bfloat16)
        cache.update(keys, torch.randn_like(keys), layer, {"cache_position": positions})
    return cache


def rewind(cache: StaticCache, context: int) -> None:
    """Forget the token the last step wrote (newer transformers count cached tokens on device)."""
    for layer in getattr(cache, "layers", ()):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.fill_(context)


def decode_step(
    model: torch.nn.Module,
    cache: StaticCache,
    batch: int,
    context: int,
    device: torch.device,
    **forward_kwargs: object,
) -> Callable[[], object]:
    """One new token for each of ``batch`` sequences, always at position ``context``."""
    ids = torch.randint(orpheus.AUDIO_TOKEN_BASE, orpheus.VOCAB_SIZE, (batch, 1), device=device)
    kwargs: dict[str, object] = {
        "input_ids": ids,
        "position_ids": torch.full((batch, 1), context, device=device),
        "past_key_values": cache,
        "use_cache": True,
        **forward_kwargs,
    }
    if "cache_position" in inspect.signature(transformers.LlamaModel.forward).parameters:
        kwargs["cache_position"] = torch.tensor([context], device=device)

    def step() -> object:
        rewind(cache, context)
        return model(**kwargs)

    return step


def graph_seconds(step: Callable[[], object], device: torch.device, scale: Scale) -> float:
    """Median time of a CUDA-graph replay of ``step`` (captured after a side-stream warm-up)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    try:
        return median_seconds(graph.replay, device, scale, scale.graph_repeats)
    finally:
        del output, graph


@dataclass
class LlmBench:
    """Times decode steps of one model variant over the batches of the run."""

    model: torch.nn.Module
    base: LlamaForCausalLM
    scale: Scale
    context: int
    deadline: Deadline
    report: Report
    graphs: bool

    def series(
        self,
        variant: str,
        adapters: int | None,
        kwargs_for: Callable[[int], dict[str, object]],
        graph: bool,
        before: Callable[[int], None] = lambda batch: None,
    ) -> None:
        last_s, failed = 0.0, False
        for batch in self.scale.llm_batches:
            distinct = None if adapters is None else min(adapters, batch)
            modes = ["eager", "graph"] if graph and self.graphs else ["eager"]
            if note := skip_note(self.deadline, 2.5 * last_s, failed):
                for mode in modes:
                    self.report.add(Row("llm", f"{variant} {mode}", batch, distinct, note=note))
                continue
            started = time.monotonic()
            try:
                before(batch)
                self.point(variant, modes, batch, distinct, kwargs_for(batch))
            except Exception as exc:
                failed = True
                note = failure_note(exc, self.scale)
                self.report.add(Row("llm", f"{variant} {modes[0]}", batch, distinct, note=note))
            last_s = time.monotonic() - started

    def point(
        self,
        variant: str,
        modes: Sequence[str],
        batch: int,
        distinct: int | None,
        kwargs: dict[str, object],
    ) -> None:
        device = self.scale.device
        with torch.inference_mode():
            cache = random_cache(self.base, batch, self.context)
            step = decode_step(self.model, cache, batch, self.context, device, **kwargs)
            try:
                for mode in modes:
                    seconds = self.time_mode(mode, step)
                    if seconds is not None:
                        self.report.add(step_row(f"{variant} {mode}", batch, distinct, seconds))
            finally:
                del step, cache
                free_memory(device)

    def time_mode(self, mode: str, step: Callable[[], object]) -> float | None:
        device = self.scale.device
        if mode == "eager":
            return median_seconds(step, device, self.scale, self.scale.repeats)
        try:
            return graph_seconds(step, device, self.scale)
        except Exception as exc:  # no graph numbers then; the eager ones stand
            self.graphs = False
            message = f"CUDA graph capture failed, graphs disabled: {type(exc).__name__}: {exc}"
            self.report.notes.append(message[:300])
            progress(message)
            return None


def step_row(config: str, batch: int, adapters: int | None, seconds: float) -> Row:
    tokens_s = batch / seconds
    note = "real time" if seconds <= REALTIME_STEP_S else ""
    return Row(
        "llm",
        config,
        batch,
        adapters,
        1e3 * seconds,
        tokens_s,
        "tok/s",
        tokens_s / TOKENS_PER_STREAM_S,
        note,
    )


def bench_llm(scale: Scale, context: int, deadline: Deadline, graphs: bool, report: Report) -> None:
    progress("building the Llama-3B-shaped model")
    model = build_llama(scale)
    bench = LlmBench(model, model, scale, context, deadline, report, graphs)
    bench.series("base", None, lambda batch: {}, graph=True)
    peft_model = bench_peft(bench, model)
    model = peft_model.unload()
    bench.model = model
    del peft_model
    free_memory(scale.device)
    bench_grouped(bench, model)


def adapter_names(adapters: int, batch: int) -> list[str]:
    """Adapter of each row: ``min(adapters, batch)`` voices in equal, contiguous groups."""
    groups = min(adapters, batch)
    return [f"voice{row * groups // batch}" for row in range(batch)]


def bench_peft(bench: LlmBench, model: LlamaForCausalLM) -> PeftModel:
    """PEFT mixed-adapter batches; adapters are added as the series go, so that each series runs
    with as many adapters loaded as it mixes (PEFT's per-step overhead grows with them)."""
    scale = bench.scale
    config = LoraConfig(
        r=scale.lora_rank,
        lora_alpha=scale.lora_alpha,
        target_modules=list(LORA_TARGETS),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,  # random A and B
    )
    peft_model = get_peft_model(model, config, "voice0", autocast_adapter_dtype=False).eval()
    bench.model = peft_model
    loaded = 1
    for adapters in sorted(scale.adapter_counts):
        if bench.deadline.allows(0) and loaded < adapters:
            started = time.monotonic()
            for index in range(loaded, adapters):
                peft_model.add_adapter(f"voice{index}", config, autocast_adapter_dtype=False)
            loaded = adapters
            peft_model.eval()
            spent = time.monotonic() - started
            bench.report.notes.append(f"peft: adding adapters up to {adapters} took {spent:.0f} s.")
            progress(bench.report.notes[-1])
        bench.series(
            f"peft x{adapters}",
            adapters,
            lambda batch, n=adapters: {"adapter_names": adapter_names(n, batch)},
            graph=False,
        )
    return peft_model


class GroupedLoRA(torch.nn.Module):
    """``base(x)`` plus LoRA deltas for rows sorted by adapter in equal contiguous groups: two
    batched GEMMs per projection, a stand-in for vLLM's Punica/SGMV kernels."""

    def __init__(self, base: torch.nn.Linear, adapters: int, rank: int, scaling: float) -> None:
        super().__init__()
        self.base = base
        weight = base.weight
        shape_a = (adapters, base.in_features, rank)
        shape_b = (adapters, rank, base.out_features)
        options = {"device": weight.device, "dtype": weight.dtype}
        self.register_buffer("a", torch.randn(shape_a, **options) / base.in_features**0.5)
        self.register_buffer("b", torch.randn(shape_b, **options) / rank**0.5)
        self.scaling = scaling
        self.groups = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = x.reshape(self.groups, -1, x.shape[-1])
        delta = torch.bmm(torch.bmm(rows, self.a[: self.groups]), self.b[: self.groups])
        return out + self.scaling * delta.reshape(out.shape)


@contextmanager
def grouped_lora(model: torch.nn.Module, scale: Scale) -> Iterator[list[GroupedLoRA]]:
    """Wrap every LoRA target projection of ``model`` in a ``GroupedLoRA``; unwrap on exit."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if name in LORA_TARGETS and isinstance(child, torch.nn.Linear)
    ]
    adapters, scaling = max(scale.adapter_counts), scale.lora_alpha / scale.lora_rank
    wrappers = [GroupedLoRA(child, adapters, scale.lora_rank, scaling) for _, _, child in targets]
    for (parent, name, _), wrapper in zip(targets, wrappers, strict=True):
        setattr(parent, name, wrapper)
    try:
        yield wrappers
    finally:
        for parent, name, child in targets:
            setattr(parent, name, child)


def bench_grouped(bench: LlmBench, model: LlamaForCausalLM) -> None:
    progress(
        f"wrapping the projections in grouped LoRA ({max(bench.scale.adapter_counts)} adapters)"
    )
    with grouped_lora(model, bench.scale) as wrappers:
        bench.model = model

        def set_groups(batch: int, adapters: int) -> None:
            for wrapper in wrappers:
                wrapper.groups = min(adapters, batch)

        for adapters in bench.scale.adapter_counts:
            bench.series(
                f"grouped x{adapters}",
                adapters,
                lambda batch: {},
                graph=True,
                before=lambda batch, n=adapters: set_groups(batch, n),
            )


# --- Summary and output ---------------------------------------------------------------------


def summary_rows(rows: Sequence[Row]) -> list[Row]:
    """Per SNAC series, the most streams; per LLM variant, the largest real-time batch."""
    summary: list[Row] = []
    for config in dict.fromkeys(row.config for row in rows if row.part == "snac"):
        measured = [r for r in rows if r.config == config and r.streams is not None]
        if measured:
            best = max(measured, key=lambda r: r.streams or 0.0)
            note = f"most real-time streams (at B={best.batch})"
            summary.append(
                Row("summary", f"snac {config}", best.batch, streams=best.streams, note=note)
            )
    for config in dict.fromkeys(row.config for row in rows if row.part == "llm"):
        measured = [r for r in rows if r.config == config and r.ms is not None]
        realtime = [r for r in measured if r.ms is not None and r.ms <= 1e3 * REALTIME_STEP_S]
        best = max(realtime, key=lambda r: r.batch or 0) if realtime else None
        largest = max((r.batch or 0 for r in measured), default=0)
        note = f"real-time streams: largest B (measured to {largest}) with step <= 12.19 ms"
        summary.append(
            Row(
                "summary",
                f"llm {config}",
                best.batch if best else 0,
                streams=best.batch if best else 0,
                note=note,
            )
        )
    return summary


def fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:,.{digits}f}"


def render_table(rows: Sequence[Row], notes: Sequence[str]) -> str:
    header = ("part", "config", "B", "adapters", "ms/call", "throughput", "streams", "note")
    cells = [
        (
            row.part,
            row.config,
            fmt(row.batch),
            fmt(row.adapters),
            fmt(row.ms, 2),
            f"{fmt(row.throughput)} {row.unit}".strip() if row.throughput is not None else "-",
            fmt(row.streams),
            row.note,
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    rule = "  ".join("-" * width for width in widths)
    lines = [table_line(header, widths), rule]
    previous = None
    for row, line in zip(rows, cells, strict=True):
        if previous is not None and row.part != previous:
            lines.append(rule)
        previous = row.part
        lines.append(table_line(line, widths))
    return "\n".join([*lines, rule, *notes])


def table_line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(text.ljust(width) for text, width in zip(cells, widths, strict=True)).rstrip()


def rounded(row: Row) -> dict[str, object]:
    return {
        k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(row).items()
    }


def standard_notes(context: int) -> list[str]:
    return [
        "snac: one SnacCodec.decode_batch call of B windows of K new + 3 left + 2 lookahead frames"
        " (fp32, device->host copy included); streams = B * K * 85.33 ms / call time.",
        f"llm: one decode step (1 new token per sequence over a {context}-token KV cache, bf16,"
        " logits included, no sampling); streams column = tok/s / 82.03, the ceiling at that B;"
        " 'real time' = step <= 12.19 ms.",
        "llm: 'peft' = PEFT mixed-adapter batch (adapter_names), unfused and eager: an upper bound"
        " on LoRA cost (vLLM uses Punica/SGMV kernels and CUDA graphs). 'grouped' = LoRA as two"
        " bmm per projection over rows sorted by adapter (an SGMV stand-in, not vLLM's kernels).",
        "llm: 'eager' = HF transformers forward (Python/launch bound); 'graph' = the same step"
        " replayed from a CUDA graph. adapters = distinct adapters in the batch (min(n, B)).",
    ]


def meta(args: argparse.Namespace, scale: Scale, started: float) -> dict[str, object]:
    device = scale.device
    return {
        "smoke": args.smoke,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "context_tokens": args.context,
        "budget_s": args.budget_s,
        "elapsed_s": round(time.monotonic() - started, 1),
        "realtime_step_ms": round(1e3 * REALTIME_STEP_S, 2),
        "llama": scale.llama,
        "snac_decoder_dim": scale.snac_decoder_dim,
        "peak_gpu_memory_gib": (
            round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
            if device.type == "cuda"
            else None
        ),
    }


# --- Part 0: the constrained sampler and FP8 KV reads ---------------------------------------

KV_BUDGET_BYTES = 10 * 2**30  # a KV cache size to compare the dtypes by


def top_p_step(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A top-p (0.8) sampling step at temperature 0.6 over full rows, as the serving sampler."""
    probs = torch.softmax(logits / 0.6, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cut = sorted_probs.cumsum(dim=-1) - sorted_probs > 0.8
    sorted_probs.masked_fill_(cut, 0.0)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return order.gather(1, choice)


def sampler_point(scale: Scale, batch: int) -> tuple[float, float]:
    """Seconds of the constrained mask and of a top-p step over [batch, 156940] logits."""
    device = scale.device
    codes = torch.arange(orpheus.CODEBOOK_SIZE, device=device)
    logits = torch.randn(batch, orpheus.VOCAB_SIZE, device=device)
    source = logits.clone()
    first, stop = next_positions(np.arange(batch, dtype=np.int64) * 3)  # positions spread
    first_t, stop_t = torch.from_numpy(first).to(device), torch.from_numpy(stop).to(device)
    generator = torch.Generator(device=device).manual_seed(0)

    def constrain() -> None:
        logits.copy_(source)
        keep_frame_positions(logits, first_t, stop_t, codes)

    mask_s = median_seconds(constrain, device, scale, scale.graph_repeats)
    mask_s -= median_seconds(lambda: logits.copy_(source), device, scale, scale.graph_repeats)
    sample_s = median_seconds(
        lambda: top_p_step(source, generator), device, scale, scale.graph_repeats
    )
    return max(mask_s, 0.0), sample_s


def bench_sampler(scale: Scale, report: Report) -> None:
    for batch in scale.llm_batches:
        mask_s, sample_s = sampler_point(scale, batch)
        report.add(
            Row(
                "sampler",
                "constrain",
                batch,
                ms=1e3 * mask_s,
                throughput=100 * mask_s / sample_s,
                unit="% of top-p",
            )
        )
        report.add(Row("sampler", "top-p step", batch, ms=1e3 * sample_s))
        free_memory(scale.device)


def kv_bytes_per_token(llama: dict[str, int], bytes_per_value: int) -> int:
    heads = llama["num_key_value_heads"]
    head_size = llama["hidden_size"] // llama["num_attention_heads"]
    return 2 * llama["num_hidden_layers"] * heads * head_size * bytes_per_value


def kv_point(scale: Scale, batch: int, context: int) -> dict[str, tuple[float, int]]:
    """Per way of reading: (seconds of one layer, bytes it holds) at ``batch`` x ``context``."""
    device, llama = scale.device, scale.llama
    heads, kv_heads = llama["num_attention_heads"], llama["num_key_value_heads"]
    head_size = llama["hidden_size"] // heads
    shape = (batch, kv_heads, context, head_size)
    query = torch.randn(batch, heads, 1, head_size, device=device, dtype=torch.bfloat16)
    keys = torch.randn(shape, device=device, dtype=torch.bfloat16)
    values = torch.randn(shape, device=device, dtype=torch.bfloat16)
    keys8, values8 = keys.to(torch.float8_e4m3fn), values.to(torch.float8_e4m3fn)
    bf16_bytes, fp8_bytes = 4 * keys.numel(), 2 * keys.numel()

    def attend(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(query, k, v, enable_gqa=True)

    def attend_fp8() -> torch.Tensor:
        return attend(keys8.to(torch.bfloat16), values8.to(torch.bfloat16))

    def read_bf16() -> tuple[torch.Tensor, torch.Tensor]:
        return keys.view(torch.int16).amax(), values.view(torch.int16).amax()

    def read_fp8() -> tuple[torch.Tensor, torch.Tensor]:
        return keys8.view(torch.int8).amax(), values8.view(torch.int8).amax()

    points = {
        "attention bf16": (lambda: attend(keys, values), bf16_bytes),
        "attention fp8->bf16": (attend_fp8, fp8_bytes),
        "read bf16": (read_bf16, bf16_bytes),
        "read fp8": (read_fp8, fp8_bytes),
    }
    return {
        name: (median_seconds(step, device, scale, scale.graph_repeats), size)
        for name, (step, size) in points.items()
    }


def bench_kv(scale: Scale, context: int, report: Report) -> None:
    """One decode step's reads of the KV cache: one layer timed, times the layers."""
    layers = scale.llama["num_hidden_layers"]
    for dtype, size in (("bf16", 2), ("fp8 e4m3", 1)):
        per_token = kv_bytes_per_token(scale.llama, size)
        report.notes.append(
            f"kv {dtype}: {per_token} bytes per token (all layers, K and V); "
            f"{KV_BUDGET_BYTES // (per_token * context)} streams of {context} tokens in 10 GiB"
        )
    for batch in scale.llm_batches:
        try:
            points = kv_point(scale, batch, context)
        except Exception as exc:  # out of memory at the largest batches, say
            if scale.strict:
                raise
            report.notes.append(f"kv B={batch}: {failure_note(exc, scale)}")
            break
        for name, (seconds, size) in points.items():
            report.add(
                Row(
                    "kv",
                    name,
                    batch,
                    ms=1e3 * layers * seconds,
                    throughput=size / seconds / 1e9,
                    unit="GB/s",
                )
            )
        free_memory(scale.device)


# --- Main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: test the script")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="time box (default 420, smoke 150)"
    )
    parser.add_argument(
        "--context", type=int, default=None, help="KV tokens per sequence (512, smoke 32)"
    )
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph timings")
    parser.add_argument("--snac-only", action="store_true", help="part 1 only (SNAC decode)")
    parser.add_argument(
        "--sampler-only", action="store_true", help="part 0 only (constrained sampler, FP8 KV)"
    )
    parser.add_argument("--json", type=Path, help="also write the JSON object here")
    args = parser.parse_args(argv)
    args.budget_s = args.budget_s or (150.0 if args.smoke else 420.0)
    args.context = args.context or (32 if args.smoke else 512)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print(
            "gpu_bench: no CUDA device available; run on a GPU machine or pass --smoke",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    scale = smoke_scale() if args.smoke else full_scale()
    if args.smoke:
        torch.set_num_threads(1)
    report = Report()
    graphs = scale.device.type == "cuda" and not args.no_graphs
    if not graphs:
        report.notes.append(
            "CUDA graphs: not run (" + ("--no-graphs" if args.no_graphs else "no CUDA") + ")."
        )
    progress("part 0: the constrained sampler and FP8 KV reads")
    bench_sampler(scale, report)
    bench_kv(scale, args.context, report)
    if args.sampler_only:
        rows = report.rows
        result = {
            "meta": meta(args, scale, started),
            "rows": [rounded(r) for r in rows],
            "notes": report.notes,
        }
        print(render_table(rows, report.notes))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
        return 0
    progress("part 1: SNAC batched decode")
    try:
        check_graphs(scale, report)
    except Exception as exc:
        report.notes.append(f"snac graph check: {failure_note(exc, scale)}")
    bench_snac(scale, Deadline(started + SNAC_SHARE * args.budget_s), report)
    if not args.snac_only:
        progress("part 2: LLM decode steps")
        bench_llm(scale, args.context, Deadline(started + args.budget_s), graphs, report)
    rows = [*report.rows, *summary_rows(report.rows)]
    notes = [*standard_notes(args.context), *report.notes]
    result = {
        "meta": meta(args, scale, started),
        "rows": [rounded(row) for row in rows],
        "notes": notes,
    }
    print(render_table(rows, notes))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
