"""Export: a trained LoRA as ``adapters/<voice_id>/``, ready for the server to pick up.

The folder holds the PEFT adapter (safetensors), ``voice.json``, ``loss.png`` and
``references/``: the clips held out of training (24 kHz 16-bit WAV, listed in ``voice.json``'s
``data.references``), the speaker's own voice for evaluating the clone. It is written next to its
final place and renamed into it, so a server never sees half a voice.
"""

from __future__ import annotations

import json
import shutil
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lora_training.train import TrainHistory
from voicehost.audio.formats import write_wav
from voicehost.ids import now_iso
from voicehost.model.orpheus import SAMPLE_RATE

MANIFEST_VERSION = 1
REFERENCES = "references"


@dataclass(frozen=True, slots=True)
class Reference:
    """A clip held out of training: the speaker as they really sound."""

    source: str  # the uploaded file (``name#k``: a piece of a long recording)
    text: str
    samples: np.ndarray  # float32, 24 kHz, loudness-normalised and trimmed


@dataclass(frozen=True, slots=True)
class VoiceData:
    """What the voice was trained on."""

    minutes: float
    clips: int
    leading_before_ms: dict[str, float]
    leading_after_ms: dict[str, float]
    rejected: list[dict[str, str]]
    quality: dict[str, object] | None = None  # lora_training.quality.DataReport.to_json()
    references: list[Reference] = field(default_factory=list)


def reference_entries(references: list[Reference]) -> list[dict[str, object]]:
    """``voice.json``'s list of the reference files (relative to the voice folder)."""
    return [
        {
            "file": f"{REFERENCES}/ref-{i:02d}.wav",
            "source": ref.source,
            "text": ref.text,
            "seconds": round(ref.samples.size / SAMPLE_RATE, 3),
        }
        for i, ref in enumerate(references)
    ]


def manifest(
    voice_id: str,
    name: str,
    base_model: str,
    prompt_style: str,
    language: str,
    data: VoiceData,
    history: TrainHistory,
    settings: dict[str, object],
) -> dict[str, object]:
    return {
        "voice_id": voice_id,
        "name": name,
        "base_model": base_model,
        "prompt_style": prompt_style,
        "language": language,
        "data": {
            "minutes": round(data.minutes, 3),
            "clips": data.clips,
            "leading_silence_ms": {
                "before": data.leading_before_ms,
                "after": data.leading_after_ms,
            },
            "rejected": data.rejected,
            "references": reference_entries(data.references),
            "quality": data.quality,
        },
        "train": {
            "eval_loss": [round(x, 5) for x in history.eval_loss],
            "steps": history.steps,
            "epochs": history.epochs_done,
            "settings": settings,
        },
        "created": now_iso(),
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


def read_references(folder: Path) -> list[np.ndarray]:
    """The reference clips of an exported voice (float32, 24 kHz), in ``voice.json``'s order."""
    entries = json.loads((folder / "voice.json").read_text())["data"].get("references", [])
    clips = []
    for entry in entries:
        with wave.open(str(folder / entry["file"]), "rb") as source:
            pcm = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
        clips.append((pcm / 32767.0).astype(np.float32))
    return clips


def export_voice(
    model: torch.nn.Module,
    out: Path,
    voice_manifest: dict[str, object],
    history: TrainHistory,
    references: list[Reference] | None = None,
) -> Path:
    """Write the voice folder ``out`` in a hidden staging folder, then move it into place
    (replacing an older one); returns it. ``references`` must be those the manifest lists."""
    staging = out.with_name(f".{out.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    config_path = staging / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = voice_manifest["base_model"]
    config_path.write_text(json.dumps(config, indent=2))
    (staging / "voice.json").write_text(json.dumps(voice_manifest, indent=2))
    plot_losses(history, staging / "loss.png")
    if references:
        (staging / REFERENCES).mkdir()
        for entry, ref in zip(reference_entries(references), references, strict=True):
            write_wav(staging / str(entry["file"]), ref.samples)
    (staging / "README.md").unlink(missing_ok=True)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out
