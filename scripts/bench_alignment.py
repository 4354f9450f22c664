"""Word timing against ground truth: each aligner's word-start error on espeak-ng's speech.

espeak-ng's C library reports where each word starts in the audio it makes (its word events,
through ctypes: ``voicehost.tools.devcorpus.spoken_words``). Connected speech of several voices
and speeds, resampled to the model's 24 kHz, is aligned:

- ``whole``: the segment's audio at once (what a segment's last words get, and the captioned
  endpoint);
- ``streamed``: fed in ``--chunk-ms`` chunks as the engine's audio comes, each word taken when the
  aligner gives it (what a stream's words get). Its lateness too: the share of words given no
  later than the chunk after the one their audio ends in (the end taken as the next word's
  true start, the last word's as the audio's end), the stream's promise to a client.

Then the same audio through sox ``tempo`` (the truth scaled by 1 / tempo) and ``pad`` (the truth
shifted by the pad), which move the truth by known amounts. For each: the word-start error
(median, p90, ms) and the share of consecutive words given in order. The last line of output is
one JSON object with every figure.

``--aligner-model FOLDER`` measures a forced aligner (``VOICEHOST_ALIGNER_MODEL``) beside the
built-in one (none can be downloaded on the build machines: a real one must be brought).

    python scripts/bench_alignment.py [--voices en-us+m1,en-us+f2,en+m3,en-us+f4]
        [--speeds 140,175,220] [--chunk-ms 300] [--aligner-model FOLDER] [--json OUT]
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
from voicehost.speech.alignment import Aligner, EstimatedAligner, WordTiming, align
from voicehost.speech.forced_alignment import load_aligner
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
    subprocess.run(["sox", "-D", str(source), str(out), *effect], check=True)  # -D: no dither
    audio, _ = soundfile.read(out, dtype="float32")
    return audio


def moved(start: float, effect: list[str]) -> float:
    """Where a word that started at ``start`` s starts after ``effect``."""
    if effect[:1] == ["tempo"]:
        return start / float(effect[1])
    if effect[:1] == ["pad"]:
        return start + float(effect[1])
    return start


def figures(errors: list[float], ordered: int, pairs: int, on_time: list[bool]) -> dict[str, float]:
    e = np.abs(np.array(errors))
    row = {
        "median_ms": round(1e3 * float(np.median(e)), 1),
        "p90_ms": round(1e3 * float(np.percentile(e, 90)), 1),
        "in_order": round(ordered / max(pairs, 1), 4),
        "words": int(e.size),
    }
    if on_time:
        row["on_time"] = round(float(np.mean(on_time)), 4)
    return row


def streamed(
    aligner: Aligner, text: str, audio: np.ndarray, chunk: int
) -> tuple[list[WordTiming], list[float]]:
    """The words of ``text`` as a stream gets them, each with the audio heard (s) when given."""
    alignment = aligner.begin(text)
    words: list[WordTiming] = []
    given_at: list[float] = []
    for first in range(0, audio.size, chunk):
        new = alignment.feed(audio[first : first + chunk])
        words += new
        given_at += [min(audio.size, first + chunk) / SAMPLE_RATE] * len(new)
    last = alignment.finish()
    return words + last, given_at + [audio.size / SAMPLE_RATE] * len(last)


def true_end(truth: dict[int, float], offset: int, effect: list[str], audio: np.ndarray) -> float:
    """Where the word at character ``offset`` ends, at the latest: the next word's true start
    (the audio's end after the last word)."""
    later = [at for at in truth if at > offset]
    return moved(truth[min(later)], effect) if later else audio.size / SAMPLE_RATE


def in_time(ends: list[float], given_at: list[float], chunk_seconds: float) -> list[bool]:
    """Whether each word was given by the end of the chunk after the one its end falls in."""
    return [
        given <= (np.floor(end / chunk_seconds) + 2) * chunk_seconds + 1e-6
        for end, given in zip(ends, given_at, strict=True)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices", default="en-us+m1,en-us+f2,en+m3,en-us+f4")
    parser.add_argument("--speeds", default="140,175,220", help="words per minute")
    parser.add_argument("--chunk-ms", type=int, default=300)
    parser.add_argument("--aligner-model", type=Path, help="a forced aligner's model folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    aligners: list[Aligner] = [EstimatedAligner()]
    if args.aligner_model:
        aligners.append(load_aligner(args.aligner_model))
    chunk = SAMPLE_RATE * args.chunk_ms // 1000
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for aligner, (transform, effect), mode in itertools.product(
            aligners, TRANSFORMS.items(), ("whole", "streamed")
        ):
            per_case: dict[str, tuple[list[float], int, int, list[bool]]] = {}
            for voice in args.voices.split(","):
                for speed in (int(s) for s in args.speeds.split(",")):
                    case = f"{voice} {speed} wpm"
                    errors, ordered, pairs, on_time = per_case.setdefault(case, ([], 0, 0, []))
                    for text in TEXTS:
                        spoken = spoken_words(text, voice, speed)
                        audio = soxr.resample(spoken.samples, spoken.sample_rate, SAMPLE_RATE)
                        audio = transformed(audio, effect, work)
                        truth = dict(spoken.starts)
                        if mode == "streamed":
                            words, given_at = streamed(aligner, text, audio, chunk)
                            ends = [true_end(truth, w.start, effect, audio) for w in words]
                            on_time += in_time(ends, given_at, chunk / SAMPLE_RATE)
                        else:
                            words = align(aligner, text, audio)
                        errors += [
                            w.audio_start - moved(truth[w.start], effect)
                            for w in words
                            if w.start in truth
                        ]
                        starts = [w.audio_start for w in words]
                        ordered += sum(b >= a for a, b in itertools.pairwise(starts))
                        pairs += max(0, len(starts) - 1)
                    per_case[case] = (errors, ordered, pairs, on_time)
            rows = {case: figures(*values) for case, values in per_case.items()}
            rows["all"] = figures(
                [e for values in per_case.values() for e in values[0]],
                sum(values[1] for values in per_case.values()),
                sum(values[2] for values in per_case.values()),
                [t for values in per_case.values() for t in values[3]],
            )
            results[f"{aligner.name} {mode}, {transform}"] = rows
            print(f"{aligner.name} {mode:8s} {transform:10s} {rows['all']}", file=sys.stderr)
    for name, rows in results.items():
        print(f"\n{name}")
        for case, row in rows.items():
            print(
                f"  {case:22s} median {row['median_ms']:6.1f} ms  p90 {row['p90_ms']:6.1f} ms  "
                f"in order {100 * row['in_order']:5.1f} %  ({row['words']} words)"
                + (f"  on time {100 * row['on_time']:5.1f} %" if "on_time" in row else "")
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
