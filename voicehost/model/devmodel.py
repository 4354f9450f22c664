"""The dev model: a tiny random-weight Orpheus, its tokenizer, a small SNAC and three dev voices.

Everything is built deterministically from a seed and cached on disk, so tests and ``serve --dev``
run the real serving code (vLLM, PEFT adapters, SNAC) without downloading weights.

Random weights alone would emit text tokens, so the embeddings and the output head carry one
structural signal: the audio token at frame position k strongly predicts a token at position
k + 1, start_of_speech predicts position 0, and the stop token follows a whole frame with a small
probability. The codes within a position stay random and depend on the transformer layers (and so
on the voice adapter), which is what the tests need to tell voices apart.

Left alone its utterances run about 75 frames (6 s) whatever the text, with a long tail; the
engine caps what it serves at ``MAX_AUDIO_FRAMES``, so a test's long texts cost seconds, not
minutes, while a stream still outlasts a client's first chunk, a cancel or a drain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from voicehost.model import orpheus
from voicehost.model.languages import DEFAULT_LANGUAGE, KNOWN_VOICES, METADATA
from voicehost.voices.validation import servable_lora_config

log = logging.getLogger(__name__)

DEV_SEED = 1234
DEV_VOICES = ("dev-a", "dev-b", "dev-c")
LORA_RANK = 16
FORMAT_VERSION = 6  # bump when the built files change, so old caches are rebuilt

HIDDEN = 64
LAYERS = 2
HEADS = 2
KV_HEADS = 1
INTERMEDIATE = 128
MAX_POSITIONS = 8192

# The 24 kHz SNAC's rates and codebooks, with narrow convolutions.
SNAC_CONFIG = {**orpheus.SNAC_24KHZ_CONFIG, "encoder_dim": 8, "decoder_dim": 64}
# Gain on the dev codec's input convolution (the first of SNAC's encoder half). With SNAC's
# random initialisation speech at the training pipeline's -20 LUFS barely moves that half off its
# biases, so ~90% of speech frames encode to exactly digital silence's codes; at 32x every speech
# frame differs from silence, while silence itself (zeros in, biases out) encodes as before.
CODEC_INPUT_GAIN = 32.0

# Structure of the dev model's residual stream: one coordinate per "last token was position k".
_START_COORD = orpheus.TOKENS_PER_FRAME  # start_of_speech
_STRUCTURE_GAIN = 6.0  # embedding size of the structural coordinate
_NEXT_POSITION_LOGIT = 1.37  # head weight that, after the final norm, gives the next position ~12
_STOP_LOGIT = 1.5  # with 4096 rival codes, the stop token ends a frame a few percent of the time
# the random head's spread: code entropy about 7.75 nats of 8.32 within a position
_HEAD_GAIN = 4.0
# the layers' weights (0.02 x this) and the voices' LoRA weights: at 64 wide, these keep what
# the layers add (the text, the segment before, a voice) as large in the logits as at 256
_LAYER_GAIN = 3.0
_ADAPTER_SCALE = 0.04
# the stop token's random head row, this many times the others': what a voice or a text adds
# moves where it stops, so seeded speech of two voices differs in length as it would in life
_STOP_SPREAD = 8.0
MAX_AUDIO_FRAMES = 48  # 4 s: the most one dev-model request says (as many as continuity carries)


@dataclass(frozen=True, slots=True)
class DevModelPaths:
    """Where the built dev model lives."""

    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def codec(self) -> Path:
        return self.root / "snac"

    @property
    def adapters(self) -> Path:
        return self.root / "adapters"

    @property
    def stamp(self) -> Path:
        return self.root / "stamp.json"


def _stamp(seed: int) -> dict[str, int]:
    return {"format_version": FORMAT_VERSION, "seed": seed}


def dev_voices(language: str) -> dict[str, str]:
    """The built-in voices a dev model of ``language`` answers to: the voices of Canopy Labs'
    finetune of it where they are known (``pierre``, ``amelie``, ``marie`` in French), else
    two of its own (``ko-a``, ``ko-b``)."""
    names = KNOWN_VOICES.get(language) or (f"{language.lower()}-a", f"{language.lower()}-b")
    return dict.fromkeys(names, language)


def write_languages(paths: DevModelPaths, language: str) -> None:
    """Say in the dev model's folder what it speaks (``voicehost.model.languages``): the model
    is the same random one in every language; its metadata makes it one language's."""
    metadata = {"languages": [language], "voices": dev_voices(language)}
    (paths.model / METADATA).write_text(json.dumps(metadata, ensure_ascii=False, indent=2))


def ensure_dev_model(
    root: Path, seed: int = DEV_SEED, language: str | None = None
) -> DevModelPaths:
    """Build the dev model under ``root`` unless an identical build is already there, speaking
    ``language`` (``None``: the one it was built with, English for a new build).

    Safe to call from several processes at once: one builds, the others wait for it.
    """
    paths = DevModelPaths(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if paths.stamp.exists() and json.loads(paths.stamp.read_text()) == _stamp(seed):
            if language is not None:
                write_languages(paths, language)
            return paths
        log.info("building the dev model in %s (seed %d)", root, seed)
        staging = root.with_name(root.name + ".building")
        shutil.rmtree(staging, ignore_errors=True)
        staged = DevModelPaths(staging)
        build_tokenizer(staged.model)
        build_llama(staged.model, seed)
        build_snac(staged.codec, seed)
        for index, voice_id in enumerate(DEV_VOICES):
            build_voice_adapter(
                staged.model, staged.adapters / voice_id, voice_id, seed + 1 + index
            )
        write_languages(staged, language or DEFAULT_LANGUAGE)
        staged.stamp.write_text(json.dumps(_stamp(seed)))
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    return paths


def build_tokenizer(out: Path) -> None:
    """A byte-level tokenizer with Orpheus' layout: text below 128256, the special ids above.

    Text encodes to byte ids 0..255; ids 256..127999 are unused fillers; 128000..128255 are the
    Llama-3 special tokens and 128256.. the ``<custom_token_i>`` tokens up to 156939.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {_byte_char(byte): byte for byte in range(256)}
    for i in range(len(vocab), orpheus.BEGIN_OF_TEXT):
        vocab[f"<|filler_{i}|>"] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [
        _llama3_special(i) for i in range(orpheus.CUSTOM_TOKEN_BASE - orpheus.BEGIN_OF_TEXT)
    ]
    customs = [f"<custom_token_{i}>" for i in range(orpheus.VOCAB_SIZE - orpheus.CUSTOM_TOKEN_BASE)]
    tokenizer.add_special_tokens(specials + customs)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token=f"<custom_token_{orpheus.PAD - orpheus.CUSTOM_TOKEN_BASE}>",
    )
    fast.save_pretrained(out)


def _byte_char(byte: int) -> str:
    """The printable character that byte-level BPE (GPT-2's mapping) uses for ``byte``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    if byte in printable:
        return chr(byte)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(byte))


def _llama3_special(index: int) -> str:
    names = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 9: "<|eot_id|>"}
    return names.get(index, f"<|reserved_special_token_{index}|>")


def _llama_config():  # noqa: ANN202 - transformers' config type
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=orpheus.VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=orpheus.BEGIN_OF_TEXT,
        eos_token_id=orpheus.END_OF_SPEECH,
        pad_token_id=orpheus.PAD,
        torch_dtype="bfloat16",
    )


def build_llama(out: Path, seed: int) -> None:
    """The tiny Llama with Orpheus' vocabulary and the structural signal described above."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = _llama_config()
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                continue
            gain = _LAYER_GAIN if ".layers." in name else 1.0
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02 * gain)
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        embed.mul_(10.0)  # token identity, at about a third of the structure's size
        head.mul_(_HEAD_GAIN)
        audio = torch.arange(orpheus.AUDIO_TOKEN_BASE, orpheus.AUDIO_TOKEN_BASE + 7 * 4096)
        positions = (audio - orpheus.AUDIO_TOKEN_BASE) // orpheus.CODEBOOK_SIZE
        embed[audio, positions] += _STRUCTURE_GAIN
        embed[orpheus.START_OF_SPEECH, _START_COORD] += _STRUCTURE_GAIN
        previous = (positions - 1) % orpheus.TOKENS_PER_FRAME
        head[audio, previous] += _NEXT_POSITION_LOGIT
        head[audio[positions == 0], _START_COORD] += _NEXT_POSITION_LOGIT
        head[orpheus.END_OF_SPEECH].mul_(_STOP_SPREAD)
        head[orpheus.END_OF_SPEECH, orpheus.TOKENS_PER_FRAME - 1] += _STOP_LOGIT
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def build_snac(out: Path, seed: int) -> None:
    """A small SNAC with the 24 kHz model's rates and codebooks (hop 512, strides 4, 2, 1)."""
    import torch
    from snac import SNAC

    torch.manual_seed(seed)
    codec = SNAC(**SNAC_CONFIG)
    with torch.no_grad():  # the weight-norm magnitude of the first convolution
        codec.encoder.block[0].parametrizations.weight.original0.mul_(CODEC_INPUT_GAIN)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SNAC_CONFIG, indent=2))
    torch.save(codec.state_dict(), out / "pytorch_model.bin")


def build_voice_adapter(model_dir: Path, out: Path, voice_id: str, seed: int) -> None:
    """A PEFT LoRA (rank 16 on q,k,v,o,gate,up,down) with non-zero A and B, plus its manifest."""
    import torch
    from peft import get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    config = servable_lora_config(LORA_RANK, 2 * LORA_RANK)
    peft_model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * _ADAPTER_SCALE)
    peft_model.save_pretrained(out, safe_serialization=True)
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = "voicehost-dev"
    config_path.write_text(json.dumps(adapter_config, indent=2))
    manifest = {
        "voice_id": voice_id,
        "name": f"Dev voice {voice_id[-1].upper()}",
        "base_model": "voicehost-dev",
        "prompt_style": "plain",
        "version": 1,
    }
    (out / "voice.json").write_text(json.dumps(manifest, indent=2))


def fingerprint(paths: DevModelPaths) -> str:
    """A short digest of the built weights, to show two builds are identical."""
    digest = hashlib.sha256()
    for file in sorted(paths.root.rglob("*.safetensors")) + sorted(paths.root.rglob("*.bin")):
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
