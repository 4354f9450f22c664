"""The text stage's cost per segment, per language, and each candidate's accuracy and cost
(issue 44; the figures are in docs/BENCHMARKS.md, "Issue 44: the text stage per language").

For each language: ``TextStage(language=...).whole`` over every input of the case set (one
segment each) and over full segments (the case inputs joined up to the segment size), timed
one call at a time, p50 and p99. Then each candidate normaliser on the case set and the
held-out set: how many cases it says exactly right (and right but for case, spaces and hyphens,
which a voice does not hear), and its cost per case. Candidates not
installed are reported as such (``--candidates DIR`` adds a folder of them, e.g.
``pip install --target DIR cn2an``).

    python scripts/bench_text_stage.py [--rounds 200] [--json OUT] [--candidates DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from num2words import num2words  # noqa: E402

from tests.text.language_cases import CASES  # noqa: E402
from tests.text.language_heldout import HELD_OUT  # noqa: E402
from tests.text.test_text import NORMALISED  # noqa: E402
from voicehost.text.normalize import normalize  # noqa: E402
from voicehost.text.stage import TextStage  # noqa: E402

LANGUAGES = ["en", "fr", "de", "es", "it", "ko", "hi", "zh"]
SEGMENT_CHARS = 300


def cases(language: str) -> list[tuple[str, str]]:
    return list(NORMALISED) if language == "en" else CASES[language]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[str], object], texts: list[str], rounds: int) -> list[float]:
    """Milliseconds per call, each text ``rounds`` times (interleaved, after one warm-up)."""
    for text in texts:
        call(text)
    out = []
    for _ in range(rounds):
        for text in texts:
            start = time.perf_counter()
            call(text)
            out.append((time.perf_counter() - start) * 1000)
    return out


def loose(text: str) -> str:
    """``text`` without case, spaces and hyphens: "zwei und vierzig" says "zweiundvierzig"."""
    return re.sub(r"[\s\-]", "", text.lower())


def rounds_within(call: Callable[[str], object], texts: list[str], rounds: int) -> int:
    """``rounds``, or fewer for a slow candidate: about 10 s of calls at most."""
    start = time.perf_counter()
    for text in texts:
        call(text)
    once = time.perf_counter() - start
    return max(1, min(rounds, int(10 / max(once, 1e-9))))


def full_segments(language: str) -> list[str]:
    """The case inputs joined, sentence after sentence, into segments of about SEGMENT_CHARS
    characters (of the stage's own segment length for that language)."""
    limit = TextStage(language=language).segment_chars
    joiner = "" if language == "zh" else " "
    segments, current = [], ""
    for raw, _ in cases(language) * 3:
        sentence = (
            raw
            if raw.endswith((".", "!", "?", "。", "।"))
            else raw + ("。" if language == "zh" else "।" if language == "hi" else ".")
        )
        if len(current) + len(sentence) + 1 > limit:
            segments.append(current)
            current = ""
        current = f"{current}{joiner}{sentence}" if current else sentence
    return segments


_NUMBER = re.compile(r"[0-9]+")


def num2words_alone(language: str) -> Callable[[str], str]:
    """The simplest use of a library: every digit run replaced by num2words' cardinal."""

    def say(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            try:
                return num2words(int(m[0]), lang=language)
            except (NotImplementedError, OverflowError, KeyError):
                return m[0]

        return _NUMBER.sub(one, text)

    return say


def candidates(language: str) -> dict[str, Callable[[str], str] | str]:
    """name -> a normaliser, or why it could not be measured."""
    found: dict[str, Callable[[str], str] | str] = {
        "voicehost (chosen)": lambda text: normalize(text, language),
    }
    if language != "en":
        found["num2words alone (digits -> cardinal)"] = num2words_alone(language)
    if language == "zh":
        try:
            import cn2an

            found["cn2an.transform(an2cn)"] = lambda text: cn2an.transform(text, "an2cn")
        except ImportError:
            found["cn2an.transform(an2cn)"] = "not installed"
    if language != "en":  # English's rules are not chosen anew here
        found["nemo-text-processing"] = nemo(language)
    return found


def nemo(language: str) -> Callable[[str], str] | str:
    """NeMo's WFST normaliser for ``language`` (its grammars are built once into a cache,
    30-80 s a language on 2 cores), or why there is none."""
    try:
        from nemo_text_processing.text_normalization.normalize import Normalizer
    except ImportError:
        return "not installed"
    try:
        cache = Path(os.environ.get("NEMO_CACHE", "/tmp/nemo_cache")) / language
        normalizer = Normalizer(input_case="cased", lang=language, cache_dir=str(cache))
    except Exception as exc:  # any refusal is a result to report
        return f"refused: {exc}"
    return lambda text: normalizer.normalize(text, verbose=False, punct_post_process=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--candidates", type=Path, nargs="*", default=[], help="folders of candidate libraries"
    )
    args = parser.parse_args()
    sys.path += [str(folder) for folder in args.candidates]  # after this project's own
    load = os.getloadavg()
    report: dict[str, object] = {"load_average": load, "languages": {}}
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'lang':5} {'case p50':>9} {'case p99':>9} {'full p50':>9} {'full p99':>9}  (ms)")
    for language in LANGUAGES:
        stage = TextStage(language=language)
        texts = [raw for raw, _ in cases(language)]
        per_case = timed(stage.whole, texts, args.rounds)
        full = full_segments(language)
        per_full = timed(stage.whole, full, max(1, args.rounds * len(texts) // len(full) // 4))
        row: dict[str, object] = {
            "case_p50_ms": statistics.median(per_case),
            "case_p99_ms": percentile(per_case, 0.99),
            "full_segment_p50_ms": statistics.median(per_full),
            "full_segment_p99_ms": percentile(per_full, 0.99),
            "full_segment_chars": round(statistics.mean(len(t) for t in full)),
            "candidates": {},
        }
        print(
            f"{language:5} {row['case_p50_ms']:9.3f} {row['case_p99_ms']:9.3f} "
            f"{row['full_segment_p50_ms']:9.3f} {row['full_segment_p99_ms']:9.3f}"
            f"  ({row['full_segment_chars']} chars a full segment)"
        )
        for name, say in candidates(language).items():
            if isinstance(say, str):
                row["candidates"][name] = say  # type: ignore[index]
                print(f"      {name}: {say}")
                continue
            right = sum(say(raw) == spoken for raw, spoken in cases(language))
            near = sum(loose(say(raw)) == loose(spoken) for raw, spoken in cases(language))
            held_out = HELD_OUT.get(language, [])
            kept = sum(say(raw) == spoken for raw, spoken in held_out)
            kept_near = sum(loose(say(raw)) == loose(spoken) for raw, spoken in held_out)
            cost = timed(say, texts, rounds_within(say, texts, max(1, args.rounds // 4)))
            row["candidates"][name] = {  # type: ignore[index]
                "right": right,
                "right_ignoring_case_and_spaces": near,
                "cases": len(texts),
                "held_out_right": kept,
                "held_out_right_ignoring_case_and_spaces": kept_near,
                "held_out": len(held_out),
                "p50_ms": statistics.median(cost),
                "p99_ms": percentile(cost, 0.99),
            }
            print(
                f"      {name}: {right}/{len(texts)} right ({near} ignoring case and spaces), "
                + (f"held out {kept}/{len(held_out)} ({kept_near}), " if held_out else "")
                + f"p50 {statistics.median(cost):.3f} ms, p99 {percentile(cost, 0.99):.3f} ms"
            )
        report["languages"][language] = row  # type: ignore[index]
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
