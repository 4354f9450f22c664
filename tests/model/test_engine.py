"""Engine settings that need no running engine: quantization, dtype, LoRA ids, sampling."""

from pathlib import Path

import pytest
import torch

from voicehost.cli import main
from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import MAX_AUDIO_FRAMES
from voicehost.model.engine import (
    InputTooLong,
    SpeechEngine,
    engine_args,
    lora_adapter_bytes,
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_max_loras,
    resolve_quantization,
    write_zero_adapter,
)
from voicehost.model.served import check_segments_fit
from voicehost.voices.validation import LORA_TARGET_MODULES
from voicehost.voices.voice import Voice

pytestmark = pytest.mark.unit


def pretend_platform(monkeypatch, cuda: bool, capability: int) -> None:
    """vLLM's platform, as a CUDA GPU of ``capability`` (e.g. 89) or a machine without one."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: cuda)
    monkeypatch.setattr(
        type(current_platform),
        "has_device_capability",
        lambda self, wanted, device_id=0: cuda and capability >= wanted,
    )


@pytest.mark.parametrize(
    ("cuda", "capability", "expected"),
    [(False, 0, None), (True, 80, None), (True, 89, "fp8"), (True, 90, "fp8")],
)
def test_quantization_auto_is_fp8_only_on_cuda_gpus_that_support_it(
    monkeypatch, cuda, capability, expected
):
    pretend_platform(monkeypatch, cuda, capability)
    assert resolve_quantization("auto") == expected


def test_quantization_auto_is_off_on_this_cpu_machine():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_quantization("auto") is None


def test_quantization_can_be_forced_or_switched_off():
    assert resolve_quantization("fp8") == "fp8"
    assert resolve_quantization("none") is None


@pytest.mark.parametrize(
    ("cuda", "capability", "expected"),
    [(False, 0, "auto"), (True, 80, "auto"), (True, 89, "fp8"), (True, 90, "fp8")],
)
def test_kv_cache_dtype_auto_is_fp8_only_on_cuda_gpus_that_support_it(
    monkeypatch, cuda, capability, expected
):
    pretend_platform(monkeypatch, cuda, capability)
    assert resolve_kv_cache_dtype("auto") == expected
    assert resolve_kv_cache_dtype("fp8_e5m2") == "fp8_e5m2"  # any vLLM value, as given


def test_the_engine_gets_the_kv_cache_dtype(monkeypatch):
    monkeypatch.setenv("VOICEHOST_KV_CACHE_DTYPE", "bfloat16")
    assert engine_args(Settings(dev=True)).kv_cache_dtype == "bfloat16"
    monkeypatch.delenv("VOICEHOST_KV_CACHE_DTYPE")
    assert engine_args(Settings(dev=True)).kv_cache_dtype == "auto"  # this CPU: the model's


ORPHEUS_3B = {  # Orpheus 3B's config.json (Llama 3.2 3B): the README's arithmetic
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 28,
}


def test_a_rank_16_adapter_of_the_3b_model_takes_about_48_mb_in_bf16():
    assert lora_adapter_bytes(ORPHEUS_3B, 16) == 48_627_712
    assert lora_adapter_bytes(ORPHEUS_3B, 32) == 2 * 48_627_712


@pytest.mark.parametrize(
    ("gpu_gib", "expected"),
    [(None, 8), (16, 16), (24, 24), (48, 48), (80, 64), (141, 64)],
)
def test_max_loras_auto_is_8_on_cpu_and_what_5_percent_of_gpu_memory_holds(gpu_gib, expected):
    memory = None if gpu_gib is None else gpu_gib * 2**30
    adapter = lora_adapter_bytes(ORPHEUS_3B, 16)
    assert resolve_max_loras("auto", memory, adapter, max_num_seqs=256) == expected
    assert resolve_max_loras("auto", memory, adapter, max_num_seqs=4) == 4  # never above
    assert resolve_max_loras(12, memory, adapter, max_num_seqs=256) == 12  # as given
    assert resolve_max_loras("auto", 2**30, adapter, 256) == 8  # the least on a small GPU


def test_max_loras_reads_a_number_or_auto_from_the_environment(monkeypatch):
    monkeypatch.setenv("VOICEHOST_MAX_LORAS", "12")
    assert Settings().max_loras == 12
    monkeypatch.setenv("VOICEHOST_MAX_LORAS", "auto")
    assert Settings().max_loras == "auto"


def test_the_gpu_extra_is_on_the_release_line_the_tests_run():
    """The CPU build the tests run and the CUDA build a GPU machine installs are one release
    line: an unpinned ``vllm`` would install whatever is newest (0.33 at the time of writing)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = extras["project"]["optional-dependencies"]
    (cpu,) = (Requirement(r) for r in extras["cpu"])
    (gpu,) = (Requirement(r) for r in extras["gpu"])
    (tested,) = (Version(s.version) for s in cpu.specifier)
    assert gpu.name == "vllm" and tested in gpu.specifier
    line = (tested.major, tested.minor)
    assert Version(f"{line[0]}.{line[1] + 1}.0") not in gpu.specifier
    assert Version(f"{line[0]}.{line[1]}.9") in gpu.specifier


def test_the_zero_adapter_has_every_target_projection_at_rank_1_all_zeros(tmp_path, dev_model):
    from safetensors.torch import load_file

    from voicehost.voices.validation import AdapterRules, ModelShape, validate_adapter

    folder = write_zero_adapter(tmp_path, dev_model.model / "config.json", "voicehost-dev")
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    shape = ModelShape.from_config(dev_model.model / "config.json")
    assert len(tensors) == 2 * 2 * len(LORA_TARGET_MODULES)  # the dev model has 2 layers
    assert all(not t.any() for t in tensors.values())
    assert tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].shape == (
        1,
        shape.intermediate,
    )
    # it passes the same validation as any voice adapter of the served model
    validate_adapter(folder, AdapterRules("voicehost-dev", 16, shape), voice_id="zero")


def test_dtype_auto_is_bf16_on_gpu_and_fp32_on_cpu():
    assert resolve_dtype("auto", on_gpu=True) == "bfloat16"
    assert resolve_dtype("auto", on_gpu=False) == "float32"
    assert resolve_dtype("float16", on_gpu=False) == "float16"


def adapter(voice_id: str, checksum: str) -> Voice:
    return Voice(voice_id, voice_id, "plain", Path(f"/voices/{voice_id}"), checksum)


def test_each_adapter_keeps_one_lora_id_for_the_engine_life():
    engine = SpeechEngine(llm=None, tokenizer=None, settings=Settings(dev=True))
    a, b = adapter("a", "1"), adapter("b", "2")
    first = [engine.lora_request(v).lora_int_id for v in (a, b, a, b)]
    assert first[0] == first[2] != first[1] == first[3]
    assert engine.lora_request(a).lora_name == f"lora-{first[0]}:a"  # no "@": not a voice@n
    assert engine.lora_request(adapter("a", "changed")).lora_int_id not in first
    assert engine.lora_request(Voice("tara", "Tara")) is None


def test_text_that_cannot_fit_the_context_is_refused():
    small = Settings(dev=True, max_model_len=1024, segment_max_chars=80, continuity_frames=0)
    engine = SpeechEngine(llm=None, tokenizer=None, settings=small)
    with pytest.raises(InputTooLong, match="max_model_len is 1024"):
        engine.sampling("word " * 100, seed=None, prompt_tokens=210)


def test_max_tokens_follows_the_text_and_the_context_left():
    engine = SpeechEngine(llm=None, tokenizer=None, settings=Settings(dev=True, max_model_len=4096))
    short = engine.sampling("Hi.", seed=1, prompt_tokens=20)
    long = engine.sampling("word " * 100, seed=1, prompt_tokens=20)
    assert short.max_tokens < long.max_tokens <= 4096 - 20
    assert (short.temperature, short.top_p, short.repetition_penalty) == (0.6, 0.8, 1.1)
    assert short.seed == 1
    assert (long.max_tokens - 1) % orpheus.TOKENS_PER_FRAME == 0


def test_the_engine_wraps_only_the_modules_voice_adapters_may_target():
    """vLLM's default also wraps lm_head, whose LoRA logits step then runs for every token of
    every request, adapter or not (5x slower decoding on the CPU engine)."""
    args = engine_args(Settings(dev=True))
    assert sorted(args.lora_target_modules) == sorted(LORA_TARGET_MODULES)
    assert "lm_head" not in args.lora_target_modules
    assert args.enable_lora and args.max_loras == 8  # auto, on this CPU


def test_segments_that_cannot_fit_the_context_are_refused_and_no_server_starts(monkeypatch, capsys):
    check_segments_fit(Settings(segment_max_chars=900))
    with pytest.raises(ValueError, match="lower segment_max_chars"):
        check_segments_fit(Settings(segment_max_chars=1000))
    with pytest.raises(ValueError, match="lower segment_max_chars"):
        check_segments_fit(Settings(max_model_len=2048))  # 300 characters need more
    monkeypatch.setenv("VOICEHOST_SEGMENT_MAX_CHARS", "1000")
    assert main(["serve", "--dev"]) == 2  # said before anything loads
    assert "segment_max_chars 1000 needs up to" in capsys.readouterr().err


def test_the_dev_model_says_at_most_its_cap_and_real_weights_follow_the_text():
    """The dev model's random speech runs ~75 frames whatever the text; serving caps it so a
    test's long texts stay cheap. Real weights get the text's own allowance."""
    text = "word " * 100
    dev = SpeechEngine(llm=None, tokenizer=None, settings=Settings(dev=True))
    real = SpeechEngine(llm=None, tokenizer=None, settings=Settings(model="/models/orpheus"))
    capped = dev.sampling(text, seed=None, prompt_tokens=20).max_tokens
    assert capped == MAX_AUDIO_FRAMES * orpheus.TOKENS_PER_FRAME + 1
    assert real.sampling(text, seed=None, prompt_tokens=20).max_tokens > capped
    assert dev.sampling("Hi.", seed=None, prompt_tokens=20).max_tokens < capped  # text still counts
