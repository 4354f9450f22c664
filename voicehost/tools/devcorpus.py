"""A small real-speech corpus with known text, spoken by espeak-ng: the audio input of the
training tests and benchmarks (the dev model's counterpart: built on the spot, no download).
Needs the ``espeak-ng`` and ``sox`` commands; ``spoken_words`` calls espeak-ng's C library
(``libespeak-ng.so.1``) for the position of each word in its audio."""

from __future__ import annotations

import ctypes
import random
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


# --- espeak-ng's own word positions, through its C library ---------------------------------------

ESPEAK_LIBRARY = "libespeak-ng.so.1"
SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS: the callback gets the audio as it is made
WORD_EVENT = 1  # espeakEVENT_WORD
CHARACTER_POSITIONS, UTF8, RATE = 1, 1, 1  # POS_CHARACTER, espeakCHARS_UTF8, espeakRATE


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):  # espeak_EVENT (speak_lib.h)
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based, in characters
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),  # samples at the library's rate
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass(frozen=True)
class SpokenWords:
    """espeak-ng's speech of a text: float samples at ``sample_rate``, and where each word
    starts, as (character offset in the text, seconds into the audio)."""

    samples: np.ndarray
    sample_rate: int
    starts: list[tuple[int, float]]


class _Espeak:
    """The library, loaded once; one synthesis at a time."""

    def __init__(self) -> None:
        self.library = ctypes.CDLL(ESPEAK_LIBRARY)
        self.rate = self.library.espeak_Initialize(SYNCHRONOUS, 0, None, 0)
        if self.rate <= 0:
            raise RuntimeError("espeak-ng's library did not start")
        self.lock = threading.Lock()
        self.chunks: list[np.ndarray] = []
        self.starts: list[tuple[int, int]] = []
        self.callback = _CALLBACK(self._heard)  # kept: the library holds only its address
        self.library.espeak_SetSynthCallback(self.callback)

    def _heard(self, wav: ctypes.Array, count: int, events: ctypes.Array) -> int:
        if wav and count > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        index = 0
        while events[index].type != 0:  # espeakEVENT_LIST_TERMINATED
            if events[index].type == WORD_EVENT:
                self.starts.append((events[index].text_position - 1, events[index].sample))
            index += 1
        return 0

    def speak(self, text: str, voice: str, words_per_minute: int) -> SpokenWords:
        data = text.encode()  # UTF-8; the library's word positions count its characters
        with self.lock:
            self.chunks, self.starts = [], []
            self.library.espeak_SetVoiceByName(voice.encode())
            self.library.espeak_SetParameter(RATE, words_per_minute, 0)
            self.library.espeak_Synth(
                data, len(data) + 1, 0, CHARACTER_POSITIONS, 0, UTF8, None, None
            )
            self.library.espeak_Synchronize()
            samples = np.concatenate(self.chunks).astype(np.float32) / 32768
            starts, last = [], -1
            for position, sample in self.starts:
                if position > last:  # one out of order is left from an earlier text (cmn's)
                    starts.append((position, sample / self.rate))
                    last = position
        return SpokenWords(samples, self.rate, starts)


_espeak: _Espeak | None = None


def spoken_words(text: str, voice: str = "en-us", words_per_minute: int = 175) -> SpokenWords:
    """``text`` spoken by espeak-ng's library in ``voice`` (``fr``, ``cmn``, ...), with where it
    starts each word (offsets in characters of ``text``): the ground truth of word timing
    (``scripts/bench_alignment.py``)."""
    global _espeak
    if _espeak is None:
        _espeak = _Espeak()
    return _espeak.speak(text, voice, words_per_minute)
