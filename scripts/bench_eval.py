"""How well the speaker embedder tells espeak-ng speakers apart, how well the data report's
speaker-consistency filter catches another speaker's clips, and what the report costs a clone.

Speakers, all made here (``voicehost.tools.devcorpus.speak``), each saying ``SENTENCES`` (36):

- **distinct**: twelve espeak-ng voices, each a voice variant (``m1``..``m7``, ``f1``..``f5``:
  pitch, formants, roughness) with an accent (en, en-us, en-gb-scotland, en-029, en-gb-x-rp,
  en-us-nyc, in turn);
- **near**: sox variants of three of them: pitch up and down 2 semitones (``pitch +-200``), and
  15% faster (``tempo 1.15``: the same voice hurried, which the filter should keep);
- **varied delivery**: four of them (two men's, two women's voices) speaking each sentence at
  its own pitch and speed (espeak-ng ``-p`` 35-65 and ``-s`` 140-210 words a minute, drawn per
  sentence: a median F0 varying by about 1.5 semitones, as read speech does): one speaker whose
  clips the filter must all keep.

Measured, with the embedder ``voicehost.audio.speaker.load_embedder(--embedder)`` names:

1. Similarity of every pair of clips that say different sentences: same speaker, distinct
   speakers, and a speaker against its near variants; the equal error rate of each comparison
   (the threshold where as many same-speaker pairs fall below as other pairs rise above).
   A pair of distinct speakers is **separable** when the embedder tells their clips apart with
   an EER under 10% (``pair_eer``); the filter's figures are given for those too.
2. The consistency filter (``lora_training.quality.other_speakers``) on simulated uploads of
   ``--genuine`` clips of one speaker with ``--injected`` clips of another mixed in (sentences
   the genuine clips do not say), for every ordered pair of distinct speakers and every
   (speaker, near variant) pair, ``--draws`` random draws each; and on clean uploads (nothing
   injected) and varied-delivery uploads: the share of injected clips caught and of genuine
   clips wrongly excluded, at each of ``--thresholds`` with the pitch cue at
   ``--pitch-shift`` semitones, and at the default threshold with the pitch cue off (the
   embedder alone); then one injected clip (the lone-clip rule) at the default.
3. The time the report adds to a clone: ``prepare`` of a ``--time-clips`` upload with and
   without measuring (silero-vad, embeddings, the split), per minute of speech.

Prints tables and, as the last line, one JSON object of every figure.

Usage::

    python scripts/bench_eval.py [--work-dir DIR] [--genuine 30] [--injected 3] [--draws 4]
        [--thresholds 0.88,0.9,0.92,0.94] [--pitch-shift 1.2] [--time-clips 108]
        [--embedder SPEC] [--json OUT]

The clips and their embeddings are cached in ``--work-dir``; a first run takes a few minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lora_training import quality
from lora_training.ingest import ingest
from lora_training.recipe import VoiceJob, prepare
from lora_training.trim import trim
from voicehost.audio.speaker import EmbeddingCache, shared_embedder
from voicehost.tools.devcorpus import SENTENCES, build_corpus, speak

ACCENTS = ["en", "en-us", "en-gb-scotland", "en-029", "en-gb-x-rp", "en-us-nyc"]
VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5"]
DISTINCT = [f"{ACCENTS[i % len(ACCENTS)]}+{v}" for i, v in enumerate(VARIANTS)]
NEAR_OF = [DISTINCT[0], DISTINCT[3], DISTINCT[8]]
NEAR_EFFECTS = {"pitch+200": ["pitch", "200"], "pitch-200": ["pitch", "-200"]}
NEAR_EFFECTS["tempo1.15"] = ["tempo", "1.15"]
VARIED_OF = [DISTINCT[0], DISTINCT[2], DISTINCT[7], DISTINCT[11]]
VARIED_PITCH = (35, 65)  # espeak-ng -p, per sentence (50: the voice's own)
VARIED_SPEED = (140, 210)  # words a minute, per sentence


def speak_varied(text: str, out: Path, voice: str, rng: np.random.Generator) -> None:
    """``text`` by ``voice`` at a pitch and a speed of its own, with 0.3 s of lead silence."""
    pitch = int(rng.integers(VARIED_PITCH[0], VARIED_PITCH[1] + 1))
    speed = int(rng.integers(VARIED_SPEED[0], VARIED_SPEED[1] + 1))
    raw = out.with_suffix(".raw.wav")
    command = ["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(raw)]
    subprocess.run([*command, text], check=True)
    subprocess.run(["sox", str(raw), str(out), "pad", "0.3", "0"], check=True)
    raw.unlink()


def make_speakers(work: Path) -> dict[str, list[Path]]:
    """Each speaker's 36 clips (cached in ``work``)."""
    speakers: dict[str, list[Path]] = {}
    for voice in DISTINCT:
        folder = work / voice
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, text in enumerate(SENTENCES):
            path = folder / f"{index:02d}.wav"
            if not path.exists():
                speak(text, path, 0.3, "wav", voice=voice)
            paths.append(path)
        speakers[voice] = paths
    for voice, (name, effect) in itertools.product(NEAR_OF, NEAR_EFFECTS.items()):
        folder = work / f"{voice}~{name}"
        folder.mkdir(exist_ok=True)
        paths = []
        for source in speakers[voice]:
            path = folder / source.name
            if not path.exists():
                command = ["sox", str(source), str(path), *effect]
                subprocess.run(command, check=True, capture_output=True)
            paths.append(path)
        speakers[folder.name] = paths
    for voice in VARIED_OF:
        folder = work / f"{voice}@varied"
        folder.mkdir(exist_ok=True)
        rng = np.random.default_rng(DISTINCT.index(voice))
        paths = []
        for index, text in enumerate(SENTENCES):
            path = folder / f"{index:02d}.wav"
            if not path.exists():
                speak_varied(text, path, voice, rng)
            paths.append(path)
        speakers[folder.name] = paths
    return speakers


def embed_speakers(speakers: dict[str, list[Path]], embedder: EmbeddingCache) -> tuple[dict, dict]:
    """speaker -> (36, dim) embeddings of the trimmed clips, as prepare embeds them, and
    speaker -> their 36 voice pitches (Hz, None where unvoiced)."""
    found, pitches = {}, {}
    for name, paths in speakers.items():
        recordings, _ = ingest(paths)
        speech = [trim(r.samples).samples for r in recordings]
        found[name] = np.stack([embedder.embed(s) for s in speech])
        pitches[name] = [quality.voice_pitch(s) for s in speech]
    return found, pitches


def eer(same: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """(equal error rate, its threshold): where the share of same-speaker pairs below the
    threshold meets the share of other pairs at or above it."""
    thresholds = np.unique(np.concatenate([same, other]))
    miss = np.searchsorted(np.sort(same), thresholds, "left") / same.size
    false = 1 - np.searchsorted(np.sort(other), thresholds, "left") / other.size
    i = int(np.argmin(np.abs(miss - false)))
    return float((miss[i] + false[i]) / 2), float(thresholds[i])


def pair_similarities(a: np.ndarray, b: np.ndarray, same: bool) -> np.ndarray:
    """Cosines of clips ``i`` of ``a`` and ``j`` of ``b``, for different sentences ``i != j``
    (``i < j`` within one speaker)."""
    sims = a @ b.T
    count = len(a)
    mask = np.triu(np.ones((count, count), dtype=bool), 1) if same else ~np.eye(count, dtype=bool)
    return sims[mask]


def distributions(embeddings: dict) -> dict:
    same = np.concatenate([pair_similarities(embeddings[s], embeddings[s], True) for s in DISTINCT])
    other = np.concatenate(
        [
            pair_similarities(embeddings[a], embeddings[b], False)
            for a, b in itertools.combinations(DISTINCT, 2)
        ]
    )
    near_names = [n for n in embeddings if "~" in n]
    near = np.concatenate(
        [pair_similarities(embeddings[n.split("~")[0]], embeddings[n], False) for n in near_names]
    )
    near_same = np.concatenate(
        [pair_similarities(embeddings[s], embeddings[s], True) for s in NEAR_OF]
    )

    def spread(values: np.ndarray) -> dict:
        p5, p50, p95 = np.percentile(values, [5, 50, 95])
        return {"pairs": int(values.size), "p5": p5, "p50": p50, "p95": p95}

    eer_distinct, at_distinct = eer(same, other)
    eer_near, at_near = eer(near_same, near)
    per_near = {n: eer(near_same_of(embeddings, n), pair_of(embeddings, n))[0] for n in near_names}
    return {
        "same": spread(same),
        "distinct": spread(other),
        "near": spread(near),
        "eer_distinct": eer_distinct,
        "eer_distinct_threshold": at_distinct,
        "eer_near": eer_near,
        "eer_near_threshold": at_near,
        "eer_near_by_variant": per_near,
    }


def near_same_of(embeddings: dict, name: str) -> np.ndarray:
    base = name.split("~")[0]
    return pair_similarities(embeddings[base], embeddings[base], True)


def pair_of(embeddings: dict, name: str) -> np.ndarray:
    return pair_similarities(embeddings[name.split("~")[0]], embeddings[name], False)


def filter_rates(
    embeddings: dict,
    pitches: dict,
    pairs: list[tuple[str, str | None]],
    threshold: float,
    pitch_shift: float,
    genuine: int,
    injected: int,
    draws: int,
    seed: int = 0,
) -> dict:
    """Caught and wrongly excluded shares over simulated uploads of ``pairs`` (other None: a
    clean upload); plus the pairs where the target (95% caught, 5% wrong) is missed."""
    rng = np.random.default_rng(seed)
    caught = injected_total = wrong = genuine_total = 0
    missed: dict[str, list[int]] = {}
    for target, other in pairs:
        pair_caught = pair_wrong = 0
        for _ in range(draws):
            order = rng.permutation(len(SENTENCES))
            clips = list(embeddings[target][order[:genuine]])
            extra = order[genuine : genuine + injected] if other else []
            clips += [embeddings[other][i] for i in extra]
            tones = [pitches[target][i] for i in order[:genuine]]
            tones += [pitches[other][i] for i in extra]
            split = quality.other_speakers(clips, threshold, tones, pitch_shift)
            excluded = split.excluded
            pair_caught += sum(1 for i in excluded if i >= genuine)
            pair_wrong += sum(1 for i in excluded if i < genuine)
            injected_total += len(extra)
            genuine_total += genuine
        caught += pair_caught
        wrong += pair_wrong
        if (other and pair_caught < 0.95 * injected * draws) or pair_wrong > 0.05 * genuine * draws:
            missed[f"{target} <- {other}"] = [pair_caught, pair_wrong]
    return {
        "caught": caught / injected_total if injected_total else None,
        "wrongly_excluded": wrong / genuine_total,
        "pairs_missing_target": missed,
    }


def report_time(work: Path, clips: int) -> dict:
    """Seconds ``prepare`` takes with and without the data report, on one speaker's corpus."""
    corpus = build_corpus(work / f"time-{clips}", count=clips)
    job = VoiceJob(
        audio=[corpus.folder],
        voice_id="timing",
        base_model="-",
        base_model_name="-",
        codec="-",
        adapters_dir=work / "adapters",
        work_dir=work / f"time-work-{time.time_ns()}",
    )
    shared_embedder(None)  # loaded once per process, as in a worker: not counted
    start = time.perf_counter()
    plain = prepare(job, measure=False)
    without = time.perf_counter() - start
    start = time.perf_counter()
    prepare(job)
    with_report = time.perf_counter() - start
    minutes = (plain.seconds + sum(r.samples.size for r in plain.references) / 24000) / 60
    added = with_report - without
    return {
        "clips": clips,
        "speech_minutes": minutes,
        "prepare_s": without,
        "with_report_s": with_report,
        "added_s": added,
        "added_s_per_speech_minute": added / minutes,
    }


def pair_eer(embeddings: dict, target: str, other: str) -> float:
    """The equal error rate of telling ``other``'s clips from ``target``'s by similarity."""
    same = pair_similarities(embeddings[target], embeddings[target], True)
    return eer(same, pair_similarities(embeddings[target], embeddings[other], False))[0]


def filter_row(
    embeddings: dict, pitches: dict, kinds: dict, threshold: float, shift: float, args, injected
) -> dict:
    row = {}
    for kind, pairs in kinds.items():
        draws = args.draws * (4 if kind in ("clean", "varied") else 1)
        extra = 0 if kind in ("clean", "varied") else injected
        row[kind] = filter_rates(
            embeddings, pitches, pairs, threshold, shift, args.genuine, extra, draws
        )
    row["clean16"] = filter_rates(
        embeddings, pitches, kinds["clean"], threshold, shift, 16, 0, args.draws * 4
    )
    return row


def print_row(label: str, row: dict) -> None:
    cells = [f"{label:>12s}"]
    for kind in ("distinct", "separable", "pitch", "tempo"):
        cells.append(f"{row[kind]['caught']:6.1%} / {row[kind]['wrongly_excluded']:4.1%}")
    for kind in ("clean", "clean16", "varied"):
        cells.append(f"{row[kind]['wrongly_excluded']:5.1%}")
    print("  ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/voicehost-bench-eval"))
    parser.add_argument("--genuine", type=int, default=30)
    parser.add_argument("--injected", type=int, default=3)
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--thresholds", default="0.88,0.9,0.92,0.94")
    parser.add_argument("--pitch-shift", type=float, default=quality.MIN_PITCH_SHIFT)
    parser.add_argument("--time-clips", type=int, default=108)
    parser.add_argument(
        "--embedder",
        "--encoder",
        help="a load_embedder spec (default: resemblyzer; --encoder: its name before)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    start = time.perf_counter()
    speakers = make_speakers(args.work_dir / "speakers")
    made = time.perf_counter() - start
    cache = args.work_dir / f"embeddings-{args.embedder or 'resemblyzer'}".replace("/", "_")
    embedder = EmbeddingCache(shared_embedder(args.embedder), cache)
    start = time.perf_counter()
    embeddings, pitches = embed_speakers(speakers, embedder)
    embedded = time.perf_counter() - start
    clips = sum(len(p) for p in speakers.values())
    print(f"{len(speakers)} speakers, {clips} clips: made in {made:.0f} s, ", end="")
    print(f"embedded in {embedded:.0f} s ({embedder.hits} from the cache)")

    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result: dict = {"embedder": embedder.name, "speakers": list(speakers), "args": settings}
    result["similarity"] = figures = distributions(embeddings)
    print(f"\nsimilarity ({embedder.name}) of clip pairs saying different sentences:")
    for kind in ("same", "distinct", "near"):
        f = figures[kind]
        print(f"  {kind:9s} {f['pairs']:6d} pairs  ", end="")
        print(f"p5 {f['p5']:.3f}  p50 {f['p50']:.3f}  p95 {f['p95']:.3f}")
    print(f"  EER distinct {figures['eer_distinct']:.1%} ", end="")
    print(f"(at {figures['eer_distinct_threshold']:.3f}), ", end="")
    print(f"near {figures['eer_near']:.1%} (at {figures['eer_near_threshold']:.3f})")
    for name, value in figures["eer_near_by_variant"].items():
        print(f"    near {name:28s} EER {value:.1%}")

    kinds: dict[str, list] = {
        "distinct": list(itertools.permutations(DISTINCT, 2)),
        "pitch": [(n.split("~")[0], n) for n in speakers if "~pitch" in n],
        "tempo": [(n.split("~")[0], n) for n in speakers if "~tempo" in n],
        "clean": [(s, None) for s in DISTINCT],
        "varied": [(n, None) for n in speakers if "@varied" in n],
    }
    kinds["separable"] = [(a, b) for a, b in kinds["distinct"] if pair_eer(embeddings, a, b) < 0.1]
    print(
        f"\nconsistency filter: {args.genuine} genuine clips + {args.injected} injected, ", end=""
    )
    print(f"{args.draws} draws per pair ({args.draws * 4} per clean upload); ", end="")
    print("caught / wrongly excluded")
    separable = f"separable {len(kinds['separable'])}"
    print(f"{'threshold':>12s}  {'distinct ' + str(len(kinds['distinct'])):>13s}  ", end="")
    print(f"{separable:>13s}  {'near: pitch':>13s}  {'near: tempo':>13s}  ", end="")
    print("clean  clean16 varied")
    result["separable_pairs"] = len(kinds["separable"])
    result["filter"] = {}
    shift = args.pitch_shift
    for threshold in [float(t) for t in args.thresholds.split(",")]:
        row = filter_row(embeddings, pitches, kinds, threshold, shift, args, args.injected)
        result["filter"][str(threshold)] = row
        print_row(f"{threshold:.2f}", row)
    default = quality.MIN_SIMILARITY
    result["filter_default"] = row = result["filter"].get(str(default)) or filter_row(
        embeddings, pitches, kinds, default, shift, args, args.injected
    )
    alone = filter_row(embeddings, pitches, kinds, default, 0.0, args, args.injected)
    result["filter_embedder_alone"] = alone
    print_row(f"{default:.2f} no F0", alone)
    print(f"\nat the default {default}, pairs short of 95% caught or over 5% wrongly excluded:")
    for kind in ("distinct", "pitch", "tempo"):
        for pair, (got, wrong) in row[kind]["pairs_missing_target"].items():
            target, other = pair.split(" <- ")
            difficulty = pair_eer(embeddings, target, other)
            print(f"  {kind} {pair}: caught {got}/{args.injected * args.draws}, ", end="")
            print(f"wrong {wrong}/{args.genuine * args.draws} (clip-pair EER {difficulty:.0%})")
    result["filter_lone"] = lone = filter_row(embeddings, pitches, kinds, default, shift, args, 1)
    print(f"\none clip of another speaker (the lone-clip rule), at {default}:")
    print_row(f"{default:.2f}", lone)

    result["time"] = timing = report_time(args.work_dir, args.time_clips)
    print(f"\nreport time: prepare of {timing['clips']} clips ", end="")
    print(f"({timing['speech_minutes']:.2f} min of speech) {timing['prepare_s']:.1f} s, ", end="")
    print(f"with the report {timing['with_report_s']:.1f} s: +{timing['added_s']:.1f} s ", end="")
    print(f"({timing['added_s_per_speech_minute']:.1f} s per minute of speech)")
    line = json.dumps(result, default=float)
    if args.json:
        args.json.write_text(line)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
