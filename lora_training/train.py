"""Train: a PEFT LoRA on Orpheus training sequences, with a plain PyTorch loop.

bf16 on GPU; on CPU fp32 weights with bf16 matrix products where the CPU has them natively
(``cpu_autocast``), else fp32; only the labelled positions reach the output layer
(``token_loss``); every core the process may use on CPU; gradient accumulation; linear warm-up
then cosine decay; a held-out split with its loss after every epoch; a checkpoint after every
epoch to resume from.
LoRA only on the attention and MLP projections (never embeddings or lm_head, which vLLM refuses).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from voicehost.voices.validation import servable_lora_config

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"


REAL_LEARNING_RATE = 2e-4
DEV_LEARNING_RATE = 2e-3  # the tiny random dev model needs a larger step than real weights


def learning_rate_for(dev: bool) -> float:
    return DEV_LEARNING_RATE if dev else REAL_LEARNING_RATE


@dataclass(frozen=True, slots=True)
class TrainSettings:
    epochs: int = 3
    rank: int = 16
    alpha: int = 32
    learning_rate: float = REAL_LEARNING_RATE
    batch_size: int = 2
    grad_accumulation: int = 2
    warmup_fraction: float = 0.05
    eval_fraction: float = 0.1
    weight_decay: float = 0.0
    seed: int = 0


@dataclass
class TrainHistory:
    """Losses as training went: one train loss per optimizer step, one eval loss per epoch."""

    train_loss: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    steps: int = 0
    epochs_done: int = 0


def split(rows: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and held-out row indices; at least one held-out row when there are two or more."""
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    held = max(1, round(rows * fraction)) if rows > 1 else 0
    return order[held:], order[:held]


def batches(
    rows: Sequence[dict[str, list[int]]], indices: Sequence[int], size: int, pad_id: int
) -> list[dict[str, torch.Tensor]]:
    """Right-padded batches; padding is masked from attention and loss."""
    out = []
    for start in range(0, len(indices), size):
        chunk = [rows[i] for i in indices[start : start + size]]
        width = max(len(r["input_ids"]) for r in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, row in enumerate(chunk):
            n = len(row["input_ids"])
            ids[i, :n] = torch.tensor(row["input_ids"])
            labels[i, :n] = torch.tensor(row["labels"])
            mask[i, :n] = 1
        out.append({"input_ids": ids, "labels": labels, "attention_mask": mask})
    return out


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def lora_model(base_model: str | Path, settings: TrainSettings, device: torch.device):  # noqa: ANN201
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = AutoModelForCausalLM.from_pretrained(str(base_model), torch_dtype=dtype)
    config = servable_lora_config(settings.rank, settings.alpha)
    return get_peft_model(base, config).to(device)


def cpu_autocast(device: torch.device) -> bool:
    """Whether to run a CPU model's products in bf16 (its weights stay fp32): only where the
    CPU does bf16 natively (AVX-512 BF16 or AMX), where it is several times faster than fp32."""
    if device.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def token_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], bf16: bool = False
) -> tuple[torch.Tensor, int]:
    """The summed next-token cross-entropy over a batch's labelled positions, and their count;
    ``bf16``: the products of a CPU model in bf16 (see ``cpu_autocast``).

    The output layer runs only where there is a label: the prompt and the padding need no
    logits, and over Orpheus's 157k-token vocabulary that layer is most of a small model's work
    (and a large share of the activations of a big one).
    """
    causal = model.get_base_model()  # the LoRA layers are inside it
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = causal.get_decoder()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        targets = batch["labels"][:, 1:]
        labelled = targets != -100
        logits = causal.get_output_embeddings()(hidden[:, :-1][labelled])
    loss = torch.nn.functional.cross_entropy(logits.float(), targets[labelled], reduction="sum")
    return loss, int(labelled.sum())


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, held_out: list[dict[str, torch.Tensor]], device: torch.device
) -> float:
    """Mean token loss on the held-out batches."""
    model.eval()
    total, tokens = 0.0, 0
    for batch in held_out:
        batch = {k: v.to(device) for k, v in batch.items()}
        loss, count = token_loss(model, batch, cpu_autocast(device))
        total += float(loss)
        tokens += count
    model.train()
    return total / max(1, tokens)


def train(
    base_model: str | Path,
    rows: Sequence[dict[str, list[int]]],
    settings: TrainSettings,
    work_dir: Path,
    pad_id: int,
    progress: bool = True,
    on_step: Callable[[TrainHistory, int], None] | None = None,
) -> tuple[torch.nn.Module, TrainHistory]:
    """Train (or resume) a LoRA; returns the PEFT model and its loss history."""
    from tqdm import tqdm

    torch.manual_seed(settings.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        # every core this process may use (loading the codec leaves torch at half of them);
        # a server's clone job runs niced, so live streams still come first
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    bf16 = cpu_autocast(device)
    model = lora_model(base_model, settings, device)
    model.train()
    train_idx, eval_idx = split(len(rows), settings.eval_fraction, settings.seed)
    held_out = batches(rows, eval_idx, settings.batch_size, pad_id)
    steps_per_epoch = math.ceil(
        math.ceil(len(train_idx) / settings.batch_size) / settings.grad_accumulation
    )
    total_steps = steps_per_epoch * settings.epochs
    warmup = max(1, round(total_steps * settings.warmup_fraction))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total_steps)
    )
    history = TrainHistory()
    checkpoint = work_dir / CHECKPOINT
    if (checkpoint / "state.pt").exists():
        history = _resume(checkpoint, model, optimizer, scheduler)
        log.info("resumed after epoch %d (step %d)", history.epochs_done, history.steps)
    if not history.eval_loss:
        history.eval_loss.append(evaluate(model, held_out, device))  # before any training
    bar = tqdm(total=total_steps, initial=history.steps, disable=not progress, unit="step")
    for epoch in range(history.epochs_done, settings.epochs):
        order = list(train_idx)
        random.Random(settings.seed + epoch).shuffle(order)
        micro = batches(rows, order, settings.batch_size, pad_id)
        for start in range(0, len(micro), settings.grad_accumulation):
            group = micro[start : start + settings.grad_accumulation]
            loss_sum = 0.0
            for batch in group:
                batch = {k: v.to(device) for k, v in batch.items()}
                total, count = token_loss(model, batch, bf16)
                loss = total / max(1, count) / len(group)
                loss.backward()
                loss_sum += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            history.steps += 1
            history.train_loss.append(loss_sum)
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{loss_sum:.3f}", eval=f"{history.eval_loss[-1]:.3f}"
            )
            bar.update(1)
            if on_step:
                on_step(history, total_steps)
        history.eval_loss.append(evaluate(model, held_out, device))
        history.epochs_done = epoch + 1
        _save_checkpoint(checkpoint, model, optimizer, scheduler, history)
        if on_step:
            on_step(history, total_steps)
    bar.close()
    return model, history


def _save_checkpoint(path: Path, model, optimizer, scheduler, history: TrainHistory) -> None:  # noqa: ANN001
    """Write the whole checkpoint beside ``path`` and swap it in, so a kill never leaves half."""
    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging / "adapter", safe_serialization=True)
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        staging / "state.pt",
    )
    (staging / "history.json").write_text(json.dumps(asdict(history)))
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    staging.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _resume(path: Path, model, optimizer, scheduler) -> TrainHistory:  # noqa: ANN001
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(path / "adapter" / "adapter_model.safetensors"))
    state = torch.load(path / "state.pt", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return TrainHistory(**json.loads((path / "history.json").read_text()))
