"""A small real-speech corpus with known text, spoken by espeak-ng: the audio input of the
training tests and benchmarks (the dev model's counterpart: built on the spot, no download).
Needs the ``espeak-ng`` and ``sox`` commands."""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "A journey of a thousand miles begins with a single step.",
    "Please call me back when you have a moment.",
    "The weather today is cloudy with a chance of rain.",
    "We will meet at the station at half past nine.",
    "Every morning he walks the dog around the park.",
    "The library closes early on Sundays.",
    "Could you pass the salt and pepper, please?",
    "Our train was delayed by almost an hour.",
    "The children built a castle out of sand.",
    "This recipe needs two eggs and a cup of flour.",
    "The meeting has been moved to Thursday afternoon.",
    "He painted the fence a bright shade of green.",
    "Turn left at the second traffic light.",
    "The museum opens its new exhibit next week.",
    "I forgot my umbrella on the bus again.",
    "The garden is full of roses and tulips.",
    "Remember to water the plants while I am away.",
    "The concert was louder than we expected.",
    "Her brother studies music at the university.",
    "The old bridge was closed for repairs.",
    "We watched the sunset from the top of the hill.",
    "Coffee tastes better on a cold winter morning.",
    "The pilot announced that we would land soon.",
    "My neighbour grows tomatoes on his balcony.",
    "The store sells fresh bread every morning.",
    "They sailed across the lake in a small boat.",
    "The students listened carefully to the lecture.",
    "A gentle breeze moved the curtains.",
    "The clock on the wall stopped at midnight.",
    "He found an old photograph in the attic.",
    "The cat slept all afternoon in the sun.",
    "Dinner will be ready in about twenty minutes.",
    "The river flows slowly through the valley.",
    "We need to buy milk on the way home.",
]


@dataclass
class Corpus:
    folder: Path
    good: list[Path]
    corrupt: Path
    not_audio: Path
    lead_silence_s: dict[str, float]
    texts: dict[str, str]


def speak(
    text: str,
    out: Path,
    lead_s: float,
    fmt: str,
    words_per_minute: int = 175,
    squeeze_pauses: bool = False,
    voice: str | None = None,
) -> None:
    """``text`` spoken by espeak-ng into ``out`` (format by its suffix) after ``lead_s`` seconds
    of digital silence. ``squeeze_pauses`` first cuts every pause espeak-ng fills with digital
    silence (between words, at commas, at both ends), so the added lead is the clip's only
    silence. ``voice``: an espeak-ng voice (``en+f3``: English, variant female 3)."""
    raw = out.with_suffix(".raw.wav")
    command = ["espeak-ng", "-s", str(words_per_minute), "-w", str(raw)]
    command += ["-v", voice] if voice else []
    subprocess.run([*command, text], check=True)
    if squeeze_pauses:
        squeezed = out.with_suffix(".squeezed.wav")
        # drop leading silence, then every run of 20 ms or more below 0.5% of full scale
        command = ["sox", str(raw), str(squeezed), "silence", "1", "0.01", "0.5%"]
        subprocess.run([*command, "-1", "0.02", "0.5%"], check=True)
        squeezed.replace(raw)
    subprocess.run(["sox", str(raw), str(out), "pad", f"{lead_s:.3f}", "0"], check=True)
    raw.unlink()


def build_corpus(
    folder: Path,
    count: int = len(SENTENCES),
    seed: int = 0,
    squeeze_pauses: bool = False,
    voice: str | None = None,
) -> Corpus:
    """``count`` sentences, each with 0.3-1 s of leading silence, as wav, flac and ogg, with a
    ``metadata.csv``; plus a corrupt wav and a text file named like an mp3.

    Past the first ``len(SENTENCES)`` clips the sentences repeat, 25 words per minute slower each
    round. ``squeeze_pauses`` and ``voice``: see ``speak``."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    good, leads, rows, texts = [], {}, [], {}
    for index in range(count):
        text = SENTENCES[index % len(SENTENCES)]
        fmt = ("wav", "flac", "ogg")[index % 3]
        path = folder / f"clip{index:02d}.{fmt}"
        leads[path.stem] = rng.uniform(0.3, 1.0)
        rate = 175 - 25 * (index // len(SENTENCES))
        speak(text, path, leads[path.stem], fmt, rate, squeeze_pauses, voice)
        good.append(path)
        rows.append(f"{path.stem}|{text}")
        texts[path.stem] = text
    (folder / "metadata.csv").write_text("\n".join(rows) + "\n")
    corrupt = folder / "broken.wav"
    corrupt.write_bytes(good[0].read_bytes()[:60] if good[0].suffix == ".wav" else b"RIFF\x00")
    not_audio = folder / "notes.mp3"
    not_audio.write_text("this is a shopping list, not a song\n" * 20)
    return Corpus(folder, good, corrupt, not_audio, leads, texts)
