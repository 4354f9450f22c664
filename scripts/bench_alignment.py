"""Word timing against ground truth: each aligner's word-start error on espeak-ng's speech.

espeak-ng's C library reports where each word starts in the audio it makes (its word events,
through ctypes: ``voicehost.tools.devcorpus.spoken_words``). Connected speech of several voices
and speeds, resampled to the model's 24 kHz, is aligned:

- ``whole``: the segment's audio at once (what a segment's last words get, and the captioned
  endpoint);
- ``streamed``: fed in ``--chunk-ms`` chunks as the engine's audio comes, each word taken when the
  aligner gives it (what a stream's words get).

Then the same audio through sox ``tempo`` (the truth scaled by 1 / tempo) and ``pad`` (the truth
shifted by the pad), which move the truth by known amounts. For each: the word-start error
(median, p90, ms) and the share of consecutive words given in order. The last line of output is
one JSON object with every figure.

    python scripts/bench_alignment.py [--voices en-us+m1,en-us+f2,en+m3,en-us+f4]
        [--speeds 140,175,220] [--chunk-ms 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import soxr

from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.speech.alignment import EstimatedAligner, align
from voicehost.tools.devcorpus import spoken_words

TEXTS = [
    "The quick brown fox, jumping over the lazy dog, said hello. Then it ran away quickly.",
    "We walked along the river and talked about the weather while the evening light turned the "
    "water gold.",
    "Please call Stella. Ask her to bring these things with her from the store: six spoons of "
    "fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "I never said she stole my money, but somebody did; and now everyone thinks it was me.",
    "After the meeting ended, the manager thanked everyone for coming and promised a decision "
    "by Friday.",
]
TRANSFORMS = {"plain": [], "tempo 1.25": ["tempo", "1.25"], "pad 0.4 s": ["pad", "0.4", "0"]}


def transformed(samples: np.ndarray, effect: list[str], work: Path) -> np.ndarray:
    """``samples`` (24 kHz) through sox ``effect``."""
    if not effect:
        return samples
    source, out = work / "in.wav", work / "out.wav"
    soundfile.write(source, samples, SAMPLE_RATE, subtype="PCM_16")
    subprocess.run(["sox", str(source), str(out), *effect], check=True)
    audio, _ = soundfile.read(out, dtype="float32")
    return audio


def moved(start: float, effect: list[str]) -> float:
    """Where a word that started at ``start`` s starts after ``effect``."""
    if effect[:1] == ["tempo"]:
        return start / float(effect[1])
    if effect[:1] == ["pad"]:
        return start + float(effect[1])
    return start


def figures(errors: list[float], ordered: int, pairs: int) -> dict[str, float]:
    e = np.abs(np.array(errors))
    return {
        "median_ms": round(1e3 * float(np.median(e)), 1),
        "p90_ms": round(1e3 * float(np.percentile(e, 90)), 1),
        "in_order": round(ordered / max(pairs, 1), 4),
        "words": int(e.size),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices", default="en-us+m1,en-us+f2,en+m3,en-us+f4")
    parser.add_argument("--speeds", default="140,175,220", help="words per minute")
    parser.add_argument("--chunk-ms", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    aligner = EstimatedAligner()
    chunk = SAMPLE_RATE * args.chunk_ms // 1000
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for transform, effect in TRANSFORMS.items():
            for mode in ("whole", "streamed"):
                per_case: dict[str, tuple[list[float], int, int]] = {}
                for voice in args.voices.split(","):
                    for speed in (int(s) for s in args.speeds.split(",")):
                        case = f"{voice} {speed} wpm"
                        errors, ordered, pairs = per_case.setdefault(case, ([], 0, 0))
                        for text in TEXTS:
                            spoken = spoken_words(text, voice, speed)
                            audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
                            audio = transformed(audio, effect, work)
                            words = align(aligner, text, audio, chunk if mode == "streamed" else 0)
                            truth = dict(spoken.starts)
                            errors += [
                                w.audio_start - moved(truth[w.start], effect)
                                for w in words
                                if w.start in truth
                            ]
                            starts = [w.audio_start for w in words]
                            ordered += sum(b >= a for a, b in itertools.pairwise(starts))
                            pairs += max(0, len(starts) - 1)
                        per_case[case] = (errors, ordered, pairs)
                rows = {case: figures(*values) for case, values in per_case.items()}
                every = [e for errors, _, _ in per_case.values() for e in errors]
                rows["all"] = figures(
                    every,
                    sum(o for _, o, _ in per_case.values()),
                    sum(p for _, _, p in per_case.values()),
                )
                results[f"{aligner.name} {mode}, {transform}"] = rows
                print(f"{aligner.name} {mode:8s} {transform:10s} {rows['all']}", file=sys.stderr)
    for name, rows in results.items():
        print(f"\n{name}")
        for case, row in rows.items():
            print(
                f"  {case:22s} median {row['median_ms']:6.1f} ms  p90 {row['p90_ms']:6.1f} ms  "
                f"in order {100 * row['in_order']:5.1f} %  ({row['words']} words)"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
