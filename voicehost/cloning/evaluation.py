"""How close a voice is to its speaker: speak fixed sentences with it, then measure.

The figures (``EvalReport``), each with the speaker embedder's name:

- **similarity** of each sample to the speaker's references (their centroid): mean and 10th
  percentile;
- **baseline**: the same for the built-in voice closest to the speaker (is the clone closer to
  the person than a stock voice?), and the clone's **gain** over it;
- **ceiling**: each reference against the centroid of the others (how alike the person's own
  clips are: no clone measures far above it);
- **start of speech**: each sample's leading silence (``voicehost.audio.speech_start``, the runtime
  trim's threshold), p50 and p95;
- **real-time factor**: generation time over audio time, per sample (the samples are generated
  side by side, a batch of a few streams);
- **intelligibility**: word and character error rates against the sentence text, when an ASR
  backend is given; otherwise "not measured", never a made-up number.

``evaluate`` takes a ``Speak`` callable, so the same measurement runs over the API of a running
server (``voicehost.client.http_speaker``, ``voicehost eval``) or wherever audio can be made.
``gate`` says why a report falls short of thresholds (nothing when it passes).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lora_training.transcripts import SpeechRecognizer
from voicehost.audio.channel import RAW, ChannelView, measure_band
from voicehost.audio.speaker import SpeakerEmbedder, centroid, embed_off_loop, similarity
from voicehost.audio.speech_start import leading_silence_ms
from voicehost.model.orpheus import SAMPLE_RATE

# Sentences none of the dev corpus (``voicehost.tools.devcorpus.SENTENCES``) says: a clone is heard
# on text it was not trained on. Short and varied (a question, numbers as words, a long vowel run).
EVAL_SENTENCES: tuple[str, ...] = (
    "Can you tell me the way to the nearest post office?",
    "Seven hundred people waited outside in the cold.",
    "I would love a cup of tea before we start.",
    "The orange lamp flickered softly all evening.",
    "Thank you for calling, how may I help you today?",
    "Most birds fly south once the days grow short.",
)

SPEECH_THRESHOLD_DB = -45.0  # the runtime trim's default level (Settings.trim_threshold_db)


@dataclass(frozen=True, slots=True)
class Sample:
    """One spoken sentence: 24 kHz float samples and the wall time its generation took."""

    voice: str
    sentence: str
    samples: np.ndarray
    seconds_taken: float

    @property
    def audio_seconds(self) -> float:
        return self.samples.size / SAMPLE_RATE


Speak = Callable[[str, str], Awaitable[Sample]]  # (voice, sentence) -> its sample


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over samples: its mean, 10th percentile and every value in order."""

    mean: float
    p10: float
    values: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        v = [float(x) for x in values]
        if not v:
            raise ValueError("no values to summarise")
        return cls(float(np.mean(v)), float(np.percentile(v, 10)), v)


@dataclass(frozen=True, slots=True)
class EvalReport:
    embedder: str  # the name of the speaker embedder behind the similarities
    voice: str
    sentences: list[str]
    references: int
    similarity: Spread
    baseline_voice: str | None
    baseline: Spread | None
    gain: float | None  # similarity.mean - baseline.mean
    ceiling: Spread | None  # None with a single reference
    leading_silence_ms: dict[str, float]  # p50, p95
    real_time_factor: dict[str, float]  # mean, max
    intelligibility: dict[str, Any]  # {"measured": False, "reason": ...} or wer/cer
    seconds: float
    # how the speaker was heard: the references' common band (every clip is compared in it),
    # how many references came in each band, and the ceiling with each reference as uploaded
    # (the ceiling less this is what the references' channels took from their likeness)
    channel: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        figures = asdict(self)
        return {"encoder": figures.pop("embedder"), **figures}  # its published field name

    def summary(self) -> str:
        """The figures in a few lines of plain words."""
        s = self.similarity
        lines = [
            f"{self.voice}: speaker similarity {s.mean:.3f} (p10 {s.p10:.3f}) to "
            f"{self.references} reference clips, over {len(s.values)} sentences ({self.embedder})"
        ]
        if self.baseline is not None and self.gain is not None:
            lines.append(
                f"closest built-in voice {self.baseline_voice}: {self.baseline.mean:.3f} "
                f"(gain {self.gain:+.3f})"
            )
        if self.ceiling is not None:
            lines.append(f"the references among themselves: {self.ceiling.mean:.3f}")
        channel = self.channel or {}
        uploaded = channel.get("ceiling_as_uploaded")
        if len(channel.get("reference_bands", {})) > 1 and uploaded is not None:
            lines.append(
                f"the references came through {len(channel['reference_bands'])} bands; every "
                f"clip is compared in {channel['band']} (the references as uploaded: "
                f"{uploaded:.3f} among themselves)"
            )
        silence, rtf = self.leading_silence_ms, self.real_time_factor
        lines.append(
            f"start of speech p50 {silence['p50']:.0f} ms, p95 {silence['p95']:.0f} ms; "
            f"real-time factor {rtf['mean']:.2f} (max {rtf['max']:.2f})"
        )
        heard = self.intelligibility
        if heard.get("measured"):
            lines.append(
                f"word error rate {heard['wer']:.2f}, character error rate {heard['cer']:.2f}"
            )
        else:
            lines.append(f"intelligibility not measured: {heard.get('reason', 'no ASR')}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_similarity: float
    min_gain: float
    max_wer: float


def gate(report: EvalReport, thresholds: Thresholds) -> list[str]:
    """Why ``report`` falls short of ``thresholds``, in plain words; empty when it passes."""
    reasons = []
    if report.similarity.mean < thresholds.min_similarity:
        reasons.append(
            f"speaker similarity {report.similarity.mean:.3f} is below "
            f"{thresholds.min_similarity:.3f} ({report.embedder})"
        )
    if report.gain is not None and report.gain < thresholds.min_gain:
        reasons.append(
            f"it is {report.gain:+.3f} closer to the speaker than the built-in voice "
            f"{report.baseline_voice!r}; at least {thresholds.min_gain:+.3f} is required"
        )
    wer = report.intelligibility.get("wer")
    if wer is not None and wer > thresholds.max_wer:
        reasons.append(f"word error rate {wer:.2f} is above {thresholds.max_wer:.2f}")
    return reasons


# --- intelligibility -------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance: substitutions, insertions and deletions, each counting 1."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edits over the reference's words (case and punctuation ignored)."""
    words = _words(reference)
    return edit_distance(words, _words(hypothesis)) / max(1, len(words))


def char_error_rate(reference: str, hypothesis: str) -> float:
    """Character edits over the reference's characters (words joined by one space)."""
    ref, hyp = " ".join(_words(reference)), " ".join(_words(hypothesis))
    return edit_distance(ref, hyp) / max(1, len(ref))


# --- the evaluation --------------------------------------------------------------------------


async def _embed_all(
    embedder: SpeakerEmbedder, clips: Sequence[np.ndarray], view: ChannelView = RAW
) -> list[np.ndarray]:
    """Each clip's embedding, heard through ``view``."""
    return [await embed_off_loop(embedder, view.treat(clip), SAMPLE_RATE) for clip in clips]


async def _scores(
    embedder: SpeakerEmbedder, speaker: np.ndarray, samples: Sequence[Sample], view: ChannelView
) -> list[float]:
    """Each sample's similarity to the speaker's embedding, heard through ``view``."""
    embeddings = await _embed_all(embedder, [s.samples for s in samples], view)
    return [similarity(e, speaker) for e in embeddings]


def leave_one_out(embeddings: Sequence[np.ndarray]) -> Spread | None:
    """Each embedding against the centroid of the others; ``None`` with fewer than two."""
    if len(embeddings) < 2:
        return None
    return Spread.of(
        similarity(e, centroid([o for j, o in enumerate(embeddings) if j != i]))
        for i, e in enumerate(embeddings)
    )


async def evaluate(
    speak: Speak,
    voice: str,
    references: Sequence[np.ndarray],
    embedder: SpeakerEmbedder,
    sentences: Sequence[str] = EVAL_SENTENCES,
    baseline_voices: Sequence[str] = (),
    recognizer: SpeechRecognizer | None = None,
) -> EvalReport:
    """Speak ``sentences`` with ``voice`` and measure the samples against ``references``
    (24 kHz float clips of the speaker). The baseline is whichever of ``baseline_voices`` is
    closest to the speaker on the first sentence, then heard on every sentence."""
    if not references:
        raise ValueError("an evaluation needs at least one reference clip of the speaker")
    if not sentences:
        raise ValueError("an evaluation needs at least one sentence")
    started = time.monotonic()
    bands = [measure_band(r) for r in references]
    view = ChannelView.of_bands(bands)  # every sample heard in the references' common band
    reference_embeddings = await _embed_all(embedder, references, view)
    speaker = centroid(reference_embeddings)
    ceiling = leave_one_out(reference_embeddings)
    as_uploaded = ceiling
    if view != RAW and ceiling is not None:
        as_uploaded = leave_one_out(await _embed_all(embedder, references))
    candidates = [v for v in baseline_voices if v != voice]
    # Spoken side by side, as the engine batches them: the voice's sentences with each
    # candidate's first one, then the rest for the closest candidate (with one candidate, that
    # is known at once, and everything is spoken together).
    rest_now = sentences[1:] if len(candidates) == 1 else []
    spoken = await asyncio.gather(
        *(speak(voice, sentence) for sentence in sentences),
        *(speak(v, sentences[0]) for v in candidates),
        *(speak(v, sentence) for v in candidates[:1] for sentence in rest_now),
    )
    samples = list(spoken[: len(sentences)])
    scores = await _scores(embedder, speaker, samples, view)

    baseline_voice, baseline = None, None
    if candidates:
        firsts = spoken[len(sentences) : len(sentences) + len(candidates)]
        first_scores = await _scores(embedder, speaker, list(firsts), view)
        best = int(np.argmax(first_scores))
        baseline_voice = candidates[best]
        if rest_now:
            rest = list(spoken[len(sentences) + len(candidates) :])
        else:
            rest = await asyncio.gather(*(speak(baseline_voice, s) for s in sentences[1:]))
        rest_scores = await _scores(embedder, speaker, list(rest), view)
        baseline = Spread.of([first_scores[best], *rest_scores])

    silences = [leading_silence_ms(s.samples, SPEECH_THRESHOLD_DB) for s in samples]
    factors = [s.seconds_taken / max(s.audio_seconds, 1e-9) for s in samples]
    if recognizer is None:
        intelligibility: dict[str, Any] = {
            "measured": False,
            "reason": "no ASR backend is configured",
        }
    else:
        heard = [await asyncio.to_thread(recognizer.transcribe, s.samples) for s in samples]
        pairs = list(zip(sentences, heard, strict=True))
        intelligibility = {
            "measured": True,
            "asr": type(recognizer).__name__,
            "wer": float(np.mean([word_error_rate(s, h) for s, h in pairs])),
            "cer": float(np.mean([char_error_rate(s, h) for s, h in pairs])),
            "heard": heard,
        }
    similarity_spread = Spread.of(scores)
    return EvalReport(
        embedder=embedder.name,
        voice=voice,
        sentences=list(sentences),
        references=len(references),
        similarity=similarity_spread,
        baseline_voice=baseline_voice,
        baseline=baseline,
        gain=None if baseline is None else similarity_spread.mean - baseline.mean,
        ceiling=ceiling,
        leading_silence_ms={
            "p50": float(np.percentile(silences, 50)),
            "p95": float(np.percentile(silences, 95)),
        },
        real_time_factor={"mean": float(np.mean(factors)), "max": float(np.max(factors))},
        intelligibility=intelligibility,
        seconds=time.monotonic() - started,
        channel={
            "band": str(view.band),
            "reference_bands": dict(Counter(str(b) for b in bands)),
            "ceiling_as_uploaded": None if as_uploaded is None else as_uploaded.mean,
        },
    )


def plot(report: EvalReport, out: Path) -> None:
    """Each sample's similarity to the speaker, against the baseline voice and the ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.5))
    index = np.arange(1, len(report.similarity.values) + 1)
    axes.plot(index, report.similarity.values, "o-", label=f"{report.voice}")
    if report.baseline is not None:
        axes.plot(index, report.baseline.values, "s--", label=f"baseline {report.baseline_voice}")
    if report.ceiling is not None:
        axes.axhline(report.ceiling.mean, color="grey", linestyle=":", label="references (ceiling)")
    axes.set_xlabel("evaluation sentence")
    axes.set_ylabel(f"similarity ({report.embedder})")
    axes.set_xticks(index)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
