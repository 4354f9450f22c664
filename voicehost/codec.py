"""SNAC frames -> 24 kHz PCM: the process-wide codec and the per-stream ``FrameDecoder``.

SNAC's decoder is not causal: the audio of frame i depends on the codes of frames i-3 .. i+2.
A ``FrameDecoder`` therefore decodes each run of new frames inside a window with 3 frames of left
context and ``lookahead`` frames of right context, and keeps only the new frames' samples. With a
lookahead of 2 the stream equals a one-shot decode of the whole sequence (to float rounding).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voicehost import orpheus

log = logging.getLogger(__name__)

LEFT_CONTEXT_FRAMES = 3
DEFAULT_LOOKAHEAD_FRAMES = 2


class SnacCodec:
    """One SNAC model for the whole process; every decode runs on its single worker thread."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snac")

    @classmethod
    def load(cls, name: str | Path, *, device: str | None = None, noise: bool = True) -> SnacCodec:
        """Load SNAC from a directory (``config.json`` + ``pytorch_model.bin``) or a hub id.

        ``noise=False`` removes the decoder's random noise blocks, making decoding deterministic.
        """
        from snac import SNAC
        from snac.layers import NoiseBlock

        model = SNAC.from_pretrained(str(name))
        if not noise:
            _replace_modules(model, NoiseBlock, torch.nn.Identity)
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model = model.to(target).eval()
        return cls(model, target)

    def encode(self, audio: np.ndarray) -> list[orpheus.Frame]:
        """Frames of 24 kHz mono float audio (padded up to whole frames)."""
        samples = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        with torch.inference_mode():
            codes = self.model.encode(samples.view(1, 1, -1).to(self.device))
        l0, l1, l2 = (layer[0].tolist() for layer in codes)
        return orpheus.codes_to_frames(l0, l1, l2)

    def decode(self, frames: Sequence[orpheus.Frame]) -> np.ndarray:
        """One-shot decode of consecutive frames: float32 samples, ``len(frames) * 2048`` long."""
        if not frames:
            return np.zeros(0, dtype=np.float32)
        layers = orpheus.frames_to_codes(frames)
        codes = [torch.tensor([layer], dtype=torch.long, device=self.device) for layer in layers]
        with torch.inference_mode():
            audio = self.model.decode(codes)
        return audio[0, 0].float().cpu().numpy()

    async def decode_async(self, frames: Sequence[orpheus.Frame]) -> np.ndarray:
        """``decode`` on the codec thread, so the event loop never waits on SNAC."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.decode, list(frames))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _replace_modules(root: torch.nn.Module, kind: type, factory: type) -> None:
    for name, child in root.named_children():
        if isinstance(child, kind):
            setattr(root, name, factory())
        else:
            _replace_modules(child, kind, factory)


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """Decode frames ``[start, stop)``; keep the samples of frames ``[emit_start, emit_stop)``."""

    start: int
    stop: int
    emit_start: int
    emit_stop: int

    def trim(self, audio: np.ndarray) -> np.ndarray:
        spf = orpheus.SAMPLES_PER_FRAME
        return audio[(self.emit_start - self.start) * spf : (self.emit_stop - self.start) * spf]


class FrameDecoder:
    """Streams one request's frames into PCM: every frame played once, in order, frame 0 first."""

    def __init__(self, codec: SnacCodec, lookahead: int = DEFAULT_LOOKAHEAD_FRAMES) -> None:
        if lookahead not in (0, 1, 2):
            raise ValueError("lookahead must be 0, 1 or 2 frames")
        self.codec = codec
        self.lookahead = lookahead
        self.frames: list[orpheus.Frame] = []
        self.emitted = 0

    def next_window(self, final: bool) -> DecodeWindow | None:
        """The window that plays every frame whose right context has arrived (all, when final)."""
        ready = len(self.frames) if final else len(self.frames) - self.lookahead
        if ready <= self.emitted:
            return None
        start = max(0, self.emitted - LEFT_CONTEXT_FRAMES)
        stop = min(len(self.frames), ready + self.lookahead)
        return DecodeWindow(start, stop, self.emitted, ready)

    async def push(self, frames: Sequence[orpheus.Frame]) -> np.ndarray:
        """Add frames; returns the samples now ready (possibly none)."""
        self.frames.extend(frames)
        return await self._emit(final=False)

    async def finish(self) -> np.ndarray:
        """The samples of every frame not yet played, decoded with the context that exists."""
        return await self._emit(final=True)

    async def _emit(self, final: bool) -> np.ndarray:
        window = self.next_window(final)
        if window is None:
            return np.zeros(0, dtype=np.float32)
        audio = await self.codec.decode_async(self.frames[window.start : window.stop])
        self.emitted = window.emit_stop
        return window.trim(audio)
