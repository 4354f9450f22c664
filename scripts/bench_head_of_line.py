"""Head-of-line silence at small scale: train one dev voice on clips whose leading silence is
kept and one on trimmed clips, generate from both, and count the leading silence frames.

A generated frame is silence when its layer-0 code is one the codec gives digital silence
(a second of zeros encodes to one code in the middle and other codes at its two edges). Frame 0
is not counted either way: every clip, trimmed or not, begins with the encoder's edge frame, so
the count is of silence frames from frame 1 until the first speech frame.
Generation uses transformers + PEFT with the serving sampling settings (temperature 0.6, top-p
0.8, repetition penalty 1.1), one seed per sample.

    python scripts/bench_head_of_line.py [--samples 24] [--epochs 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

# The tests' corpus: espeak-ng sentences, each with 0.3-1 s of leading silence.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from speech import build_corpus

from lora_training.recipe import VoiceJob, train_voice
from lora_training.train import TrainSettings
from voicehost import orpheus
from voicehost.codec import SnacCodec
from voicehost.config import Settings
from voicehost.devmodel import ensure_dev_model

TEXTS = ["Hello there, how are you today?", "Please call me back this afternoon."]


def silence_codes(codec: SnacCodec) -> set[int]:
    """The layer-0 codes the codec gives a second of digital silence."""
    frames = codec.encode(np.zeros(orpheus.SAMPLE_RATE, dtype=np.float32))
    return {frame.l0[0] for frame in frames}


def leading_silence_frames(
    model, tokenizer, silence: set[int], samples: int, frames_cap: int
) -> list[int]:
    counts = []
    for seed in range(samples):
        text = TEXTS[seed % len(TEXTS)]
        prompt = orpheus.encode_prompt(
            lambda s: tokenizer.encode(s, add_special_tokens=False), text, None
        )
        torch.manual_seed(seed)
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=0.6,
            top_p=0.8,
            repetition_penalty=1.1,
            max_new_tokens=7 * frames_cap,
            eos_token_id=orpheus.END_OF_SPEECH,
            pad_token_id=orpheus.PAD,
        )
        frames = orpheus.FrameAssembler().push(out[0, len(prompt) :].tolist())
        count = 0
        for frame in frames[1:]:
            if frame.l0[0] not in silence:
                break
            count += 1
        counts.append(count)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--frames", type=int, default=24, help="frames generated per sample")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = ensure_dev_model(Settings().dev_dir)
    codec = SnacCodec.load(dev.codec, device="cpu")
    silence = silence_codes(codec)
    tokenizer = AutoTokenizer.from_pretrained(dev.model)
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = build_corpus(Path(tmp) / "corpus")
        for label, trimmed in (("kept", False), ("trimmed", True)):
            job = VoiceJob(
                audio=corpus.good,
                voice_id=f"hol-{label}",
                base_model=str(dev.model),
                base_model_name="voicehost-dev",
                codec=str(dev.codec),
                adapters_dir=Path(tmp) / "adapters",
                work_dir=Path(tmp) / f"work-{label}",
                transcripts=corpus.folder / "metadata.csv",
                trim_leading_silence=trimmed,
                train=TrainSettings(
                    epochs=args.epochs, batch_size=4, grad_accumulation=1, learning_rate=2e-3
                ),
            )
            folder = train_voice(job, progress=False)
            manifest = json.loads((folder / "voice.json").read_text())
            base = AutoModelForCausalLM.from_pretrained(dev.model, torch_dtype=torch.float32)
            model = PeftModel.from_pretrained(base, folder).eval()
            counts = leading_silence_frames(model, tokenizer, silence, args.samples, args.frames)
            results[label] = {
                "leading_silence_frames_mean": round(statistics.mean(counts), 2),
                "leading_silence_frames_p50": statistics.median(counts),
                "starts_within_one_frame": sum(c <= 1 for c in counts),
                "samples": len(counts),
                "frames_generated": args.frames,
                "train_leading_silence_ms": manifest["data"]["leading_silence_ms"],
                "eval_loss": manifest["train"]["eval_loss"],
            }
            print(label, json.dumps(results[label]), flush=True)
    summary = {"silence_l0_codes": sorted(silence), "results": results}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
