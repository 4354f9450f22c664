"""What LAME's ``compression_level`` (its ``-q``) costs in quality, for the server's mp3 at 64
kbit/s: real speech (espeak-ng, several voices) through ``FormatWriter``'s mp3 at each level,
decoded and compared with the source it was made from:

- ``similarity``: the speaker embedder's (``VOICEHOST_SPEAKER_EMBEDDER``, Resemblyzer by default)
  cosine similarity of the decoded audio's embedding to the source's (what a clone's checks see);
- ``lsd_db``: log-spectral distance, dB, over 25 ms frames of 0-8 kHz down to 60 dB under each
  frame's loudest bin (a spectral error that, unlike a waveform SNR, does not punish LAME's
  phase-insensitive coding; like it, it does not know what noise shaping hides);
- ``cpu_ms``: the mp3 encoding's CPU per audio second (the least of 3 runs).

    python scripts/bench_mp3_levels.py --levels 3,5,7
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voicehost.audio import formats
from voicehost.audio.formats import FormatWriter
from voicehost.audio.speaker import shared_embedder, similarity
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.tools import devcorpus

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs back home again. "
    "She sells sea shells by the sea shore, while the wind blows through the trees."
)
VOICES = ["en+m1", "en+f2", "en+m3", "en+f4", "en-us+m2", "en-us+f3"]
BINS = 201  # of a 600-sample frame at 24 kHz: 0-8 kHz, where speech is
PRIMING = 1105  # LAME's delay in front of the decoded audio (formats' module docstring)


def encode(samples: np.ndarray, level: int) -> tuple[bytes, float]:
    pyav = formats._PYAV_FORMATS["mp3"]
    formats._PYAV_FORMATS["mp3"] = dataclasses.replace(
        pyav, codec_options={"compression_level": str(level)}
    )
    try:
        best, data = float("inf"), b""
        for _ in range(3):
            started = time.process_time()
            writer = FormatWriter("mp3")
            data = b"".join(
                writer.encode(samples[i : i + 2048]) for i in range(0, samples.size, 2048)
            )
            data += writer.finish()
            best = min(best, time.process_time() - started)
    finally:
        formats._PYAV_FORMATS["mp3"] = pyav
    return data, best / (samples.size / SAMPLE_RATE) * 1000


def decode(data: bytes, length: int) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    return samples[PRIMING : PRIMING + length].astype(np.float32)


def log_spectral_distance(a: np.ndarray, b: np.ndarray) -> float:
    frame, hop = 600, 300
    window = np.hanning(frame)
    distances = []
    for start in range(0, min(a.size, b.size) - frame, hop):
        pa = np.abs(np.fft.rfft(a[start : start + frame] * window))[:BINS] ** 2
        pb = np.abs(np.fft.rfft(b[start : start + frame] * window))[:BINS] ** 2
        if pa.sum() < 1e-4:  # silence: nothing to hear
            continue
        floor = pa.max() * 1e-6  # 60 dB under the frame's loudest bin: below it, inaudible
        pa, pb = np.maximum(pa, floor), np.maximum(pb, floor)
        distances.append(np.sqrt(np.mean((10 * np.log10(pa / pb)) ** 2)))
    return float(np.mean(distances))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="3,5,7")
    args = parser.parse_args()
    levels = [int(v) for v in args.levels.split(",") if v]
    embedder = shared_embedder()
    rows: dict[int, dict[str, list[float]]] = {
        lv: {"similarity": [], "lsd_db": [], "cpu_ms": []} for lv in levels
    }
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        for voice in VOICES:
            wav = Path(folder) / f"{voice}.wav"
            devcorpus.speak(TEXT, wav, 0.0, "wav", voice=voice)
            with av.open(str(wav)) as container:
                resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
                source = np.concatenate(
                    [
                        r.to_ndarray().reshape(-1)
                        for f in container.decode(audio=0)
                        for r in resampler.resample(f)
                    ]
                )
            reference = embedder.embed(source)
            for level in levels:
                data, cpu = encode(source, level)
                heard = decode(data, source.size)
                rows[level]["similarity"].append(similarity(reference, embedder.embed(heard)))
                rows[level]["lsd_db"].append(log_spectral_distance(source, heard))
                rows[level]["cpu_ms"].append(cpu)
    summary = {
        level: {name: round(float(np.mean(values)), 4) for name, values in row.items()}
        | {"similarity_min": round(min(row["similarity"]), 4)}
        for level, row in rows.items()
    }
    print("| level | similarity (mean / least) | log-spectral distance, dB | CPU ms per audio s |")
    print("|---:|---:|---:|---:|")
    for level, s in summary.items():
        figures = [f"{s['similarity']} / {s['similarity_min']}", s["lsd_db"], s["cpu_ms"]]
        print(f"| {level} | " + " | ".join(map(str, figures)) + " |")
    print(f"{len(VOICES)} voices; load average before {load}, after {os.getloadavg()}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
