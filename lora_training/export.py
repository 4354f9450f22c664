"""Export: a trained LoRA as ``adapters/<voice_id>/``, ready for the server to pick up.

The folder holds the PEFT adapter (safetensors), ``voice.json`` and ``loss.png``. It is written
next to its final place and renamed into it, so a server never sees half a voice.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from lora_training.train import TrainHistory

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class VoiceData:
    """What the voice was trained on."""

    minutes: float
    clips: int
    leading_before_ms: dict[str, float]
    leading_after_ms: dict[str, float]
    rejected: list[dict[str, str]]


def manifest(
    voice_id: str,
    name: str,
    base_model: str,
    prompt_style: str,
    data: VoiceData,
    history: TrainHistory,
    settings: dict[str, object],
) -> dict[str, object]:
    return {
        "voice_id": voice_id,
        "name": name,
        "base_model": base_model,
        "prompt_style": prompt_style,
        "data": {
            "minutes": round(data.minutes, 3),
            "clips": data.clips,
            "leading_silence_ms": {
                "before": data.leading_before_ms,
                "after": data.leading_after_ms,
            },
            "rejected": data.rejected,
        },
        "train": {
            "eval_loss": [round(x, 5) for x in history.eval_loss],
            "steps": history.steps,
            "epochs": history.epochs_done,
            "settings": settings,
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "version": MANIFEST_VERSION,
    }


def plot_losses(history: TrainHistory, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(range(1, len(history.train_loss) + 1), history.train_loss, label="train")
    steps_per_epoch = history.steps / max(1, history.epochs_done)
    eval_x = [i * steps_per_epoch for i in range(len(history.eval_loss))]
    axes.plot(eval_x, history.eval_loss, "o-", label="held-out")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)


def export_voice(
    model: torch.nn.Module,
    out: Path,
    voice_manifest: dict[str, object],
    history: TrainHistory,
) -> Path:
    """Write the voice folder ``out`` in a hidden staging folder, then move it into place
    (replacing an older one); returns it."""
    staging = out.with_name(f".{out.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    config_path = staging / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = voice_manifest["base_model"]
    config_path.write_text(json.dumps(config, indent=2))
    (staging / "voice.json").write_text(json.dumps(voice_manifest, indent=2))
    plot_losses(history, staging / "loss.png")
    (staging / "README.md").unlink(missing_ok=True)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out
