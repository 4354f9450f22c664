"""The vLLM engine serving Orpheus: prompt token ids in, audio token ids out as deltas.

One ``AsyncLLM`` serves the base model and every LoRA voice; requests for different voices are
batched together in the same forward pass.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voicehost import lifeline, orpheus
from voicehost.adapter_validation import LORA_TARGET_MODULES
from voicehost.config import Settings
from voicehost.devmodel import MAX_AUDIO_FRAMES as DEV_MAX_AUDIO_FRAMES
from voicehost.voices import Voice

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

# The dev model's random speech would otherwise run ~75 frames whatever the text.
DEV_MAX_AUDIO_TOKENS = DEV_MAX_AUDIO_FRAMES * orpheus.TOKENS_PER_FRAME + 1

FP8_MIN_CAPABILITY = 89  # W8A8 FP8 kernels: Ada, Hopper and newer


class InputTooLong(ValueError):
    """The prompt plus the speech it needs do not fit in the model's context."""


def resolve_quantization(setting: str) -> str | None:
    """``auto``: FP8 on CUDA GPUs that support it, none elsewhere; ``none``: off; else as given."""
    from vllm.platforms import current_platform

    if setting == "none":
        return None
    if setting != "auto":
        return setting
    # vLLM's platform check reads NVML, so CUDA stays uninitialised for vLLM's workers.
    if current_platform.is_cuda() and current_platform.has_device_capability(FP8_MIN_CAPABILITY):
        return "fp8"
    return None


def resolve_dtype(setting: str, on_gpu: bool) -> str:
    """``auto``: bfloat16 on GPUs; float32 on CPU, where bf16 rounding makes seeded sampling
    depend on which other requests share the batch."""
    if setting != "auto":
        return setting
    return "bfloat16" if on_gpu else "float32"


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Per-request sampling; defaults come from the settings (Orpheus' stable values)."""

    temperature: float
    top_p: float
    repetition_penalty: float
    max_tokens: int
    seed: int | None = None


def engine_args(settings: Settings) -> AsyncEngineArgs:
    """vLLM's engine arguments for these settings (on CPU, also sets the KV cache size)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    on_gpu = current_platform.is_cuda()
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gib))
    return AsyncEngineArgs(
        model=settings.served_model(),
        dtype=resolve_dtype(settings.dtype, on_gpu),
        quantization=resolve_quantization(settings.quantization),
        max_model_len=settings.max_model_len,
        enable_lora=True,
        max_loras=settings.max_loras,
        max_lora_rank=settings.max_lora_rank,
        max_cpu_loras=settings.max_cpu_loras,
        # Only the modules voice adapters may target (validate_adapter refuses the rest). By
        # default vLLM also wraps lm_head, whose LoRA logits step then runs for every token of
        # every request, with or without an adapter: 5x slower decoding on CPU.
        lora_target_modules=list(LORA_TARGET_MODULES),
        max_num_seqs=settings.max_num_seqs,
        gpu_memory_utilization=settings.gpu_memory_utilization or (0.9 if on_gpu else 0.3),
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=True,
        enable_log_requests=False,
        disable_log_stats=True,
        # On CPU a seeded request whose prompt is split across steps kills the engine (vLLM
        # rewinds its generator, which CPU generators cannot do): never split prompts.
        **({} if on_gpu else {"enable_chunked_prefill": False}),
        **({} if on_gpu else {"max_num_batched_tokens": settings.max_model_len}),
    )


class SpeechEngine:
    """Orpheus on vLLM with LoRA voices; each voice keeps one LoRA int id for the engine's life."""

    def __init__(
        self, llm: AsyncLLM | None, tokenizer: PreTrainedTokenizerBase | None, settings: Settings
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.settings = settings
        self._lora_ids: dict[tuple[str, str | None], int] = {}

    @classmethod
    def start(cls, settings: Settings) -> SpeechEngine:
        """Build the engine (blocking: loads weights and profiles memory)."""
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(settings)
        lifeline.start_reaper()  # vLLM's processes end with this one, even after a kill -9
        log.info("starting vLLM: model=%s quantization=%s", args.model, args.quantization or "none")
        llm = AsyncLLM.from_engine_args(args)
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        return cls(llm, tokenizer, settings)

    def prompt(
        self, text: str, voice: Voice, context: tuple[str, list[orpheus.Frame]] | None = None
    ) -> list[int]:
        """The Orpheus prompt token ids for ``text`` in ``voice``, after ``context`` (an earlier
        segment's text and frames) if given."""
        return orpheus.encode_prompt(
            orpheus.plain_text(self.tokenizer),
            text,
            voice.prompt_name(),
            context,
        )

    def sampling(self, text: str, seed: int | None, prompt_tokens: int) -> SamplingOptions:
        """Sampling defaults; ``max_tokens`` follows the text length and the context left
        (with the dev model, at most ``devmodel.MAX_AUDIO_FRAMES`` frames).

        Raises ``InputTooLong`` when the context cannot hold the speech the text needs.
        """
        s = self.settings
        limit = s.max_model_len - prompt_tokens
        served = min(limit, DEV_MAX_AUDIO_TOKENS) if s.dev else limit
        needed = orpheus.min_audio_tokens(text)
        if needed > limit:
            raise InputTooLong(
                f"the text needs about {needed + prompt_tokens} tokens of context and "
                f"max_model_len is {s.max_model_len}: send less text per request"
            )
        return SamplingOptions(
            temperature=s.temperature,
            top_p=s.top_p,
            repetition_penalty=s.repetition_penalty,
            max_tokens=orpheus.max_audio_tokens(text, served),
            seed=seed,
        )

    def lora_request(self, voice: Voice) -> LoRARequest | None:
        """The ``LoRARequest`` of an adapter voice (``None`` for a base-model voice)."""
        from vllm.lora.request import LoRARequest

        if voice.adapter_path is None:
            return None
        key = (voice.voice_id, voice.checksum)
        lora_id = self._lora_ids.setdefault(key, len(self._lora_ids) + 1)
        return LoRARequest(f"{voice.voice_id}@{lora_id}", lora_id, str(voice.adapter_path))

    async def audio_tokens(
        self, prompt: Sequence[int], voice: Voice, options: SamplingOptions
    ) -> AsyncIterator[list[int]]:
        """Stream the generated token ids as deltas; closing the iterator aborts the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=options.temperature,
            top_p=options.top_p,
            repetition_penalty=options.repetition_penalty,
            max_tokens=options.max_tokens,
            seed=options.seed,
            stop_token_ids=[orpheus.END_OF_SPEECH],
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )
        request_id = f"speech-{uuid.uuid4().hex}"
        stream = self.llm.generate(
            {"prompt_token_ids": list(prompt)},
            params,
            request_id,
            lora_request=self.lora_request(voice),
        )
        try:
            async for output in stream:
                # vLLM's delta list itself, not a copy (the listener reads it at once)
                if token_ids := output.outputs[0].token_ids:
                    yield token_ids
        finally:
            await stream.aclose()

    @property
    def healthy(self) -> bool:
        """False once the engine core has died; every request would fail."""
        return not self.llm.errored

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (running or waiting)."""
        return self.llm.get_num_unfinished_requests()

    def shutdown(self) -> None:
        self.llm.shutdown()
