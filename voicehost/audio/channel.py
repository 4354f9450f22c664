"""The channel a clip came through, and how the speaker checks look past it.

A real upload is not one studio session: a phone memo, a podcast excerpt, a laptop in a kitchen.
A speaker embedder hears the channel as well as the speaker: a clip band-limited to a telephone
line lands away from the same person's clean clips, and a check that compares raw embeddings
takes that distance for another speaker. So every speaker check
(the training data's speaker filter, the consent match, a clone's evaluation) compares clips
as one channel would carry them all (``ChannelView``):

- **one band**: each clip's band is measured (``measure_band``: where its long-term spectrum
  falls away at the top, quantised to the bands channels have: a telephone line's 300-3400 Hz,
  a low-rate codec's 5-7 kHz, the embedder's whole 8 kHz), and every clip is limited to the band
  they all have (``common_band``): what one clip lacks, no clip is judged by;
- **one level**, as an option (``levelled``): every clip scaled to one RMS. Off: an upload's
  clips are loudness-normalised when ingested, and levelling once more did not help.

A room's reverb or a noise floor moves a speaker's embedding as far as another speaker's, which
no band or level undoes; for those the training data's filter judges like with like: each
clip's channel is measured (``measure_channel``: its band, how its speech's envelope falls and
what fills its pauses; ``channel_labels``: a thin microphone among the upload's clips), and the
clips of one channel are judged among themselves (``lora_training.quality.other_speakers``).
What each cue does is measured by ``scripts/bench_channels.py`` (docs/CLONING.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE

EMBEDDER_TOP_HZ = 8000  # the speaker embedder hears up to here (16 kHz input)
TOP_EDGES_HZ = (3400, 5000, 6000, 7000, EMBEDDER_TOP_HZ)  # where channels cut the highs
NARROW_LOW_HZ = 300  # a telephone line's low edge
CORE_HZ = (300, 3000)  # every channel carries this; the spectrum's level is measured here
TOP_FLOOR_DB = 45.0  # under the core's level by this much: past the band's top edge
EDGE_SLACK_HZ = 250  # an edge measured this far under a quantised one still counts as it
TRANSITION_HZ = 100  # a limited band's edges roll off over this width (no ringing)
LEVEL_DBFS = -30.0  # the level ``levelled`` brings every clip to (Resemblyzer's own target)
WELCH_SAMPLES = 512


@dataclass(frozen=True, slots=True)
class Band:
    """The frequencies a clip holds: ``low`` (0: down to DC) to ``high`` Hz."""

    low: int = 0
    high: int = EMBEDDER_TOP_HZ

    @property
    def full(self) -> bool:
        return self.low == 0 and self.high >= EMBEDDER_TOP_HZ

    def __str__(self) -> str:
        return f"{self.low}-{self.high} Hz"


FULL = Band()


def spectrum_db(samples: np.ndarray, rate: int = SAMPLE_RATE) -> tuple[np.ndarray, np.ndarray]:
    """(frequencies, power in dB) of ``samples``' long-term average spectrum (Welch)."""
    from scipy import signal

    audio = np.asarray(samples, dtype=np.float64).reshape(-1)
    size = min(WELCH_SAMPLES, audio.size)
    freqs, power = signal.welch(audio, rate, nperseg=size)
    return freqs, 10 * np.log10(power + 1e-20)


def measure_band(samples: np.ndarray, rate: int = SAMPLE_RATE) -> Band:
    """The band ``samples`` hold: its top edge, where the spectrum stays ``TOP_FLOOR_DB`` under
    its level in ``CORE_HZ``, quantised down to ``TOP_EDGES_HZ``; a telephone line's top edge
    comes with its low one (``NARROW_LOW_HZ``), since the line cuts both (a low edge measured
    alone would follow the voice: a high voice has little energy where a low one has its
    pitch). Too short or silent: ``FULL``."""
    if np.asarray(samples).size < WELCH_SAMPLES or not np.any(samples):
        return FULL
    freqs, db = spectrum_db(samples, rate)
    core = db[(freqs >= CORE_HZ[0]) & (freqs <= CORE_HZ[1])]
    level = float(np.median(core))
    heard = freqs[(db >= level - TOP_FLOOR_DB) & (freqs <= EMBEDDER_TOP_HZ)]
    top = float(heard.max()) if heard.size else float(CORE_HZ[1])
    high = max([e for e in TOP_EDGES_HZ if e <= top + EDGE_SLACK_HZ], default=TOP_EDGES_HZ[0])
    return Band(NARROW_LOW_HZ if high == TOP_EDGES_HZ[0] else 0, high)


ENVELOPE_HOP_S = 0.01  # the speech envelope's frames (dB of each 10 ms, smoothed over 3)
NOISY_RANGE_DB = 26.0  # an envelope spanning less than this (p95 - p10) is over a floor
VERY_NOISY_RANGE_DB = 19.0  # ... a high one (speech about 10 dB over noise)
REVERBERANT_FALL_DB = 3.2  # speech whose envelope never falls faster than this per 10 ms ...
VERY_REVERBERANT_FALL_DB = 2.2  # (in a room of about 0.3 s of reverb; of about 1 s)


@dataclass(frozen=True, slots=True)
class Channel:
    """What a clip's channel did to it, in the few classes a speaker check tells apart: its
    ``band``, and ``room``: ``dry``; ``floor`` or ``high floor`` (something fills the pauses
    under the speech: noise, or a hall's reverb tail); ``reverberant`` or ``very reverberant``
    (a room's reverb holds back the speech's falls). The names say what is measured, not
    what caused it: a check needs clips of one channel to share a label, not the label to be
    right."""

    band: Band
    room: str

    def __str__(self) -> str:
        return f"{self.band}, {self.room}"


def measure_channel(samples: np.ndarray, rate: int = SAMPLE_RATE) -> Channel:
    """The clip's ``Channel``. A room is heard in how the speech's envelope falls at the ends of
    sounds: dry speech falls by 6-30 dB in 10 ms (at the 98th percentile of its falls), a room's
    reverb holds it to its decay rate (60 dB over its reverberation time); a floor (noise, a
    long reverb tail) in the envelope's range (95th less 10th percentile of its 10 ms levels).
    Short or silent clips: dry. The thresholds were set on the simulated rooms and noise of
    ``scripts/bench_channels.py``, which also measures channels held out from that."""
    audio = np.asarray(samples, dtype=np.float64).reshape(-1)
    hop = int(ENVELOPE_HOP_S * rate)
    count = audio.size // hop
    if count < 20 or not np.any(audio):
        return Channel(measure_band(samples, rate), "dry")
    power = np.mean(audio[: count * hop].reshape(count, hop) ** 2, axis=1)
    envelope = np.convolve(10 * np.log10(power + 1e-12), np.ones(3) / 3, mode="same")
    top, bottom = np.percentile(envelope, [95, 10])
    falls = -np.diff(envelope)[envelope[:-1] > top - 30]
    steepest = float(np.percentile(falls, 98)) if falls.size else 0.0
    if top - bottom < VERY_NOISY_RANGE_DB:
        room = "high floor"
    elif top - bottom < NOISY_RANGE_DB:
        room = "floor"
    elif steepest < VERY_REVERBERANT_FALL_DB:
        room = "very reverberant"
    elif steepest < REVERBERANT_FALL_DB:
        room = "reverberant"
    else:
        room = "dry"
    return Channel(measure_band(samples, rate), room)


LOW_BAND_HZ = (60, 200)  # where a small microphone's low cut shows ...
MID_BAND_HZ = (500, 1500)  # ... against the voice's own core
COLOUR_APART_DB = 7.0  # two groups of one channel class this far apart in their lows: two mics
MIN_COLOUR_GROUP = 6  # fewer: as likely a voice of its own as a microphone


def lows_db(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    """How much low end a clip has: its spectrum's level in ``LOW_BAND_HZ`` less that in
    ``MID_BAND_HZ``, in dB (a thin microphone cuts the first, a voice fills the second)."""
    freqs, db = spectrum_db(samples, rate)
    low = db[(freqs >= LOW_BAND_HZ[0]) & (freqs <= LOW_BAND_HZ[1])]
    mid = db[(freqs >= MID_BAND_HZ[0]) & (freqs <= MID_BAND_HZ[1])]
    return float(np.mean(low) - np.mean(mid)) if low.size and mid.size else 0.0


def channel_labels(
    clips: Sequence[np.ndarray],
    measured: Sequence[Channel] | None = None,
    rate: int = SAMPLE_RATE,
) -> list[str]:
    """A label per clip naming its channel, for checks that compare like with like: its
    ``Channel`` (``measured``, or measured here), and, where the clips of one channel class
    fall in two groups by their low end (``lows_db``, medians ``COLOUR_APART_DB`` apart,
    ``MIN_COLOUR_GROUP`` clips or more each), which group: two microphones, one thin (a small
    one's low cut), one full. The split is judged within the upload, since voices differ in
    their low end as well."""
    if measured is None:
        measured = [measure_channel(clip, rate) for clip in clips]
    channels = [str(channel) for channel in measured]
    lows = np.array([lows_db(clip, rate) for clip in clips]) if len(clips) else np.zeros(0)
    labels = list(channels)
    for name in set(channels):
        members = np.array([i for i, c in enumerate(channels) if c == name], dtype=int)
        thin = _two_microphones(lows[members])
        for i in members[thin]:
            labels[i] = f"{name}, thin"
    return labels


def _two_microphones(lows: np.ndarray) -> np.ndarray:
    """The mask of the thinner group when ``lows`` fall in two groups (see
    ``channel_labels``); all False when they do not."""
    thin = np.zeros(lows.size, dtype=bool)
    if lows.size < 2 * MIN_COLOUR_GROUP:
        return thin
    order = np.argsort(lows, kind="stable")
    ranked = lows[order]
    best, cut = 0.0, 0
    for k in range(MIN_COLOUR_GROUP, lows.size - MIN_COLOUR_GROUP + 1):
        apart = float(np.median(ranked[k:]) - np.median(ranked[:k]))
        score = apart * np.sqrt(k * (lows.size - k) / lows.size)
        if apart >= COLOUR_APART_DB and score > best:
            best, cut = score, k
    if not cut:
        return thin
    thin[order[:cut]] = True
    for _ in range(5):  # each clip to the nearer group: a cut at a size alone takes in strays
        low, high = float(np.median(lows[thin])), float(np.median(lows[~thin]))
        nearer = np.abs(lows - low) < np.abs(lows - high)
        if (nearer == thin).all():
            break
        thin = nearer
        if min(thin.sum(), (~thin).sum()) < MIN_COLOUR_GROUP:
            return np.zeros(lows.size, dtype=bool)
    apart = float(np.median(lows[~thin]) - np.median(lows[thin]))
    return thin if apart >= COLOUR_APART_DB else np.zeros(lows.size, dtype=bool)


def common_band(bands: Iterable[Band]) -> Band:
    """The band every one of ``bands`` holds."""
    found = list(bands)
    if not found:
        return FULL
    return Band(max(b.low for b in found), min(b.high for b in found))


def limit(samples: np.ndarray, band: Band, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` with nothing outside ``band`` (zero-phase: an FFT mask whose edges roll off
    over ``TRANSITION_HZ``)."""
    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    if band.full or audio.size == 0:
        return audio
    spectrum = np.fft.rfft(audio.astype(np.float64))
    freqs = np.fft.rfftfreq(audio.size, 1 / rate)
    gain = np.ones_like(freqs)
    if band.high < rate / 2:
        gain *= _roll(freqs, band.high, falling=True)
    if band.low > 0:
        gain *= _roll(freqs, band.low, falling=False)
    return np.fft.irfft(spectrum * gain, audio.size).astype(np.float32)


def _roll(freqs: np.ndarray, edge: float, falling: bool) -> np.ndarray:
    """1 inside the band, 0 outside, a raised-cosine ``TRANSITION_HZ`` wide centred on
    ``edge``."""
    x = np.clip((freqs - edge) / TRANSITION_HZ + 0.5, 0.0, 1.0)
    rise = 0.5 - 0.5 * np.cos(np.pi * x)
    return 1.0 - rise if falling else rise


def level(samples: np.ndarray, dbfs: float = LEVEL_DBFS) -> np.ndarray:
    """``samples`` scaled up or down to ``dbfs`` RMS (silence left as it is)."""
    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    if rms <= 0:
        return audio
    return (audio * (10 ** (dbfs / 20) / rms)).astype(np.float32)


@dataclass(frozen=True, slots=True)
class ChannelView:
    """How a speaker check hears a set of clips: each limited to ``band`` (the band they all
    have), and with ``levelled`` brought to one level. ``of`` measures it from the clips."""

    band: Band = FULL
    levelled: bool = False  # measured: no better (ingest has evened the loudness already)

    @classmethod
    def of(cls, clips: Iterable[np.ndarray], rate: int = SAMPLE_RATE) -> ChannelView:
        return cls.of_bands(measure_band(clip, rate) for clip in clips)

    @classmethod
    def of_bands(cls, bands: Iterable[Band]) -> ChannelView:
        return cls(common_band(bands))

    def treat(self, samples: np.ndarray, rate: int = SAMPLE_RATE) -> np.ndarray:
        audio = limit(samples, self.band, rate)
        return level(audio) if self.levelled else audio


RAW = ChannelView()  # every clip as it is
