"""Position-constrained sampling (voicehost/model/frame_constraint.py): the logits processor on real
tensors through vLLM's own batch-update types, then the engine behind a dev server of its own at
a high temperature, where unconstrained sampling goes wrong (with and without it, at length:
scripts/bench_constrained.py, docs/BENCHMARKS.md)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.engine import SpeechEngine, engine_args
from voicehost.model.frame_constraint import EXTRA_ARG, PROCESSOR_NAME, FrameConstraint

CONSTRAINED = SamplingParams(extra_args={EXTRA_ARG: True})
FREE = SamplingParams()
AUDIO_END = orpheus.AUDIO_TOKEN_BASE + orpheus.TOKENS_PER_FRAME * orpheus.CODEBOOK_SIZE


def processor(*requests: tuple[SamplingParams, list[int]]) -> FrameConstraint:
    """A processor holding ``requests`` (params, running output ids) at batch rows 0, 1, ..."""
    constraint = FrameConstraint(None, torch.device("cpu"), False)
    added = [(row, params, [1, 2], outputs) for row, (params, outputs) in enumerate(requests)]
    constraint.update_state(BatchUpdate(len(requests), removed=(), added=added, moved=()))
    return constraint


def finite_ids(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


def frame_position_ids(position: int) -> set[int]:
    first, last = (orpheus.audio_token_id(position, c) for c in (0, orpheus.CODEBOOK_SIZE - 1))
    return set(range(first, last + 1))


@pytest.mark.unit
def test_each_step_allows_only_the_4096_codes_of_the_next_frame_position():
    outputs: list[int] = []
    constraint = processor((CONSTRAINED, outputs))
    for generated in range(2 * orpheus.TOKENS_PER_FRAME + 1):
        logits = torch.randn(1, orpheus.VOCAB_SIZE)
        before = logits.clone()
        allowed = finite_ids(constraint.apply(logits)[0])
        position = generated % orpheus.TOKENS_PER_FRAME
        expected = frame_position_ids(position)
        if position == 0 and generated:
            expected.add(orpheus.END_OF_SPEECH)  # a whole frame is done: it may stop
        assert allowed == expected, f"after {generated} tokens"
        kept = sorted(allowed)
        assert torch.equal(logits[0, kept], before[0, kept])  # the allowed logits are untouched
        outputs.append(orpheus.audio_token_id(position, 5))  # vLLM appends the sampled token


@pytest.mark.unit
def test_the_stop_token_comes_only_after_a_whole_frame_never_before_the_first():
    stops = []
    for generated in range(0, 16):
        constraint = processor((CONSTRAINED, [0] * generated))
        logits = torch.zeros(1, orpheus.VOCAB_SIZE)
        stops.append(bool(torch.isfinite(constraint.apply(logits)[0, orpheus.END_OF_SPEECH])))
    assert [g for g, stop in enumerate(stops) if stop] == [7, 14]


@pytest.mark.unit
def test_only_requests_that_opt_in_are_constrained_in_a_mixed_batch():
    logits = torch.randn(3, orpheus.VOCAB_SIZE)
    before = logits.clone()
    constraint = processor((FREE, [0] * 3), (CONSTRAINED, [0] * 3), (FREE, []))
    constraint.apply(logits)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert finite_ids(logits[1]) == frame_position_ids(3)


@pytest.mark.unit
def test_a_batch_without_constrained_requests_is_left_alone():
    logits = torch.randn(2, orpheus.VOCAB_SIZE)
    before = logits.clone()
    assert torch.equal(processor((FREE, []), (FREE, [0])).apply(logits), before)


@pytest.mark.unit
def test_rows_follow_vllm_removals_moves_and_swaps():
    """vLLM condenses its persistent batch: a request's row changes, and its outputs go along."""
    a, b, c = [0] * 1, [0] * 2, [0] * 4  # positions 1, 2 and 4
    constraint = processor((CONSTRAINED, a), (CONSTRAINED, b), (CONSTRAINED, c))
    # b finishes; c moves into its row; then the two rows left swap
    constraint.update_state(
        BatchUpdate(2, removed=[1], added=(), moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)])
    )
    constraint.update_state(
        BatchUpdate(2, removed=(), added=(), moved=[(0, 1, MoveDirectionality.SWAP)])
    )
    logits = constraint.apply(torch.randn(2, orpheus.VOCAB_SIZE))
    assert finite_ids(logits[0]) == frame_position_ids(4)  # c
    assert finite_ids(logits[1]) == frame_position_ids(1)  # a
    # a new unconstrained request replacing a row is not constrained by the old one's state
    constraint.update_state(BatchUpdate(2, removed=[0], added=[(0, FREE, None, [])], moved=()))
    logits = torch.randn(2, orpheus.VOCAB_SIZE)
    before = logits.clone()
    constraint.apply(logits)
    assert torch.equal(logits[0], before[0]) and finite_ids(logits[1]) == frame_position_ids(1)


@pytest.mark.unit
def test_sampling_through_it_at_any_temperature_gives_only_whole_well_formed_frames():
    """Hot sampling from flat logits (every id as likely) still assembles clean frames."""
    outputs: list[int] = []
    constraint = processor((CONSTRAINED, outputs))
    generator = torch.Generator().manual_seed(3)
    assembler = orpheus.FrameAssembler()
    while len(outputs) < 7 * 5 and not assembler.stopped:
        logits = constraint.apply(torch.zeros(1, orpheus.VOCAB_SIZE))
        gumbel = -torch.log(-torch.log(torch.rand(orpheus.VOCAB_SIZE, generator=generator)))
        token = int(torch.argmax(logits[0] + gumbel))  # a draw from softmax(logits)
        outputs.append(token)
        assembler.push([token])
    assert (assembler.malformed_frames, assembler.stray_tokens) == (0, 0)
    assert assembler.frames == len(outputs) // 7 and assembler.incomplete_tokens == len(outputs) % 7


@pytest.mark.unit
def test_a_request_flag_that_is_not_a_boolean_is_refused():
    with pytest.raises(ValueError, match=EXTRA_ARG):
        FrameConstraint.validate_params(SamplingParams(extra_args={EXTRA_ARG: "yes"}))
    FrameConstraint.validate_params(CONSTRAINED)
    FrameConstraint.validate_params(FREE)


@pytest.mark.unit
def test_it_is_on_by_default_and_the_setting_switches_it_off(monkeypatch):
    monkeypatch.delenv("VOICEHOST_CONSTRAINED_SAMPLING", raising=False)
    on = Settings(dev=True)
    assert on.constrained_sampling and engine_args(on).logits_processors == [PROCESSOR_NAME]
    engine = SpeechEngine(llm=None, tokenizer=None, settings=on)
    assert engine.sampling("Hello there.", 1, 20).constrained
    monkeypatch.setenv("VOICEHOST_CONSTRAINED_SAMPLING", "false")
    off = Settings(dev=True)
    assert not off.constrained_sampling and not engine_args(off).logits_processors
    engine = SpeechEngine(llm=None, tokenizer=None, settings=off)
    assert not engine.sampling("Hello there.", 1, 20).constrained


# --- the engine at a high temperature: the shared server, hot (conftest) ------------------------


def counter(metrics: str, name: str) -> float:
    """A counter's value in a /metrics text (0 when the series was never incremented)."""
    values = [
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name)
    ]
    return sum(values)


COUNTED = (
    "voicehost_audio_tokens_total",
    'voicehost_errors_total{kind="malformed_frame"}',
    'voicehost_errors_total{kind="stray_token"}',
)


async def test_at_a_high_temperature_every_stream_is_whole_well_formed_frames(hot_sampling):
    voices = ["tara", "dev-a", "dev-b", "dev-c", "leo", "dev-a"]
    text = "Hot sampling still makes whole frames."
    logged = len(hot_sampling.log_text())  # the shared server's log so far: what follows counts
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:

        async def counted() -> dict[str, float]:
            async with http.get(hot_sampling.url + "/metrics") as response:
                metrics = await response.text()
            return {name: counter(metrics, name) for name in COUNTED}

        async def speak(voice: str, seed: int) -> bytes:
            body = {"input": text, "voice": voice, "response_format": "pcm", "seed": seed}
            for _ in range(600):  # refused while full: retried, as a client would
                async with http.post(hot_sampling.url + "/v1/audio/speech", json=body) as response:
                    if response.status == 503 and "Retry-After" in response.headers:
                        await asyncio.sleep(0.1)  # a client would wait its Retry-After
                        continue
                    assert response.status == 200, await response.text()
                    return await response.read()
            raise AssertionError("refused for a minute")

        before = await counted()
        audio = await asyncio.gather(*(speak(v, seed) for seed, v in enumerate(voices)))
        after = await counted()
    tokens, malformed, stray = (after[name] - before[name] for name in COUNTED)
    assert tokens >= 7 * 100, f"only {tokens} audio tokens: too few to show anything"
    assert all(audio)
    assert malformed == 0
    assert stray == 0
    log = hot_sampling.log_text()
    assert "malformed frames and" not in log[logged:]  # logged for every stream that lost one
    assert "dev settings changed at run time" in log[:logged]  # it was hot
    # the prompts go to vLLM rendered (the raw-prompt path is deprecated in 0.32)
    assert "Passing raw prompts to InputProcessor is deprecated" not in log
    assert "kv_cache_dtype=auto" in log  # shown at start-up: the model's dtype on this CPU
