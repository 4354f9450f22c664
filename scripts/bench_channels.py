"""The speaker checks on uploads as people make them: one person through several channels.

``scripts/bench_eval.py`` measures the speaker filter on uploads recorded in one channel. Real
uploads mix a phone memo, a podcast excerpt and a laptop in a kitchen. This script builds such
uploads and measures what the filter (``lora_training.quality.other_speakers``) makes of them,
with each way of looking past the channel (``voicehost.audio.channel.ChannelView``) and without.

Speakers (espeak-ng voice variants: its accents of one voice share one timbre, its variants are
different speakers), each saying ``SENTENCES`` (36): four men's and four women's voices, each
with an accent of its own; and two of them (one man, one woman) pitched up 1.5 and down 2
semitones by sox (the same timbre, another pitch).

Channels (``CHANNELS``), applied to each clip as its recording would be, then loudness-normalised
and trimmed as an upload is: ``clean``; ``phone`` (8 kHz, 300-3400 Hz, mu-law); ``room_small``
and ``room_large`` (reverb of 0.35 s and 1.0 s); ``noise20`` and ``noise10`` (pink noise at 20
and 10 dB SNR); ``mp3_24k`` and ``opus_12k`` (low-bitrate codecs); ``cheap_mic`` (a 250 Hz-6.5
kHz microphone with a presence peak, overdriven); ``loud`` (peak-normalised to full scale). Held
out, never looked at while the channel cues were chosen and set: ``sox_hall`` (sox's reverb 80 50
100), ``white15`` (white noise at 15 dB SNR), ``tinny`` (sox: high-pass 300 Hz, treble +6 dB).

Uploads, ``--draws`` per speaker and class, each of ``--genuine`` clips of one speaker:

- genuine only: in one channel (``clean``, or each other channel alone), or mixed: the clips
  spread over two, three or four channels (``clean`` and others, or others alone), and the
  issue's example, ``phone + room_small + clean``, and clean with held-out channels: the share
  wrongly excluded;
- with ``--injected`` clips of another speaker saying other sentences: another timbre of the
  same sex, the other sex, or the same voice pitched; the genuine clips in ``clean`` or mixed
  over two to four channels, or in clean and the three held-out channels, the injected ones in
  one of those channels: the share caught and the share of genuine clips wrongly excluded.

Each ``--views`` row is one way of hearing the clips: ``raw`` (as the filter did before:
every clip as uploaded), ``level`` (every clip at one RMS), ``band`` (a ``ChannelView``: every
clip in the upload's common band) and ``band+level``; with ``like``, the filter judges like with
like (each clip's room, noise and band, ``measure_channel``), with ``like+mics`` its microphone
too (``channel_labels``). The checks use ``band+like+mics``. Prints a table per
view and, last, one JSON line.

Usage::

    python scripts/bench_channels.py [--work-dir DIR] [--genuine 24] [--injected 3] [--draws 6]
        [--views raw,band,band+like+mics] [--embedder SPEC] [--json OUT]

Clips and embeddings are cached in ``--work-dir``: a first run embeds about 5,000 clips per
view (about 10 minutes a view on 2 cores); later runs take a minute.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lora_training import quality
from lora_training.ingest import decode, normalise_loudness
from lora_training.trim import trim
from voicehost.audio.channel import (
    FULL,
    Band,
    Channel,
    ChannelView,
    channel_labels,
    common_band,
    measure_channel,
)
from voicehost.audio.speaker import EmbeddingCache, shared_embedder
from voicehost.model.orpheus import SAMPLE_RATE as RATE
from voicehost.tools.devcorpus import SENTENCES, speak

MEN = ["en+m1", "en-us+m2", "en-gb-scotland+m3", "en-029+m4"]
WOMEN = ["en-gb-x-rp+f1", "en-us-nyc+f2", "en+f3", "en-us+f4"]
PITCHED_OF = [MEN[0], WOMEN[1]]
PITCH_CENTS = {"up1.5": 150, "down2": -200}


# -- channels ---------------------------------------------------------------------------------


def _butter(kind: str, edges: float | list[float], rate: int, order: int) -> np.ndarray:
    from scipy import signal

    return signal.butter(order, edges, kind, fs=rate, output="sos")


def phone(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A telephone line: 8 kHz, 300-3400 Hz, 8-bit mu-law."""
    import soxr
    from scipy import signal

    y = signal.sosfilt(_butter("bandpass", [300, 3400], 8000, 4), soxr.resample(x, RATE, 8000))
    mu = 255.0
    coded = np.round(np.sign(y) * np.log1p(mu * np.minimum(np.abs(y), 1)) / np.log1p(mu) * 127)
    y = np.sign(coded) * ((1 + mu) ** (np.abs(coded) / 127) - 1) / mu
    return soxr.resample(y.astype(np.float32), 8000, RATE)


def room(x: np.ndarray, rng: np.random.Generator, rt60: float, direct_db: float) -> np.ndarray:
    """A room: decaying noise (``rt60`` s, highs absorbed) after the direct sound, the tail
    ``direct_db`` under it in energy."""
    from scipy import signal

    n = int(rt60 * RATE)
    tail = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / RATE / rt60)
    tail = signal.sosfilt(_butter("lowpass", 5000, RATE, 2), tail)
    tail[: int(0.005 * RATE)] = 0  # the first reflections after 5 ms
    response = tail / np.sqrt(np.sum(tail**2)) * 10 ** (-direct_db / 20)
    response[0] += 1.0
    y = signal.fftconvolve(x, response)[: x.size + n // 2]
    return (y / (np.max(np.abs(y)) + 1e-9) * np.max(np.abs(x))).astype(np.float32)


def noise(x: np.ndarray, rng: np.random.Generator, snr_db: float) -> np.ndarray:
    """Pink noise ``snr_db`` under the speech's power."""
    active = x[np.abs(x) > 0.02 * np.max(np.abs(x))]
    power = float(np.mean(active**2))
    white = np.fft.rfft(rng.standard_normal(x.size))
    white /= np.sqrt(np.maximum(np.arange(white.size), 1))
    pink = np.fft.irfft(white, x.size)
    pink *= np.sqrt(power / np.mean(pink**2) / 10 ** (snr_db / 10))
    return (x + pink).astype(np.float32)


def codec(x: np.ndarray, rng: np.random.Generator, name: str, bitrate: int) -> np.ndarray:
    """Through a codec's encoder (``libmp3lame`` at 24 kHz, ``libopus`` at 48 kHz) and back."""
    import av
    import soxr

    rate = RATE if name == "libmp3lame" else 48000
    source = x if rate == RATE else soxr.resample(x, RATE, rate)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp3" if name == "libmp3lame" else "ogg") as out:
        stream = out.add_stream(name, rate=rate)
        stream.bit_rate = bitrate
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            source.astype(np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    buffer.seek(0)
    with av.open(buffer) as coded:
        parts = [f.to_ndarray().reshape(-1) for f in coded.decode(audio=0)]
        got = coded.streams.audio[0].rate
    y = np.concatenate(parts).astype(np.float32)
    return y if got == RATE else soxr.resample(y, got, RATE)


def cheap_mic(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A small microphone: 250 Hz-6.5 kHz, a presence peak at 3 kHz, overdriven a little."""
    from scipy import signal

    y = signal.sosfilt(_butter("bandpass", [250, 6500], RATE, 2), x)
    b, a = signal.iirpeak(3000, 1.5, fs=RATE)
    y = y + 1.5 * signal.lfilter(b, a, y)
    return (np.tanh(3 * y / (np.max(np.abs(y)) + 1e-9)) * 0.5).astype(np.float32)


def sox_effect(x: np.ndarray, *effect: str) -> np.ndarray:
    """``x`` through a sox effect chain."""
    import tempfile

    import soundfile

    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder) / "in.wav", Path(folder) / "out.wav"
        soundfile.write(source, x, RATE, subtype="FLOAT")
        subprocess.run(["sox", str(source), str(out), *effect], check=True, capture_output=True)
        y, _ = soundfile.read(out, dtype="float32")
    return y


def white(x: np.ndarray, rng: np.random.Generator, snr_db: float) -> np.ndarray:
    """White noise ``snr_db`` under the speech's power."""
    active = x[np.abs(x) > 0.02 * np.max(np.abs(x))]
    noise = rng.standard_normal(x.size) * np.sqrt(np.mean(active**2) / 10 ** (snr_db / 10))
    return (x + noise).astype(np.float32)


Simulation = Callable[[np.ndarray, np.random.Generator], np.ndarray]
CHANNELS: dict[str, Simulation] = {
    "clean": lambda x, rng: x,
    "phone": phone,
    "room_small": lambda x, rng: room(x, rng, 0.35, 3.0),
    "room_large": lambda x, rng: room(x, rng, 1.0, -3.0),
    "noise20": lambda x, rng: noise(x, rng, 20),
    "noise10": lambda x, rng: noise(x, rng, 10),
    "mp3_24k": lambda x, rng: codec(x, rng, "libmp3lame", 24000),
    "opus_12k": lambda x, rng: codec(x, rng, "libopus", 12000),
    "cheap_mic": cheap_mic,
    "loud": lambda x, rng: (x / (np.max(np.abs(x)) + 1e-9) * 0.98).astype(np.float32),
    # held out: never looked at while the channel cues were chosen and set
    "sox_hall": lambda x, rng: sox_effect(x, "reverb", "80", "50", "100"),
    "white15": lambda x, rng: white(x, rng, 15),
    "tinny": lambda x, rng: sox_effect(x, "highpass", "300", "treble", "+6", "3000"),
}
HELD_OUT = ["sox_hall", "white15", "tinny"]
OTHERS = [c for c in CHANNELS if c != "clean" and c not in HELD_OUT]


# -- clips ------------------------------------------------------------------------------------


def make_sources(work: Path) -> dict[str, list[Path]]:
    """Each speaker's clean clips, one per sentence (cached in ``work``)."""
    speakers: dict[str, list[Path]] = {}
    for voice in MEN + WOMEN:
        folder = work / voice
        folder.mkdir(parents=True, exist_ok=True)
        speakers[voice] = []
        for index, text in enumerate(SENTENCES):
            path = folder / f"{index:02d}.wav"
            if not path.exists():
                speak(text, path, 0.3, "wav", voice=voice)
            speakers[voice].append(path)
    for voice, (name, cents) in itertools.product(PITCHED_OF, PITCH_CENTS.items()):
        folder = work / f"{voice}~{name}"
        folder.mkdir(exist_ok=True)
        speakers[folder.name] = []
        for source in speakers[voice]:
            path = folder / source.name
            if not path.exists():
                command = ["sox", str(source), str(path), "pitch", str(cents)]
                subprocess.run(command, check=True, capture_output=True)
            speakers[folder.name].append(path)
    return speakers


@dataclass(frozen=True, slots=True)
class Clip:
    speech: np.ndarray  # trimmed, as an upload's clip reaches the filter
    channel: Channel  # as measured
    pitch: float | None


def make_clips(sources: dict[str, list[Path]], work: Path) -> dict[tuple[str, str], list[Clip]]:
    """(speaker, channel) -> its clips: the channel applied to the decoded clip, then
    loudness-normalised and trimmed as ``ingest`` and ``prepare`` do (cached in ``work``)."""
    clips: dict[tuple[str, str], list[Clip]] = {}
    work.mkdir(parents=True, exist_ok=True)
    for speaker, paths in sources.items():
        for c, channel in enumerate(CHANNELS):
            cache = work / f"{speaker}@{channel}.npz"
            if not cache.exists():
                speech = []
                for s, path in enumerate(paths):
                    rng = np.random.default_rng([c, s, len(speaker)])
                    heard = normalise_loudness(CHANNELS[channel](decode(path), rng))
                    trimmed = trim(heard)
                    assert trimmed is not None, (speaker, channel, path)
                    speech.append(trimmed.samples)
                pitches = [quality.voice_pitch(s) or 0.0 for s in speech]
                np.savez(cache, *speech, pitches=np.array(pitches))
            with np.load(cache) as stored:
                speech = [stored[f"arr_{i}"] for i in range(len(paths))]
                pitches = [float(p) or None for p in stored["pitches"]]
            clips[speaker, channel] = [
                Clip(s, measure_channel(s), p) for s, p in zip(speech, pitches, strict=True)
            ]
    return clips


# -- uploads ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upload:
    """Clips by (speaker, channel, sentence); the first ``genuine`` are the speaker's."""

    clips: list[tuple[str, str, int]]
    genuine: int


def mixed_channels(rng: np.random.Generator, count: int, with_clean: bool) -> list[str]:
    pool = list(OTHERS)
    chosen = [str(c) for c in rng.choice(pool, count - with_clean, replace=False)]
    return (["clean"] if with_clean else []) + chosen


def genuine_upload(
    speaker: str, channels: list[str], size: int, rng: np.random.Generator
) -> Upload:
    """``size`` clips of ``speaker``, different sentences, spread evenly over ``channels``."""
    sentences = rng.permutation(len(SENTENCES))[:size]
    spread = [channels[i % len(channels)] for i in range(size)]
    return Upload([(speaker, c, int(s)) for c, s in zip(spread, sentences, strict=True)], size)


def injected_upload(
    speaker: str, other: str, channels: list[str], into: str, size: int, extra: int, rng
) -> Upload:
    """A ``genuine_upload`` plus ``extra`` clips of ``other`` in channel ``into``, saying
    sentences the genuine clips do not."""
    base = genuine_upload(speaker, channels, size, rng)
    said = {s for _, _, s in base.clips}
    unsaid = [s for s in rng.permutation(len(SENTENCES)) if s not in said][:extra]
    return Upload(base.clips + [(other, into, int(s)) for s in unsaid], size)


def classes(rng: np.random.Generator, genuine: int, extra: int, draws: int) -> dict:
    """Class name -> its uploads (see the module docstring)."""
    speakers = MEN + WOMEN
    found: dict[str, list[Upload]] = {}

    def add(name: str, upload: Upload) -> None:
        found.setdefault(name, []).append(upload)

    for speaker, _ in itertools.product(speakers, range(draws)):
        add("genuine: clean", genuine_upload(speaker, ["clean"], genuine, rng))
        alone = str(rng.choice(OTHERS))
        add("genuine: one other channel", genuine_upload(speaker, [alone], genuine, rng))
        for count in (2, 3, 4):
            mixed = mixed_channels(rng, count, with_clean=True)
            upload = genuine_upload(speaker, mixed, genuine, rng)
            add(f"genuine: clean + {count - 1} channels", upload)
        mixed = mixed_channels(rng, int(rng.integers(2, 5)), with_clean=False)
        add("genuine: 2-4 channels, none clean", genuine_upload(speaker, mixed, genuine, rng))
        example = ["phone", "room_small", "clean"]
        add("genuine: phone + room_small + clean", genuine_upload(speaker, example, genuine, rng))
        held = ["clean", str(rng.choice(HELD_OUT))]
        add("genuine: clean + 1 held-out channel", genuine_upload(speaker, held, genuine, rng))
        add(
            "genuine: clean + 3 held-out",
            genuine_upload(speaker, ["clean", *HELD_OUT], genuine, rng),
        )
    for speaker, _ in itertools.product(speakers, range(draws)):
        same_sex = MEN if speaker in MEN else WOMEN
        kinds = {
            "timbre": [s for s in same_sex if s != speaker],
            "sex": WOMEN if speaker in MEN else MEN,
        }
        if speaker in PITCHED_OF:
            kinds["pitched"] = [f"{speaker}~{n}" for n in PITCH_CENTS]
        for kind, others in kinds.items():
            other = str(rng.choice(others))
            clean = injected_upload(speaker, other, ["clean"], "clean", genuine, extra, rng)
            add(f"{kind}: all clean", clean)
            mixed = mixed_channels(rng, int(rng.integers(2, 5)), with_clean=bool(rng.integers(2)))
            into = str(rng.choice(mixed))
            add(
                f"{kind}: mixed channels",
                injected_upload(speaker, other, mixed, into, genuine, extra, rng),
            )
            one = str(rng.choice(OTHERS))
            add(
                f"{kind}: one other channel",
                injected_upload(speaker, other, [one], one, genuine, extra, rng),
            )
            held = ["clean", *HELD_OUT]
            into = str(rng.choice(held))
            add(
                f"{kind}: held-out channels",
                injected_upload(speaker, other, held, into, genuine, extra, rng),
            )
    return found


# -- views and the filter ---------------------------------------------------------------------


def view_of(name: str, bands: list[Band]) -> ChannelView:
    band = common_band(bands) if "band" in name else FULL
    return ChannelView(band, levelled="level" in name)


def labels_of(name: str, chosen: list[Clip]) -> list[str] | None:
    """Each clip's measured channel, with which the filter judges like with like: ``like``,
    the room and the band (``measure_channel``); ``like+mics``, the microphones too
    (``channel_labels``)."""
    if "mics" in name:
        return channel_labels([c.speech for c in chosen], [c.channel for c in chosen])
    return [str(c.channel) for c in chosen] if "like" in name else None


def judge(
    upload: Upload,
    clips: dict[tuple[str, str], list[Clip]],
    embedder: EmbeddingCache,
    view_name: str,
) -> tuple[int, int]:
    """(genuine clips excluded, injected clips caught) by the filter under one view."""
    chosen = [clips[speaker, channel][s] for speaker, channel, s in upload.clips]
    view = view_of(view_name, [c.channel.band for c in chosen])
    vectors = [embedder.embed(view.treat(c.speech)) for c in chosen]
    pitches = [c.pitch for c in chosen]
    split = quality.other_speakers(vectors, pitches=pitches, channels=labels_of(view_name, chosen))
    wrong = sum(1 for i in split.excluded if i < upload.genuine)
    return wrong, len(split.excluded) - wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/voicehost-bench-channels"))
    parser.add_argument("--genuine", type=int, default=24)
    parser.add_argument("--injected", type=int, default=3)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument(
        "--views", default="raw,level,band,band+level,like,band+like,band+like+mics"
    )
    parser.add_argument(
        "--embedder",
        "--encoder",
        help="a load_embedder spec (default: resemblyzer; --encoder: its name before)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    start = time.perf_counter()
    sources = make_sources(args.work_dir / "speakers")
    clips = make_clips(sources, args.work_dir / "clips")
    print(f"{len(clips)} speaker-channels, {sum(map(len, clips.values()))} clips in ", end="")
    print(f"{time.perf_counter() - start:.0f} s")
    cache = f"embeddings-{args.embedder}".replace("/", "_") if args.embedder else "embeddings"
    embedder = EmbeddingCache(shared_embedder(args.embedder), args.work_dir / cache)
    uploads = classes(np.random.default_rng(0), args.genuine, args.injected, args.draws)
    result: dict = {"embedder": embedder.name, "args": {k: str(v) for k, v in vars(args).items()}}
    for view in args.views.split(","):
        start = time.perf_counter()
        rows = {}
        for name, members in uploads.items():
            genuine = sum(u.genuine for u in members)
            injected = sum(len(u.clips) - u.genuine for u in members)
            wrong = caught = 0
            for upload in members:
                w, c = judge(upload, clips, embedder, view)
                wrong, caught = wrong + w, caught + c
            rows[name] = {
                "uploads": len(members),
                "excluded": [wrong, genuine],
                "caught": [caught, injected] if injected else None,
            }
        result[view] = rows
        print(f"\nview {view} ({time.perf_counter() - start:.0f} s): class, uploads, ", end="")
        print("genuine clips wrongly excluded, injected clips caught")
        for name, row in rows.items():
            wrong, genuine = row["excluded"]
            line = f"  {name:38s} {row['uploads']:3d}  {wrong:4d}/{genuine:<5d} "
            line += f"{wrong / genuine:6.1%}"
            if row["caught"]:
                caught, injected = row["caught"]
                line += f"   {caught:3d}/{injected:<4d} {caught / injected:6.1%}"
            print(line)
    line = json.dumps(result)
    if args.json:
        args.json.write_text(line)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
