"""``voicehost doctor``: the checks an operator runs first on a new machine, as table rows.

Each check returns ``Check`` rows and never raises: what it could not do is a failed row that
says why. In order: the versions (Python, torch, vLLM, CUDA), the GPU (compute capability,
whether FP8 weights and the FP8 KV cache apply) and the engine settings they resolve to; the
model's files (vocabulary size, every special token at its Orpheus id, the prompt built as
Orpheus ids); the codec (loads, round-trips a test tone); every adapter; then, given a server's
URL, one sentence per voice through it (time to first audio, real-time factor) and the
constrained-sampling counters (no malformed frame, no stray token). The cluster's checks (Redis,
workers) come from the command line, which may import the cluster package.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.served import (
    adapter_roots,
    adapter_rules,
    served_codec,
    served_languages,
    served_model,
)

LAST_AUDIO_TOKEN = orpheus.AUDIO_TOKEN_BASE + orpheus.TOKENS_PER_FRAME * orpheus.CODEBOOK_SIZE - 1
TEST_SENTENCE = "This is voicehost, checking that every voice speaks."
ORPHEUS_SPECIAL_TOKENS: tuple[tuple[str, str, int], ...] = (
    ("begin_of_text", "<|begin_of_text|>", orpheus.BEGIN_OF_TEXT),
    ("eot_id", "<|eot_id|>", orpheus.EOT_ID),
    ("custom_token_0", "<custom_token_0>", orpheus.CUSTOM_TOKEN_BASE),
    ("start_of_speech", "<custom_token_1>", orpheus.START_OF_SPEECH),
    ("end_of_speech", "<custom_token_2>", orpheus.END_OF_SPEECH),
    ("start_of_human", "<custom_token_3>", orpheus.START_OF_HUMAN),
    ("end_of_human", "<custom_token_4>", orpheus.END_OF_HUMAN),
    ("start_of_ai", "<custom_token_5>", orpheus.START_OF_AI),
    ("end_of_ai", "<custom_token_6>", orpheus.END_OF_AI),
    ("pad", "<custom_token_7>", orpheus.PAD),
    ("first audio token", "<custom_token_10>", orpheus.AUDIO_TOKEN_BASE),
    (
        "last audio token",
        f"<custom_token_{LAST_AUDIO_TOKEN - orpheus.CUSTOM_TOKEN_BASE}>",
        LAST_AUDIO_TOKEN,
    ),
)


@dataclass(frozen=True, slots=True)
class Check:
    """One row of the table: what was checked, whether it passed, and what was found."""

    name: str
    ok: bool
    detail: str


def guarded(name: str, check: Callable[[], list[Check]]) -> list[Check]:
    """``check``'s rows, or one failed row saying what went wrong."""
    try:
        return check()
    except Exception as exc:  # a doctor reports every failure as a row
        return [Check(name, False, f"{type(exc).__name__}: {exc}")]


def versions() -> list[Check]:
    import torch

    rows = [
        Check("python", True, platform.python_version()),
        Check("torch", True, torch.__version__),
        Check("cuda", True, torch.version.cuda or "none (a CPU build of torch)"),
    ]
    import vllm

    rows.append(Check("vllm", True, vllm.__version__))
    return rows


def gpu_and_engine(settings: Settings) -> list[Check]:
    from vllm.platforms import current_platform

    from voicehost.model.engine import (
        FP8_MIN_CAPABILITY,
        resolve_dtype,
        resolve_kv_cache_dtype,
        resolve_quantization,
        served_max_loras,
    )

    on_gpu = current_platform.is_cuda()
    rows = []
    if on_gpu:
        capability = current_platform.get_device_capability()
        fp8 = current_platform.has_device_capability(FP8_MIN_CAPABILITY)
        rows.append(
            Check(
                "gpu",
                True,
                f"{current_platform.get_device_name()}, compute capability "
                f"{capability.major}.{capability.minor}, "
                f"{current_platform.get_device_total_memory() / 2**30:.0f} GiB",
            )
        )
        rows.append(Check("fp8 support", True, "yes (>= 8.9)" if fp8 else "no (< 8.9)"))
    else:
        rows.append(Check("gpu", True, "none: the CPU engine (no FP8 weights, no FP8 KV cache)"))
    quantization = resolve_quantization(settings.quantization) or "none"
    rows.append(
        Check(
            "engine",
            True,
            f"dtype {resolve_dtype(settings.dtype, on_gpu)}, weights {quantization}, "
            f"kv cache {resolve_kv_cache_dtype(settings.kv_cache_dtype)}, "
            f"max_loras {served_max_loras(settings, on_gpu)}, constrained sampling "
            f"{'on' if settings.constrained_sampling else 'off'}",
        )
    )
    return rows


def model_files(settings: Settings) -> list[Check]:
    from transformers import AutoConfig, AutoTokenizer

    model = served_model(settings)
    config = AutoConfig.from_pretrained(model)
    rows = [
        Check(
            "model vocabulary",
            config.vocab_size == orpheus.VOCAB_SIZE,
            f"{config.vocab_size} ids (Orpheus: {orpheus.VOCAB_SIZE}) in {model}",
        )
    ]
    tokenizer = AutoTokenizer.from_pretrained(model)
    wrong = []
    for role, token, expected in ORPHEUS_SPECIAL_TOKENS:
        found = tokenizer.convert_tokens_to_ids(token)
        if found != expected:
            wrong.append(f"{role} {token} is id {found}, Orpheus has {expected}")
    rows.append(
        Check(
            "special tokens",
            not wrong,
            "; ".join(wrong) or f"all {len(ORPHEUS_SPECIAL_TOKENS)} at their Orpheus ids",
        )
    )
    text = orpheus.plain_text(tokenizer)
    prompt = orpheus.encode_prompt(text, "Hello <custom_token_4>.", "tara")
    body = prompt[2 : -len(orpheus.PROMPT_SUFFIX)]
    problems = []
    if prompt[:2] != [orpheus.START_OF_HUMAN, orpheus.BEGIN_OF_TEXT]:
        problems.append(f"starts {prompt[:2]}")
    if tuple(prompt[-len(orpheus.PROMPT_SUFFIX) :]) != orpheus.PROMPT_SUFFIX:
        problems.append(f"ends {prompt[-4:]}")
    if any(not 0 <= t < orpheus.BEGIN_OF_TEXT for t in body):
        problems.append("the text part holds special ids (user text could inject structure)")
    rows.append(
        Check(
            "prompt",
            not problems,
            "; ".join(problems)
            or f"{len(prompt)} ids: [128259, 128000] + text + {list(orpheus.PROMPT_SUFFIX)}",
        )
    )
    return rows


def codec_round_trip(settings: Settings) -> list[Check]:
    from voicehost.model.codec import SnacCodec

    started = time.monotonic()
    codec = SnacCodec.load(served_codec(settings), device=settings.codec_device, noise=False)
    try:
        loaded = time.monotonic() - started
        seconds = np.arange(orpheus.SAMPLE_RATE // 2) / orpheus.SAMPLE_RATE
        tone = (0.3 * np.sin(2 * np.pi * 440.0 * seconds)).astype(np.float32)
        frames = codec.encode(tone)
        audio = codec.decode(frames)
    finally:
        codec.close()
    ok = len(audio) == len(frames) * orpheus.SAMPLES_PER_FRAME and bool(np.isfinite(audio).all())
    n = min(len(tone), len(audio))
    correlation = float(np.corrcoef(tone[:n], audio[:n])[0, 1]) if audio[:n].std() else 0.0
    return [
        Check(
            "codec",
            ok,
            f"{served_codec(settings)} on {codec.device}, loaded in {loaded:.1f} s; a 440 Hz "
            f"tone: {len(frames)} frames -> {len(audio)} samples, correlation {correlation:.2f}",
        )
    ]


def adapters(settings: Settings) -> list[Check]:
    from voicehost.voices.validation import InvalidAdapter, validate_adapter

    rules = adapter_rules(settings)
    rows = []
    for root in adapter_roots(settings):
        folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        for folder in folders:
            if folder.name.startswith("."):
                continue
            try:
                voice = validate_adapter(folder, rules)
                rows.append(Check(f"adapter {voice.voice_id}", True, str(folder)))
            except InvalidAdapter as exc:
                rows.append(Check(f"adapter {folder.name}", False, str(exc)))
    return rows or [Check("adapters", True, "none in " + ", ".join(map(str, rules.base_names())))]


def _error_counts(metrics: str) -> dict[str, float]:
    counts = {"malformed_frame": 0.0, "stray_token": 0.0}
    for line in metrics.splitlines():
        for kind in counts:
            if line.startswith(f'voicehost_errors_total{{kind="{kind}"}}'):
                counts[kind] += float(line.rsplit(" ", 1)[1])
    return counts


async def through_server(
    url: str, voices: Sequence[str] | None = None, api_key: str | None = None
) -> list[Check]:
    """One sentence per voice through the server at ``url`` (all its voices by default)."""
    import aiohttp

    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        async with http.get(url + "/v1/audio/voices") as response:
            if response.status != 200:
                return [Check("server", False, f"{url}/v1/audio/voices: HTTP {response.status}")]
            listed = [v["id"] for v in (await response.json())["voices"]]
        async with http.get(url + "/metrics") as response:
            before = _error_counts(await response.text()) if response.status == 200 else None
        rows = [Check("server", True, f"{url}: {len(listed)} voices")]
        for voice in voices or listed:
            rows.append(await _speak(http, url, voice))
        if before is not None:
            async with http.get(url + "/metrics") as response:
                after = _error_counts(await response.text())
            malformed = after["malformed_frame"] - before["malformed_frame"]
            stray = after["stray_token"] - before["stray_token"]
            rows.append(
                Check(
                    "constrained sampling",
                    malformed == 0 and stray == 0,
                    f"{malformed:.0f} malformed frames, {stray:.0f} stray tokens "
                    "(the assembler's counters, over these sentences)",
                )
            )
    return rows


async def _speak(http, url: str, voice: str) -> Check:  # noqa: ANN001 - aiohttp.ClientSession
    body = {"input": TEST_SENTENCE, "voice": voice, "response_format": "pcm", "seed": 0}
    started = time.monotonic()
    first: float | None = None
    size = 0
    async with http.post(url + "/v1/audio/speech", json=body) as response:
        if response.status != 200:
            return Check(
                f"voice {voice}", False, f"HTTP {response.status}: {await response.text()}"
            )
        async for chunk in response.content.iter_any():
            first = first if first is not None else time.monotonic() - started
            size += len(chunk)
    total = time.monotonic() - started
    audio_seconds = size / 2 / orpheus.SAMPLE_RATE
    if not audio_seconds:
        return Check(f"voice {voice}", False, "no audio")
    return Check(
        f"voice {voice}",
        True,
        f"first audio {1000 * (first or 0):.0f} ms, {audio_seconds:.2f} s of audio, "
        f"real-time factor {total / audio_seconds:.2f}",
    )


def languages(settings: Settings) -> list[Check]:
    """What the model speaks and its built-in voices, and where that was read."""
    spoken = served_languages(settings)
    return [Check("languages", True, f"{spoken.describe()}, from {spoken.source}")]


def local_checks(settings: Settings) -> list[Check]:
    """Everything that needs no server: versions, GPU, model files, languages, codec,
    adapters."""
    return [
        *guarded("versions", versions),
        *guarded("gpu", lambda: gpu_and_engine(settings)),
        *guarded("model", lambda: model_files(settings)),
        *guarded("languages", lambda: languages(settings)),
        *guarded("codec", lambda: codec_round_trip(settings)),
        *guarded("adapters", lambda: adapters(settings)),
    ]


def table(checks: Sequence[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  ok    detail", f"{'-' * width}  ----  ------"]
    lines += [f"{c.name:<{width}}  {'ok' if c.ok else 'FAIL':<4}  {c.detail}" for c in checks]
    return "\n".join(lines)


def write_json(checks: Sequence[Check], out: Path) -> None:
    report = {"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}
    out.write_text(json.dumps(report, indent=2))
