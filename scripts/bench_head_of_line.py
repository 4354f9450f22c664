"""Head-of-line silence at small scale: train one dev voice on clips whose leading silence is
kept and one on trimmed clips, generate from both, and count the leading silence frames.

A frame is silence when all seven of its codes equal those of a frame the codec gives digital
silence (a second of zeros encodes to one frame in the middle and other frames at its two edges).
The whole frame is compared, not the layer-0 code alone: the dev model's random SNAC gives
nearly every speech frame digital silence's layer-0 code too. Frame 0 is not counted either way:
every clip, trimmed or not, begins with the codec's edge frame, so the count is of silence
frames from frame 1 until the first speech frame (all of them, when no speech frame comes).

Three figures per voice:
- ``training_data``: the count over the sequences the voice was trained on; what a voice that
  reproduced its training data would show.
- ``learned``: without drawing samples, the probability that the sampler picks digital
  silence's middle frame as frame 1 after its edge frame as frame 0, and the leading silence
  that such probabilities over frames 1..``--frames`` imply (given silence so far; no
  repetition penalty).
- ``generated``: the count over ``--samples`` generations (transformers + PEFT, repetition
  penalty 1.1), alternating between two texts the voices were not trained on, one seeded batch
  per text, each sample stopping at its first speech frame or after ``--frames`` frames.
``learned`` and ``generated`` are given for each ``--sampling`` TEMPERATURE:TOP_P pair; the
default is the serving settings 0.6:0.8 (``1:1`` samples the distribution the voice learned).

The corpus is the tests' espeak-ng sentences with 0.3-1 s of leading silence added; by default
espeak-ng's own pauses (digital silence between words and at commas) are cut first, so that the
added lead is the clips' only silence (``--keep-pauses`` leaves them in).

    python scripts/bench_head_of_line.py [--clips 36] [--epochs 4] [--learning-rate 2e-3]
        [--samples 24] [--frames 24] [--sampling 0.6:0.8 [1:1]] [--keep-pauses]
        [--work-dir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

# The tests' corpus: espeak-ng sentences, each with 0.3-1 s of leading silence.
from lora_training.recipe import VoiceJob, train_voice
from lora_training.train import TrainSettings
from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.codec import SnacCodec
from voicehost.model.devmodel import ensure_dev_model
from voicehost.tools.devcorpus import SENTENCES, build_corpus

TEXTS = ["Hello there, how are you today?", "Please call me back this afternoon."]


def silence_frames(codec: SnacCodec) -> list[orpheus.Frame]:
    """The frames the codec gives a second of digital silence: an edge frame, the middle frame
    repeated, another edge frame."""
    return codec.encode(np.zeros(orpheus.SAMPLE_RATE, dtype=np.float32))


def leading_silence(frames: Sequence[orpheus.Frame], silence: set[orpheus.Frame]) -> int:
    """Silence frames from frame 1 until the first speech frame (all of them if none comes)."""
    count = 0
    for frame in frames[1:]:
        if frame not in silence:
            break
        count += 1
    return count


def spoke(frames: Sequence[orpheus.Frame], silence: set[orpheus.Frame]) -> bool:
    return any(frame not in silence for frame in frames[1:])


def summary(counts: list[int], speech: list[bool]) -> dict[str, object]:
    return {
        "leading_silence_frames_mean": round(statistics.mean(counts), 2),
        "leading_silence_frames_p50": statistics.median(counts),
        "starts_within_one_frame": sum(c <= 1 for c in counts),
        "never_speaks": speech.count(False),
        "samples": len(counts),
    }


def training_data(work_dir: Path, silence: set[orpheus.Frame]) -> dict:
    """The leading-silence count over the sequences a voice was trained on (the dataset that
    ``train_voice`` saved under ``work_dir``)."""
    from datasets import load_from_disk

    (path,) = work_dir.glob("dataset-*")
    counts, speech, total, speech_frames = [], [], 0, 0
    for row in load_from_disk(str(path)):
        audio = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label >= 0]
        frames = orpheus.FrameAssembler().push(audio)
        counts.append(leading_silence(frames, silence))
        speech.append(spoke(frames, silence))
        total += len(frames)
        speech_frames += sum(frame not in silence for frame in frames)
    return {**summary(counts, speech), "speech_frame_share": round(speech_frames / total, 3)}


def generated(
    model: torch.nn.Module,
    tokenizer: object,
    silence: set[orpheus.Frame],
    args: argparse.Namespace,
    temperature: float,
    top_p: float,
) -> dict:
    """The leading-silence count over ``args.samples`` generations: one batch per text, seeded
    by the text's index, each row stopped at its first speech frame (all that is counted)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class SpeechStarted(StoppingCriteria):
        def __init__(self, prompt_length: int) -> None:
            self.prompt_length = prompt_length

        def __call__(
            self, input_ids: torch.Tensor, scores: torch.Tensor, **_: object
        ) -> torch.Tensor:
            return torch.tensor(
                [spoke(assemble(row[self.prompt_length :]), silence) for row in input_ids]
            )

    counts, speech = [], []
    for index, text in enumerate(TEXTS):
        rows = len(range(index, args.samples, len(TEXTS)))
        prompt = orpheus.encode_prompt(orpheus.plain_text(tokenizer), text, None)
        torch.manual_seed(index)
        out = model.generate(
            torch.tensor([prompt] * rows),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            repetition_penalty=1.1,
            max_new_tokens=orpheus.TOKENS_PER_FRAME * args.frames,
            eos_token_id=orpheus.END_OF_SPEECH,
            pad_token_id=orpheus.PAD,
            stopping_criteria=StoppingCriteriaList([SpeechStarted(len(prompt))]),
        )
        for row in out:
            frames = assemble(row[len(prompt) :])
            counts.append(leading_silence(frames, silence))
            speech.append(spoke(frames, silence))
    return summary(counts, speech)


@torch.no_grad()
def learned(
    model: torch.nn.Module,
    tokenizer: object,
    zeros: Sequence[orpheus.Frame],
    frames: int,
    temperature: float,
    top_p: float,
) -> dict:
    """What a voice learned, without drawing samples: for each text, the probability that the
    sampler (``temperature`` and ``top_p``; no repetition penalty) picks digital silence's middle
    frame as frame k when frame 0 is its edge frame and frames 1..k-1 are the middle frame, for
    k = 1..``frames``; and the leading silence those imply (the sum over k of the probability
    that frames 1..k are all silence). Averaged over the texts."""
    edge, middle = zeros[0], zeros[1]
    edge_p, first_p, expected = [], [], []
    for text in TEXTS:
        prompt = orpheus.encode_prompt(orpheus.plain_text(tokenizer), text, None)
        ids = torch.tensor([prompt + edge.tokens() + middle.tokens() * frames])
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # predicts the audio tokens
        probs = torch.softmax(logits / temperature, dim=-1)
        ranked, order = probs.sort(dim=-1, descending=True)
        outside = ranked.cumsum(-1) - ranked >= top_p  # the tokens top-p leaves out
        ranked[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, ranked / ranked.sum(-1, keepdim=True))
        token = probs.gather(1, ids[0, len(prompt) :, None])[:, 0]
        p = token.view(frames + 1, orpheus.TOKENS_PER_FRAME).prod(1)
        edge_p.append(float(p[0]))
        first_p.append(float(p[1]))
        expected.append(float(torch.cumprod(p[1:], 0).sum()))
    return {
        "p_edge_frame_0": round(statistics.mean(edge_p), 3),
        "p_silence_frame_1": round(statistics.mean(first_p), 3),
        "expected_leading_silence_frames": round(statistics.mean(expected), 2),
    }


def parse(sampling: str) -> tuple[float, float]:
    temperature, top_p = sampling.split(":")
    return float(temperature), float(top_p)


def assemble(tokens: torch.Tensor) -> list[orpheus.Frame]:
    return orpheus.FrameAssembler().push(tokens.tolist())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clips", type=int, default=len(SENTENCES), help="training clips")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--frames", type=int, default=24, help="most frames per sample")
    parser.add_argument(
        "--sampling",
        nargs="+",
        default=["0.6:0.8"],
        help="TEMPERATURE:TOP_P pairs to sample with, each from the same two voices",
    )
    parser.add_argument("--keep-pauses", action="store_true", help="keep espeak-ng's pauses")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep corpus, datasets, checkpoints and voices here instead of in a temporary "
        "folder; a rerun reuses the datasets, and the trained voices when its settings match",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    dev = ensure_dev_model(Settings().dev_dir)
    codec = SnacCodec.load(dev.codec, device="cpu")
    zeros = silence_frames(codec)
    silence = set(zeros)
    tokenizer = AutoTokenizer.from_pretrained(dev.model)
    results: dict[str, dict[str, object]] = {}
    scratch = nullcontext(args.work_dir) if args.work_dir else tempfile.TemporaryDirectory()
    with scratch as tmp:
        variant = f"{args.clips}-clips" + ("-with-pauses" if args.keep_pauses else "")
        corpus = build_corpus(
            Path(tmp) / f"corpus-{variant}", count=args.clips, squeeze_pauses=not args.keep_pauses
        )
        for label, trimmed in (("kept", False), ("trimmed", True)):
            job = VoiceJob(
                audio=corpus.good,
                voice_id=f"hol-{label}",
                base_model=str(dev.model),
                base_model_name="voicehost-dev",
                codec=str(dev.codec),
                adapters_dir=Path(tmp) / "adapters",
                work_dir=Path(tmp) / f"work-{label}-{variant}",  # one dataset in each
                transcripts=corpus.folder / "metadata.csv",
                trim_leading_silence=trimmed,
                train=TrainSettings(
                    epochs=args.epochs,
                    batch_size=4,
                    grad_accumulation=1,
                    learning_rate=args.learning_rate,
                ),
            )
            clock = time.monotonic()
            folder = train_voice(job, progress=False)
            train_s = time.monotonic() - clock
            data = training_data(job.work_dir, silence)
            manifest = json.loads((folder / "voice.json").read_text())
            base = AutoModelForCausalLM.from_pretrained(dev.model, dtype=torch.float32)
            model = PeftModel.from_pretrained(base, folder).eval()
            clock = time.monotonic()
            results[label] = {
                "learned": {
                    sampling: learned(model, tokenizer, zeros, args.frames, *parse(sampling))
                    for sampling in args.sampling
                },
                "generated": {
                    sampling: generated(model, tokenizer, silence, args, *parse(sampling))
                    for sampling in args.sampling
                },
                "training_data": data,
                "train_leading_silence_ms": manifest["data"]["leading_silence_ms"],
                "eval_loss": [round(loss, 3) for loss in manifest["train"]["eval_loss"]],
                "train_voice_seconds": round(train_s),
                "generate_seconds": round(time.monotonic() - clock),
            }
            print(label, json.dumps(results[label]), flush=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {
        "settings": settings,
        "silence_frames": sorted(frame.l0 + frame.l1 + frame.l2 for frame in silence),
        "results": results,
        "seconds": round(time.monotonic() - started),
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
