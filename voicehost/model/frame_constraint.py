"""Position-constrained sampling: every generated stream is whole, well-formed frames.

An Orpheus frame is 7 audio tokens and each carries its frame position (``orpheus.py``): token
``k`` of a frame must be one of the 4096 ids ``AUDIO_TOKEN_BASE + k*4096 + code``. The model
sometimes samples an id of another position or a non-audio id (more often at a high
temperature), and the ``FrameAssembler`` then drops a frame. This vLLM v1 batch-level logits
processor rules that out before sampling: at each step it keeps, for every constrained request
of the batch, only the logits of the 4096 ids of the position that comes next, and the logit of
the stop token only at a frame boundary after at least one frame. Everything else is ``-inf``,
so the sampler (penalties, temperature, top-p: all run after this) only ever draws those ids.

One step costs one fill of the logits of the constrained rows and two gathers/scatters of
``rows x 4097`` values, whatever the batch size: no Python work per vocabulary entry, only one
``len()`` per request to know its position. A request opts in with
``SamplingParams.extra_args[EXTRA_ARG] = True`` (``engine.py`` sets it when constrained sampling
is on), so the same engine can serve both kinds (the benchmark compares them in one run).

The generated part of a prompt always starts at frame position 0: every Orpheus prompt
(``orpheus.build_prompt``, with or without a context turn) ends with start-of-speech, and the
prompt's own tokens (text, a context turn's audio tokens) are never counted: only the output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from voicehost.model import orpheus

try:
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
except ImportError:  # torch alone (scripts/gpu_bench.py on a GPU machine without vLLM): the
    LogitsProcessor = object  # mask below still runs; the processor is only vLLM's to call

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

inf = float("inf")
EXTRA_ARG = "voicehost_frames"  # SamplingParams.extra_args key of a request that opts in
PROCESSOR_NAME = f"{__name__}:FrameConstraint"  # how engine_args names it (vLLM imports it)


def next_positions(generated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request, from its count of output tokens: the first id of the 4096 allowed next,
    and whether the stop token is (a frame boundary after at least one frame)."""
    position = generated % orpheus.TOKENS_PER_FRAME
    first = orpheus.AUDIO_TOKEN_BASE + position * orpheus.CODEBOOK_SIZE
    return first, (position == 0) & (generated > 0)


def keep_frame_positions(
    logits: torch.Tensor, first: torch.Tensor, stop_allowed: torch.Tensor, codes: torch.Tensor
) -> torch.Tensor:
    """In place, for a batch whose every row is constrained: row i keeps only the logits of ids
    ``first[i] .. first[i] + 4095`` and, where ``stop_allowed[i]``, the stop token's."""
    ids = first.unsqueeze(1) + codes  # [rows, 4096]
    stop = torch.where(stop_allowed, logits[:, orpheus.END_OF_SPEECH], -inf)
    kept = logits.gather(1, ids)
    logits.fill_(-inf)
    logits.scatter_(1, ids, kept)
    logits[:, orpheus.END_OF_SPEECH] = stop
    return logits


class FrameConstraint(LogitsProcessor):
    """The batch-level logits processor (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        # batch row -> the request's running list of output token ids (vLLM keeps it current)
        self.outputs: dict[int, list[int]] = {}
        self.codes = torch.arange(orpheus.CODEBOOK_SIZE, device=self.device)
        self.rows = np.zeros(0, dtype=np.int64)
        self.rows_device = torch.zeros(0, dtype=torch.int64, device=self.device)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        value = (sampling_params.extra_args or {}).get(EXTRA_ARG)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"extra_args[{EXTRA_ARG!r}] must be true or false")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is most likely

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        outputs = self.outputs
        for index in batch_update.removed:
            outputs.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            if (params.extra_args or {}).get(EXTRA_ARG):
                outputs[index] = output_ids
            else:
                outputs.pop(index, None)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = outputs.pop(a, None), outputs.pop(b, None)
            if moved_a is not None:
                outputs[b] = moved_a
            if direction == MoveDirectionality.SWAP and moved_b is not None:
                outputs[a] = moved_b
        rows = np.fromiter(sorted(outputs), dtype=np.int64, count=len(outputs))
        if not np.array_equal(rows, self.rows):
            self.rows = rows
            self.rows_device = torch.from_numpy(rows).to(self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.outputs:
            return logits
        rows = self.rows
        generated = np.fromiter(
            (len(self.outputs[row]) for row in rows), dtype=np.int64, count=len(rows)
        )
        first, stop_allowed = next_positions(generated)
        # one small host-to-device copy: each row's first allowed id and whether it may stop
        step = torch.from_numpy(np.stack([first, stop_allowed.astype(np.int64)]))
        step = step.to(self.device)  # a no-op on CPU
        if len(rows) == logits.shape[0]:  # every request is constrained: the usual case
            return keep_frame_positions(logits, step[0], step[1].bool(), self.codes)
        # a mixed batch (advanced indexing: slower, only for the rows concerned)
        ids = step[0].unsqueeze(1) + self.codes
        stop = torch.where(step[1].bool(), logits[self.rows_device, orpheus.END_OF_SPEECH], -inf)
        row_index = self.rows_device.unsqueeze(1)
        kept = logits[row_index, ids]
        logits.index_fill_(0, self.rows_device, -inf)
        logits[row_index, ids] = kept
        logits[self.rows_device, orpheus.END_OF_SPEECH] = stop
        return logits
