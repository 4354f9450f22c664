"""Data quality: what an upload holds, measured before a voice is trained on it.

Per clip: its duration, speech share (silero-vad), an SNR estimate (speech power over the power
of its non-speech frames), the share of samples at full scale (clipping) and its loudness as
uploaded (before normalisation), all on the clip as cut from its file, before trimming; and the
similarity of its speech to the upload's own speaker (the centroid of the clips kept). For the
upload: the minutes of usable speech and warnings in plain words.

Clips of another speaker are left out of training (``other_speakers``). Every clip is heard in
the band all the upload's clips share, and the embedder compares like with like: each clip's
channel is measured (``voicehost.audio.channel.channel_labels``: its band, a room's reverb or a
floor of noise under the speech, a thin microphone), and the clips of each channel are judged
among themselves, since a room moves a speaker's embeddings as far as another speaker's. Among
one channel's clips, the clips are split in
two groups by their embeddings, and a minority group whose own speaker (its centroid) is less
than ``min_similarity`` like the rest's, and clearly further off than any group of that size
within the rest, is another voice. One clip alone is judged by its own similarity, with a margin
(a single clip's embedding also carries what it says). A second cue that does not come from the
embedder catches voices it confuses: each clip's voice pitch (its median F0, ``voice_pitch``); a
group of the clips highest or lowest in pitch that stands far from the rest's pitch (by
``min_pitch_shift`` semitones, and by several times the spread of the rest's own pitch) and whose
voice is less like the rest's than any random group of as many of the rest's clips is another
speaker. The defaults are measured on espeak-ng speakers (``scripts/bench_eval.py``,
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lora_training import split as splitting
from lora_training.ingest import ingest
from lora_training.transcripts import find_transcripts
from lora_training.trim import trim
from voicehost.audio.channel import (
    FULL,
    ChannelView,
    channel_labels,
    common_band,
    measure_channel,
)
from voicehost.audio.speaker import EmbeddingCache, SpeakerEmbedder, centroid, shared_embedder
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.text.stage import speech_length

MIN_SIMILARITY = 0.92  # between two groups' speakers; see the benchmark
LONE_CLIP_MARGIN = 0.10  # a lone clip's own similarity is compared with MIN_SIMILARITY - this
LONE_CLIP_MADS = 4.0  # ... and must also be this many deviations below the upload's median
WANTED_MINUTES = 5.0
NOISY_SNR_DB = 20.0
FULL_SCALE = 0.99  # |sample| at or above: clipped (resampling rings around a clipped plateau)
CLIPPED_SHARE = 0.001
SNR_CAP_DB = 80.0  # digital silence between words: no noise to measure
FRAME_SECONDS = 0.02
MIN_GROUP_CLIPS = 6  # fewer clips: no two groups to tell apart
MIN_OTHER_CLIPS = 3  # a smaller group is judged clip by clip (two odd clips are no pattern)
MAX_SEARCHED_GROUP = 12  # neighbour groups searched up to this size (clustering finds more)
NEIGHBOUR_CANDIDATES = 3
SPLIT_MARGIN = 0.02  # a group is another speaker only this much further off than the rest split
MIN_PITCH_SHIFT = 1.2  # semitones between a group's median pitch and the rest's; see the benchmark
PITCH_DEVIATIONS = 2.5  # ... and at least this many robust deviations of the upload's own pitch
PITCH_SPREAD_FLOOR = 0.1  # semitones: ranks the candidate groups when the rest's spread is ~0
PITCH_BASELINE_GROUPS = 24  # random groups of the rest a pitch-apart group must be less alike than
PITCH_FMIN, PITCH_FMAX = 60.0, 400.0  # Hz searched for a voice's F0
PITCH_RATE = 16000
PITCH_FRAME, PITCH_HOP = 1024, 256  # samples at PITCH_RATE: 64 ms frames, 16 ms apart
YIN_THRESHOLD = 0.1  # the first dip of the normalised difference under this is the period
YIN_VOICED = 0.25  # frames whose best dip stays above this are not voiced
MIN_VOICED_FRAMES = 10


@dataclass(frozen=True, slots=True)
class SourceClip:
    """One clip as cut from an uploaded file, before trimming."""

    name: str  # the file's name; ``name#k`` for the k-th piece of a long recording
    samples: np.ndarray  # float32, 24 kHz, loudness-normalised
    gain: float  # the normalisation's factor: ``samples / gain`` is what was uploaded
    speech: np.ndarray | None  # the trimmed clip; None: no speech in it
    text: str | None = None  # its transcript, where one is known


@dataclass(frozen=True, slots=True)
class ClipQuality:
    file: str
    seconds: float
    speech_share: float
    snr_db: float
    clipped_share: float
    loudness_lufs: float | None  # as uploaded; None: too short or digital silence
    similarity: float | None  # to the upload's speaker; None: no speech
    excluded: str | None = None  # why the clip is left out of training
    pitch_hz: float | None = None  # median F0 of its voiced speech; None: no speech, or unvoiced
    channel: str | None = None  # its channel (``channel_labels``); None: no speech
    # its transcript's letters of speech (a Han character three, a Hangul block two:
    # ``speech_length``) a second of its speech; None: no transcript or no speech
    letters_per_second: float | None = None


@dataclass
class DataReport:
    """The whole upload: every clip's figures, the usable speech and the warnings."""

    embedder: str  # the name of the speaker embedder behind the similarities
    min_similarity: float
    clips: list[ClipQuality]
    speech_minutes: float
    warnings: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)  # files that did not decode
    band: str = str(FULL)  # every clip's speaker is judged in this band (the clips' common one)
    clip_bands: dict[str, int] = field(default_factory=dict)  # how many clips came in each band
    unjudged: list[str] = field(default_factory=list)  # kept: too few of their channel to judge

    @property
    def excluded(self) -> list[ClipQuality]:
        return [c for c in self.clips if c.excluded]

    def to_json(self) -> dict[str, object]:
        return {
            "encoder": self.embedder,  # the report's published field name
            "min_similarity": self.min_similarity,
            "speech_minutes": round(self.speech_minutes, 3),
            "band": self.band,
            "clip_bands": self.clip_bands,
            "unjudged": self.unjudged,
            "warnings": self.warnings,
            "excluded": [{"file": c.file, "reason": c.excluded} for c in self.excluded],
            "rejected": self.rejected,
            "clips": [_rounded(asdict(c)) for c in self.clips],
        }


def _rounded(values: dict[str, object]) -> dict[str, object]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items()}


# -- per clip ------------------------------------------------------------------------------


def frame_powers(samples: np.ndarray) -> np.ndarray:
    size = int(FRAME_SECONDS * SAMPLE_RATE)
    count = samples.size // size
    frames = samples[: count * size].astype(np.float64).reshape(count, size)
    return np.mean(frames**2, axis=1)


def snr_db(samples: np.ndarray, regions: Sequence[tuple[int, int]]) -> float:
    """Speech power over noise power, in dB: noise from the frames outside the speech regions
    (the quietest tenth of all frames when fewer than ten are), capped at ``SNR_CAP_DB``."""
    powers = frame_powers(samples)
    if powers.size == 0:
        return 0.0
    size = int(FRAME_SECONDS * SAMPLE_RATE)
    in_speech = np.zeros(powers.size, dtype=bool)
    for start, end in regions:
        in_speech[start // size : -(-end // size)] = True
    noise = powers[~in_speech]
    if noise.size < 10:
        noise = np.sort(powers)[: max(1, powers.size // 10)]
    speech = powers[in_speech] if in_speech.any() else powers
    noise_power = float(np.median(noise))
    signal = float(np.mean(speech)) - noise_power
    if noise_power <= 0:
        return SNR_CAP_DB
    if signal <= 0:
        return 0.0
    return float(min(SNR_CAP_DB, 10 * np.log10(signal / noise_power)))


def loudness_lufs(samples: np.ndarray) -> float | None:
    import pyloudnorm

    if samples.size < SAMPLE_RATE // 2:
        return None
    value = pyloudnorm.Meter(SAMPLE_RATE).integrated_loudness(samples.astype(np.float64))
    return float(value) if np.isfinite(value) else None


def voice_pitch(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float | None:
    """The median F0 (Hz) of a clip's voiced frames, by YIN (de Cheveigne and Kawahara, 2002):
    in each 64 ms frame the period is the first lag whose cumulative-mean-normalised difference
    dips under ``YIN_THRESHOLD`` (refined to its local minimum and interpolated); frames whose
    best dip stays over ``YIN_VOICED`` or that are nearly silent are unvoiced. None when fewer
    than ``MIN_VOICED_FRAMES`` are voiced."""
    import soxr

    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    if sample_rate != PITCH_RATE:
        audio = soxr.resample(audio, sample_rate, PITCH_RATE).astype(np.float32)
    shortest, longest = int(PITCH_RATE / PITCH_FMAX), int(PITCH_RATE / PITCH_FMIN)
    window = PITCH_FRAME - longest
    if audio.size < PITCH_FRAME:
        return None
    frames = np.lib.stride_tricks.sliding_window_view(audio, PITCH_FRAME)[::PITCH_HOP]
    frames = frames.astype(np.float64)
    size = 2 * PITCH_FRAME
    lagged = np.fft.irfft(
        np.conj(np.fft.rfft(frames[:, :window], size)) * np.fft.rfft(frames, size), size
    )[:, : longest + 1]
    energy = np.concatenate([np.zeros((len(frames), 1)), np.cumsum(frames**2, axis=1)], axis=1)
    lags = np.arange(longest + 1)
    head = energy[:, window][:, None]
    difference = np.maximum(head + energy[:, lags + window] - energy[:, lags] - 2 * lagged, 0)
    normalised = np.ones_like(difference)
    running = np.maximum(np.cumsum(difference[:, 1:], axis=1), 1e-12)
    normalised[:, 1:] = difference[:, 1:] * lags[1:] / running
    searched = normalised[:, shortest : longest + 1]
    rows = np.arange(len(searched))
    under = searched < YIN_THRESHOLD
    lag = np.where(under.any(axis=1), under.argmax(axis=1), searched.argmin(axis=1))
    for _ in range(searched.shape[1]):  # walk down to the dip's own minimum
        step = np.minimum(lag + 1, searched.shape[1] - 1)
        lower = searched[rows, step] < searched[rows, lag]
        if not lower.any():
            break
        lag = np.where(lower, step, lag)
    voiced = (searched[rows, lag] < YIN_VOICED) & (head[:, 0] > 0.01 * head.max())
    if voiced.sum() < MIN_VOICED_FRAMES:
        return None
    inner = np.clip(lag, 1, searched.shape[1] - 2)
    before, at, after = (searched[rows, inner + k] for k in (-1, 0, 1))
    curve = before - 2 * at + after
    safe = np.where(np.abs(curve) > 1e-12, curve, 1.0)
    shift = np.where(np.abs(curve) > 1e-12, 0.5 * (before - after) / safe, 0.0)
    period = shortest + inner + np.clip(shift, -1, 1)
    return float(np.median(PITCH_RATE / period[voiced]))


def measure_clip(clip: SourceClip) -> ClipQuality:
    """A clip's figures, all but its speaker similarity."""
    uploaded = clip.samples / clip.gain
    regions = splitting.speech_regions(clip.samples) if clip.samples.size else []
    speech = sum(end - start for start, end in regions)
    return ClipQuality(
        file=clip.name,
        seconds=clip.samples.size / SAMPLE_RATE,
        speech_share=min(1.0, speech / max(1, clip.samples.size)),
        snr_db=snr_db(clip.samples, regions),
        clipped_share=float(np.mean(np.abs(uploaded) >= FULL_SCALE)) if uploaded.size else 0.0,
        loudness_lufs=loudness_lufs(uploaded),
        similarity=None,
        letters_per_second=speaking_rate(clip),
    )


def speaking_rate(clip: SourceClip) -> float | None:
    """How fast the clip's transcript is said in its speech, in letters of speech a second,
    whatever the script (``voicehost.text.stage.speech_length``); None without either."""
    if not clip.text or clip.speech is None or clip.speech.size < SAMPLE_RATE // 2:
        return None
    return speech_length(clip.text) / (clip.speech.size / SAMPLE_RATE)


# -- the speaker -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeakerSplit:
    """Which clips are the upload's speaker: the rest, each with its reason."""

    speaker: np.ndarray  # the centroid of the clips kept
    similarity: list[float]  # each clip's to ``speaker``
    excluded: dict[int, str]
    unjudged: list[int] = field(default_factory=list)  # kept: too few of their channel to judge


def other_speakers(
    embeddings: Sequence[np.ndarray],
    min_similarity: float = MIN_SIMILARITY,
    pitches: Sequence[float | None] | None = None,
    min_pitch_shift: float = MIN_PITCH_SHIFT,
    channels: Sequence[str] | None = None,
) -> SpeakerSplit:
    """Find the clips whose speaker differs from the rest (see the module docstring).

    The embedder judges like with like: the clips of each of ``channels`` (one label per clip,
    ``voicehost.audio.channel.measure_channel``; None: one channel) are judged among
    themselves, since a room or a noise floor moves a speaker's embeddings as far as another
    speaker's would. Among one channel's clips, up to three rounds, each on the clips still
    kept: split them in two (candidates from agglomerative clustering and from each clip's
    nearest neighbours, ``_least_alike_split``), refine each split by moving every clip to the
    group whose mean (without it) it is closer to, and take the split whose groups are least
    alike; its smaller group (of ``MIN_OTHER_CLIPS`` or more) is another speaker if the groups'
    centroids are under ``min_similarity`` alike and at least ``SPLIT_MARGIN`` less alike than
    the most distinct group of the same size within the larger group (a few clips of one
    speaker can sit apart for what they say). Then a lone clip is another speaker if its
    similarity to its channel's speaker is both under ``min_similarity - LONE_CLIP_MARGIN`` and
    ``LONE_CLIP_MADS`` robust deviations below that channel's median. A channel with fewer than
    ``MIN_GROUP_CLIPS`` clips is not judged by the embedder (``SpeakerSplit.unjudged``). With
    several channels, a clip found apart among its channel's clips is left out only if the
    same rounds over the whole upload find it apart too: a measured channel can lump two real
    ones under one label, and the two would then pass for two speakers. Last,
    across every channel, with each clip's ``pitches`` (Hz, None where unmeasured) and
    ``min_pitch_shift`` over 0, a group of clips apart in pitch (``_pitch_apart``: a channel
    does not change a voice's pitch) is another speaker."""
    vectors = np.stack(embeddings) if len(embeddings) else np.zeros((0, 1), np.float32)
    labels = list(channels) if channels is not None else [""] * len(vectors)
    kept = np.ones(len(vectors), dtype=bool)
    excluded: dict[int, str] = {}
    unjudged: list[int] = []
    for label in sorted(set(labels)):
        members = np.array([i for i, own in enumerate(labels) if own == label], dtype=int)
        if members.size < MIN_GROUP_CLIPS:
            unjudged += [int(i) for i in members]
            continue
        _judge_among(vectors, members, kept, excluded, min_similarity)
    if len(set(labels)) > 1:  # and apart in the whole upload too: channels lumped under one
        whole = np.ones(len(vectors), dtype=bool)  # label must not pass for two speakers
        _judge_among(vectors, np.arange(len(vectors)), whole, {}, min_similarity)
        for i in [i for i in excluded if whole[i]]:
            del excluded[i]
            kept[i] = True
    speaker = centroid(list(vectors[kept])) if kept.any() else np.zeros(vectors.shape[1])
    if pitches is not None and min_pitch_shift > 0:
        tones = np.array([np.nan if p is None else 12 * np.log2(p / 100) for p in pitches])
        found = _pitch_apart(vectors, tones, kept, min_pitch_shift)
        if found is not None:
            group, shift, spread, alike, bar = found
            for i in np.flatnonzero(group):
                kept[i] = False
                excluded[int(i)] = (
                    f"another speaker: {int(group.sum())} clips speak "
                    f"{abs(shift):.1f} semitones {'higher' if shift > 0 else 'lower'} than the "
                    f"upload's speaker (whose clips vary by {spread:.1f}), and their voice is "
                    f"{alike:.2f} like the speaker's, less than any {int(group.sum())} of its "
                    f"own clips ({bar:.2f})"
                )
            speaker = centroid(list(vectors[kept]))
    scores = vectors @ speaker if len(vectors) else np.zeros(0)
    if len(set(labels)) < 2 or len(vectors) < MIN_GROUP_CLIPS:  # no split was made of any
        unjudged = []
    unjudged = [i for i in unjudged if kept[i]]
    return SpeakerSplit(speaker, [float(s) for s in scores], excluded, unjudged)


def _judge_among(
    vectors: np.ndarray,
    members: np.ndarray,
    kept: np.ndarray,
    excluded: dict[int, str],
    min_similarity: float,
) -> None:
    """The embedder's rounds and lone-clip rule (``other_speakers``) among the clips
    ``members`` (indices of ``vectors``): what it finds is marked in ``kept`` and
    ``excluded``."""
    for _ in range(3):
        indices = members[kept[members]]
        if indices.size < MIN_GROUP_CLIPS:
            break
        split = _least_alike_split(vectors[indices])
        if split is None:
            break
        alike, minority = split
        rest = vectors[indices][~minority]
        if alike >= min_similarity or alike > _own_spread(rest, int(minority.sum())):
            break
        for i in indices[minority]:
            kept[i] = False
            excluded[int(i)] = (
                f"another speaker: {int(minority.sum())} clips sound alike and their voice is "
                f"{alike:.2f} like the upload's speaker (under {min_similarity:.2f})"
            )
    indices = members[kept[members]]
    if indices.size < MIN_GROUP_CLIPS:
        return
    scores = vectors[indices] @ centroid(list(vectors[indices]))
    middle = float(np.median(scores))
    spread = 1.4826 * float(np.median(np.abs(scores - middle)))
    bar = min(min_similarity - LONE_CLIP_MARGIN, middle - LONE_CLIP_MADS * spread)
    for j in np.flatnonzero(scores < bar):
        i = int(indices[j])
        kept[i] = False
        excluded[i] = (
            f"another speaker: {scores[j]:.2f} like the upload's speaker (a lone clip: under "
            f"{min_similarity - LONE_CLIP_MARGIN:.2f} and far below the other clips)"
        )


def _pitch_apart(
    vectors: np.ndarray, tones: np.ndarray, kept: np.ndarray, min_shift: float
) -> tuple[np.ndarray, float, float, float, float] | None:
    """(mask, shift in semitones, the upload's pitch spread, similarity of the group's speaker
    to the rest's, the least similarity of a random group of the rest) of the group of kept
    clips that stands furthest apart in pitch, or None.

    Candidates: the ``MIN_OTHER_CLIPS`` to ``MAX_SEARCHED_GROUP`` clips highest or lowest in
    pitch (at most a third of the clips). One qualifies when its median pitch is at least
    ``min_shift`` semitones and ``PITCH_DEVIATIONS`` robust deviations of the upload's pitch
    from the rest's median (one speaker's sentences vary; this is how much they vary here), and
    its voice (its centroid) is less like the rest's than that of each of
    ``PITCH_BASELINE_GROUPS`` random groups of as many of the rest's clips: pitch alone, of
    one speaker speaking higher, never qualifies. The qualifying group furthest off in
    deviations wins."""
    indices = np.flatnonzero(kept & np.isfinite(tones))
    if indices.size < MIN_GROUP_CLIPS:
        return None
    pitch, voices = tones[indices], vectors[indices]
    order = np.argsort(pitch, kind="stable")
    middle = float(np.median(pitch))
    spread = 1.4826 * float(np.median(np.abs(pitch - middle)))  # a few odd clips barely move it
    rng = np.random.default_rng(0)  # the same upload always gives the same answer
    best: tuple[float, tuple[np.ndarray, float, float, float, float]] | None = None
    for size in range(MIN_OTHER_CLIPS, min(MAX_SEARCHED_GROUP, indices.size // 3) + 1):
        for ends in (order[:size], order[-size:]):
            group = np.zeros(indices.size, dtype=bool)
            group[ends] = True
            shift = float(np.median(pitch[group])) - float(np.median(pitch[~group]))
            if abs(shift) < max(min_shift, PITCH_DEVIATIONS * spread):
                continue
            deviations = abs(shift) / max(spread, PITCH_SPREAD_FLOOR)
            if best is not None and deviations <= best[0]:
                continue
            alike = _alike(voices, group)
            others = voices[~group]
            bar = 1.0
            for _ in range(PITCH_BASELINE_GROUPS):
                sample = np.zeros(len(others), dtype=bool)
                sample[rng.choice(len(others), size, replace=False)] = True
                bar = min(bar, _alike(others, sample))
            if alike < bar:
                mask = np.zeros(len(vectors), dtype=bool)
                mask[indices[group]] = True
                best = (deviations, (mask, shift, spread, alike, bar))
    return None if best is None else best[1]


def _own_spread(vectors: np.ndarray, size: int) -> float:
    """How far off a group of ``size`` clips of one speaker can be from the rest: the least
    alike of the groups of each clip and its ``size - 1`` nearest, among ``vectors`` (one
    speaker's clips, presumably), less ``SPLIT_MARGIN``; 1 when they are too few."""
    if len(vectors) < max(MIN_GROUP_CLIPS, 2 * size):
        return 1.0
    least = min(_alike(vectors, group) for group in _neighbour_groups(vectors, size))
    return least - SPLIT_MARGIN


def _alike(vectors: np.ndarray, group: np.ndarray) -> float:
    """How alike the speakers (centroids) of ``group`` and of the other clips are."""
    return float(centroid(list(vectors[group])) @ centroid(list(vectors[~group])))


def _neighbour_groups(vectors: np.ndarray, size: int) -> list[np.ndarray]:
    """For each clip, the mask of it and its ``size - 1`` most similar clips."""
    nearest = np.argsort(-(vectors @ vectors.T), axis=1, kind="stable")[:, :size]
    groups = np.zeros((len(vectors), len(vectors)), dtype=bool)
    np.put_along_axis(groups, nearest, True, axis=1)
    return list(groups)


def _least_alike_split(vectors: np.ndarray) -> tuple[float, np.ndarray] | None:
    """(similarity of the two groups' centroids, mask of the smaller group) of the candidate
    split whose groups are least alike; None when none leaves ``MIN_OTHER_CLIPS`` in each.

    Candidates: the two clusters of agglomerative clustering (average and complete linkage on
    cosine distance, Ward on the unit vectors), and the ``NEIGHBOUR_CANDIDATES`` groups of a
    clip and its nearest clips (``MIN_OTHER_CLIPS`` to ``MAX_SEARCHED_GROUP``) that stand
    furthest from the rest (a few clips of another speaker, which clustering often merges
    into the larger group); each refined (``_refined``)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    minorities = []
    for method, metric in (("average", "cosine"), ("complete", "cosine"), ("ward", "euclidean")):
        labels = fcluster(linkage(vectors, method=method, metric=metric), 2, "maxclust")
        minorities.append(labels != np.bincount(labels).argmax())
    largest = min(MAX_SEARCHED_GROUP, len(vectors) // 3)
    groups = [
        group
        for size in range(MIN_OTHER_CLIPS, largest + 1)
        for group in _neighbour_groups(vectors, size)
    ]
    groups.sort(key=lambda group: _mean_alike(vectors, group))
    minorities += groups[:NEIGHBOUR_CANDIDATES]
    best: tuple[float, np.ndarray] | None = None
    for minority in minorities:
        majority = _refined(vectors, ~minority)
        if (~majority).sum() < MIN_OTHER_CLIPS:
            continue
        alike = _alike(vectors, ~majority)
        if best is None or alike < best[0]:
            best = (alike, ~majority)
    return best


def _mean_alike(vectors: np.ndarray, group: np.ndarray) -> float:
    """``_alike`` with mean centroids: cheap, to rank many candidate groups."""
    inside, outside = vectors[group].sum(axis=0), vectors[~group].sum(axis=0)
    return float(inside @ outside / (np.linalg.norm(inside) * np.linalg.norm(outside) + 1e-12))


def _refined(vectors: np.ndarray, majority: np.ndarray, rounds: int = 10) -> np.ndarray:
    """Move each clip to the group whose mean, computed without it, it is closer to, until
    nothing moves; the larger group stays ``True``."""
    for _ in range(rounds):
        if majority.all() or not majority.any():
            return majority
        near = []
        for group in (majority, ~majority):
            without = vectors[group].sum(axis=0)[None, :] - vectors * group[:, None]
            norms = np.linalg.norm(without, axis=1)
            cosine = np.einsum("ij,ij->i", vectors, without) / np.maximum(norms, 1e-12)
            near.append(np.where(norms > 1e-9, cosine, -np.inf))  # a group of just this clip
        moved = near[0] >= near[1]
        if moved.sum() < (~moved).sum():
            moved = ~moved
        if (moved == majority).all():
            break
        majority = moved
    return majority


# -- the upload ------------------------------------------------------------------------------


def assess(
    clips: Sequence[SourceClip],
    embedder: SpeakerEmbedder,
    min_similarity: float = MIN_SIMILARITY,
    min_pitch_shift: float = MIN_PITCH_SHIFT,
) -> DataReport:
    """Measure every clip, leave out the clips of other speakers, and word the warnings."""
    measured = [measure_clip(clip) for clip in clips]
    voiced = [i for i, clip in enumerate(clips) if clip.speech is not None]
    speech = [clips[i].speech for i in voiced]
    channels = [measure_channel(s) for s in speech]
    bands = [c.band for c in channels]
    view = ChannelView(common_band(bands))
    embeddings = [embedder.embed(view.treat(s), SAMPLE_RATE) for s in speech]
    pitches = [voice_pitch(s) for s in speech]
    labels = channel_labels(speech, channels)
    split = other_speakers(embeddings, min_similarity, pitches, min_pitch_shift, labels)
    similarity: dict[int, float] = dict(zip(voiced, split.similarity, strict=True))
    pitch = dict(zip(voiced, pitches, strict=True))
    channel = dict(zip(voiced, labels, strict=True))
    excluded = {voiced[j]: reason for j, reason in split.excluded.items()}
    report_clips = []
    for i, quality in enumerate(measured):
        reason = excluded.get(i) if i in similarity else "no speech found"
        found = {"similarity": similarity.get(i), "excluded": reason, "pitch_hz": pitch.get(i)}
        found["channel"] = channel.get(i)
        report_clips.append(ClipQuality(**{**asdict(quality), **found}))
    kept_seconds = sum(
        clip.speech.size / SAMPLE_RATE
        for clip, quality in zip(clips, report_clips, strict=True)
        if clip.speech is not None and not quality.excluded
    )
    report = DataReport(embedder.name, min_similarity, report_clips, kept_seconds / 60)
    report.band = str(view.band)
    report.clip_bands = dict(Counter(str(b) for b in bands))
    report.unjudged = [clips[voiced[j]].name for j in split.unjudged]
    report.warnings = warnings_for(report)
    return report


# A transcript's pace in its clip's speech, in letters of speech a second (espeak-ng from 120 to
# 240 words a minute: 12-27 in the Latin-script languages, 8-17 in Korean, 6-11 in Mandarin):
# outside these it is no transcript of that clip's speech.
MIN_RATE = 4.0
MAX_RATE = 35.0


def warnings_for(report: DataReport) -> list[str]:
    """The report's findings in plain words."""
    said: list[str] = []
    kept = [c for c in report.clips if not c.excluded]
    if report.speech_minutes < WANTED_MINUTES:
        said.append(
            f"Too little speech: {report.speech_minutes:.1f} minutes usable; a voice sounds like "
            f"its speaker from about {WANTED_MINUTES:.0f} minutes of clean speech on."
        )
    noisy = [c for c in kept if c.snr_db < NOISY_SNR_DB]
    if noisy:
        median = float(np.median([c.snr_db for c in noisy]))
        said.append(
            f"Noisy: {len(noisy)} of {len(kept)} clips have background noise (signal-to-noise "
            f"{median:.0f} dB, under {NOISY_SNR_DB:.0f}); the voice will learn the noise too, so "
            "record somewhere quieter or closer to the microphone."
        )
    clipped = [c for c in kept if c.clipped_share > CLIPPED_SHARE]
    if clipped:
        worst = max(c.clipped_share for c in clipped)
        said.append(
            f"Clipped: {len(clipped)} of {len(kept)} clips were recorded too loud (up to "
            f"{worst:.1%} of their samples at full scale) and are distorted; record at a lower "
            "level."
        )
    if report.band != str(FULL):  # the speaker check is weaker: say so rather than pass
        narrow = report.clip_bands.get(report.band, 0)
        came = (
            f"{narrow} of {sum(report.clip_bands.values())} clips came through a narrower "
            f"band ({report.band}) than the rest, and the speaker check compares every clip in "
            "it"
            if len(report.clip_bands) > 1
            else f"every clip came through a narrow band ({report.band})"
        )
        said.append(
            f"Narrow band: {came}; there the check tells voices apart less well, so a clip of "
            "someone else is less surely found."
        )
    if report.unjudged:
        said.append(
            f"Unjudged: {len(report.unjudged)} clips came through a channel (a room, a noise "
            f"floor, a band, a microphone) fewer than {MIN_GROUP_CLIPS} clips share, and the "
            "speaker embedder is only trusted among clips of one channel: their speaker was "
            f"checked by pitch alone ({', '.join(report.unjudged)})."
        )
    timed = [c for c in kept if c.letters_per_second is not None]
    off = [c for c in timed if not MIN_RATE <= c.letters_per_second <= MAX_RATE]  # type: ignore[operator]
    if off:
        rates = ", ".join(f"{c.file} {c.letters_per_second:.1f}" for c in off[:5])
        said.append(
            f"Transcripts off: {len(off)} clips' transcripts are said at a pace no speech has "
            f"({rates} letters a second; speech runs {MIN_RATE:.0f}-{MAX_RATE:.0f}): a "
            "transcript of another clip, or one cut short; the voice would learn the wrong words."
        )
    others = [c.file for c in report.clips if c.excluded and c.excluded.startswith("another")]
    if others:
        said.append(
            f"Mixed speakers: {len(others)} clips sound like someone else and are left out of "
            f"training: {', '.join(others)}."
        )
    return said


def embedder_with_cache(spec: str | None, folder: Path | None) -> EmbeddingCache:
    return EmbeddingCache(shared_embedder(spec), folder)


def check_data(
    audio: list[Path],
    transcripts: Path | None = None,
    embedder: SpeakerEmbedder | None = None,
    min_similarity: float = MIN_SIMILARITY,
    max_file_seconds: float | None = 3600.0,
    min_pitch_shift: float = MIN_PITCH_SHIFT,
) -> DataReport:
    """The data report of an upload, without training: every file as a clip (a recording over
    15 s cut at its pauses, as training would; no transcript is needed to measure)."""
    recordings, rejected = ingest(audio, max_file_seconds)
    texts = find_transcripts([r.source for r in recordings], transcripts)
    clips: list[SourceClip] = []
    for recording in recordings:
        pieces = [(recording.source.name, recording.samples)]
        if recording.seconds > splitting.MAX_CLIP_SECONDS:
            groups = splitting.group_regions(splitting.speech_regions(recording.samples))
            name, samples = recording.source.name, recording.samples
            pieces = [(f"{name}#{k + 1}", samples[s:e]) for k, (s, e) in enumerate(groups)]
        for name, samples in pieces:
            trimmed = trim(samples)
            speech = None if trimmed is None else trimmed.samples
            text = texts.get(recording.source) if len(pieces) == 1 else None
            clips.append(SourceClip(name, samples, recording.gain, speech, text))
    report = assess(clips, embedder or shared_embedder(None), min_similarity, min_pitch_shift)
    report.rejected = [{"file": r.source.name, "reason": r.reason} for r in rejected]
    short = [r for r in recordings if r.seconds <= splitting.MAX_CLIP_SECONDS]
    untranscribed = [r.source.name for r in short if r.source not in texts]
    if untranscribed:
        report.warnings.append(
            f"No transcript: {len(untranscribed)} clips have none (a metadata.csv or sidecar "
            ".txt); training needs one for each, or an ASR model."
        )
    return report


def main(argv: list[str] | None = None) -> int:
    """``voicehost check-data --audio PATH... [--transcripts F] [--json OUT]``."""
    parser = argparse.ArgumentParser(
        prog="voicehost check-data", description="Measure an upload's audio without training."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", type=Path, nargs="+", required=True, help="files or folders")
    parser.add_argument("--transcripts", type=Path, help="metadata.csv (file|text lines)")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument(
        "--min-similarity",
        type=float,
        help=f"speaker consistency threshold (default: VOICEHOST_SPEAKER_MIN_SIMILARITY, "
        f"{MIN_SIMILARITY})",
    )
    parser.add_argument(
        "--min-pitch-shift",
        type=float,
        help=f"semitones a group of clips stands apart in pitch to be another speaker, 0: off "
        f"(default: VOICEHOST_SPEAKER_MIN_PITCH_SHIFT, {MIN_PITCH_SHIFT})",
    )


def run(args: argparse.Namespace) -> int:
    from voicehost.config import Settings

    settings = Settings()
    threshold = args.min_similarity
    if threshold is None:
        threshold = settings.speaker_min_similarity
    shift = args.min_pitch_shift
    if shift is None:
        shift = settings.speaker_min_pitch_shift
    embedder = shared_embedder(settings.speaker_embedder)
    report = check_data(args.audio, args.transcripts, embedder, threshold, min_pitch_shift=shift)
    print(describe(report))
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2))
    return 0


def describe(report: DataReport) -> str:
    """The report as a table and its warnings, for a terminal."""
    lines = [
        f"{'clip':32s} {'s':>5s} {'speech':>6s} {'SNR dB':>6s} {'clip%':>6s} {'LUFS':>6s} "
        f"{'speaker':>7s} {'F0 Hz':>5s} {'channel':24s}  excluded"
    ]
    for c in report.clips:
        lufs = "-" if c.loudness_lufs is None else f"{c.loudness_lufs:.1f}"
        similar = "-" if c.similarity is None else f"{c.similarity:.3f}"
        pitch = "-" if c.pitch_hz is None else f"{c.pitch_hz:.0f}"
        lines.append(
            f"{c.file[:32]:32s} {c.seconds:5.1f} {c.speech_share:6.0%} {c.snr_db:6.1f} "
            f"{c.clipped_share:6.2%} {lufs:>6s} {similar:>7s} {pitch:>5s} "
            f"{(c.channel or '-')[:24]:24s}  {c.excluded or ''}"
        )
    lines.append(
        f"{report.speech_minutes:.2f} minutes of usable speech in "
        f"{len(report.clips) - len(report.excluded)} of {len(report.clips)} clips "
        f"(speaker similarity by {report.embedder}, heard in {report.band})"
    )
    lines += [f"rejected {r['file']}: {r['reason']}" for r in report.rejected]
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
