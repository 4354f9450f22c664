"""Speaker embeddings: who is speaking in a clip, as a unit vector, whatever is said.

A ``SpeakerEmbedder`` turns float samples into an L2-normalised float32 vector; two clips of one
speaker point the same way (``similarity``, the cosine), and a speaker is the per-dimension
median of their clips' vectors (``centroid``). The embedder's ``name`` goes with every figure
computed from it, since figures from different embedders are on different scales.

``load_embedder`` picks the embedder from a spec (``VOICEHOST_SPEAKER_EMBEDDER``), and
``shared_embedder`` keeps the one a process loads for it (the consent check, a clone's evaluation
and the training data's speaker filter all use that one):

- unset or ``resemblyzer``: Resemblyzer's GE2E model (256 dimensions, trained on VoxCeleb and
  LibriSpeech), whose weights ship inside its pip package, so it runs with no download;
- ``package.module:factory``: ``factory()`` from an importable module returns the embedder;
- a folder: a stronger model an operator plugs in (an ECAPA or WavLM speaker-verification model
  saved locally, say) with a ``speaker_embedder.py`` beside its weights that defines
  ``load(folder: Path) -> SpeakerEmbedder``; nothing in voicehost changes.

Names: a speaker's model is an *embedder*; a response format's bytes come from a
``voicehost.audio.formats.FormatWriter`` and SNAC is the *codec* (``voicehost.model.codec``).
Two published names keep the word "encoder": the setting's old variable,
``VOICEHOST_SPEAKER_ENCODER`` (an alias of ``VOICEHOST_SPEAKER_EMBEDDER``), and a folder's
``speaker_encoder.py`` (read when it has no ``speaker_embedder.py``); "encoder" in this module
is otherwise Resemblyzer's own class.

Embedding is CPU-bound (a few tens of ms per second of audio): ``embed_off_loop`` runs it in a
thread, and ``EmbeddingCache`` keeps each clip's vector (in memory, and on disk if given a folder).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from voicehost.model.orpheus import SAMPLE_RATE

# the module a folder embedder defines ``load`` in; the second is its name before, still read
FOLDER_ENTRIES = ("speaker_embedder.py", "speaker_encoder.py")


@runtime_checkable
class SpeakerEmbedder(Protocol):
    """Float samples of one speaker -> their embedding (float32, 1-D, L2-normalised)."""

    name: str  # reported with every similarity figure

    def embed(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray: ...


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two embeddings (1: the same direction)."""
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norms) if norms > 0 else 0.0


def centroid(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """The speaker of several clips: the median of each dimension (one odd clip cannot pull it
    away, as it would a mean), renormalised."""
    if len(embeddings) == 0:
        raise ValueError("a centroid needs at least one embedding")
    middle = np.median(np.stack(embeddings), axis=0).astype(np.float32)
    return _unit(middle)


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


class Resemblyzer:
    """Resemblyzer's GE2E model: 16 kHz input, long pauses cut (its WebRTC VAD), then the
    mean of 1.6 s windows' embeddings."""

    name = "resemblyzer-ge2e"
    RATE = 16000
    MIN_SECONDS = 0.5  # shorter after its pause cutting: embed the clip as it is

    def __init__(self, device: str = "cpu") -> None:
        with warnings.catch_warnings():  # it imports scipy.ndimage.morphology (deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            from resemblyzer import VoiceEncoder, preprocess_wav

        self._preprocess = preprocess_wav
        self._model = VoiceEncoder(device=device, verbose=False)
        self._lock = threading.Lock()  # one torch module, called from worker threads

    def embed(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        import soxr

        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        if audio.size == 0 or not np.any(audio):
            raise ValueError("no audio to embed")
        if sample_rate != self.RATE:
            audio = soxr.resample(audio, sample_rate, self.RATE).astype(np.float32)
        cut = self._preprocess(audio)
        if cut.size >= self.MIN_SECONDS * self.RATE:
            audio = cut
        with self._lock:
            embedding = self._model.embed_utterance(audio)
        return _unit(np.asarray(embedding, dtype=np.float32))


_shared: dict[str | None, SpeakerEmbedder] = {}
_shared_lock = threading.Lock()


def shared_embedder(spec: str | None = None) -> SpeakerEmbedder:
    """The process's embedder for ``spec``, loaded on first use and kept: every caller in a
    process shares one model (``None``, ``""`` and ``"resemblyzer"`` name the same one)."""
    key = _spec_key(spec)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = load_embedder(spec)
        return _shared[key]


def _spec_key(spec: str | None) -> str | None:
    """A spec as given, stripped; ``None`` for the default embedder."""
    return None if spec is None or spec.strip() in ("", "resemblyzer") else spec.strip()


def load_embedder(spec: str | None = None) -> SpeakerEmbedder:
    """A new embedder of the kind a spec names (see the module docstring; ``shared_embedder``
    keeps one per process); raises ``ValueError`` for a spec that names nothing loadable, or
    something that is not an embedder."""
    spec = _spec_key(spec)
    if spec is None:
        return Resemblyzer()
    folder = Path(spec).expanduser()
    if folder.is_dir():
        entry = next((folder / n for n in FOLDER_ENTRIES if (folder / n).is_file()), None)
        if entry is None:
            raise ValueError(f"speaker embedder folder {folder} has no {FOLDER_ENTRIES[0]}")
        module_spec = importlib.util.spec_from_file_location("voicehost_speaker_embedder", entry)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {entry}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        embedder = module.load(folder)
    elif ":" in spec:
        module_name, _, factory = spec.partition(":")
        try:
            embedder = getattr(importlib.import_module(module_name), factory)()
        except (ImportError, AttributeError, TypeError) as exc:
            raise ValueError(f"speaker embedder {spec!r}: {exc}") from exc
    else:
        raise ValueError(
            f"speaker embedder {spec!r}: expected 'resemblyzer', 'package.module:factory' "
            f"or a folder holding {FOLDER_ENTRIES[0]}"
        )
    if not isinstance(embedder, SpeakerEmbedder):
        raise ValueError(f"speaker embedder {spec!r} has no 'name' and 'embed'")
    return embedder


class EmbeddingCache:
    """An embedder that remembers: each clip's embedding, keyed by a hash of its samples, its
    rate and the embedder's name, kept in memory (the newest ``max_items``) and, with a
    ``folder``, as ``<key>.npy`` files there. It is itself a ``SpeakerEmbedder``."""

    def __init__(
        self, embedder: SpeakerEmbedder, folder: Path | None = None, max_items: int = 10_000
    ) -> None:
        self.embedder = embedder
        self.name = embedder.name
        self.folder = folder
        self.max_items = max_items
        self.hits = 0
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def key(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> str:
        digest = hashlib.sha256(np.ascontiguousarray(samples, dtype=np.float32).tobytes())
        digest.update(f"|{sample_rate}|{self.name}".encode())
        return digest.hexdigest()

    def embed(self, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        key = self.key(samples, sample_rate)
        found = self._recall(key)
        if found is not None:
            self.hits += 1
            return found
        embedding = self.embedder.embed(samples, sample_rate)
        self._remember(key, embedding)
        return embedding

    def _recall(self, key: str) -> np.ndarray | None:
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
        if self.folder is not None:
            try:
                embedding = np.load(self.folder / f"{key}.npy")
            except (OSError, ValueError):
                return None
            self._remember(key, embedding, write=False)
            return embedding
        return None

    def _remember(self, key: str, embedding: np.ndarray, write: bool = True) -> None:
        with self._lock:
            self._memory[key] = embedding
            while len(self._memory) > self.max_items:
                self._memory.popitem(last=False)
        if write and self.folder is not None:
            tmp = self.folder / f".{key}.tmp.npy"
            np.save(tmp, embedding)
            tmp.replace(self.folder / f"{key}.npy")


async def embed_off_loop(
    embedder: SpeakerEmbedder, samples: np.ndarray, rate: int = SAMPLE_RATE
) -> np.ndarray:
    """``embedder.embed`` in a worker thread, so the event loop keeps serving."""
    return await asyncio.to_thread(embedder.embed, samples, rate)
