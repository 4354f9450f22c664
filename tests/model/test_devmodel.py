"""The dev model: deterministic, Orpheus' vocabulary and ids, working SNAC, non-zero voices."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lora_training.ingest import decode, normalise_loudness
from voicehost.model import orpheus
from voicehost.model.codec import SnacCodec
from voicehost.model.devmodel import DEV_VOICES, ensure_dev_model
from voicehost.tools.devcorpus import speak
from voicehost.voices.validation import LORA_TARGET_MODULES

pytestmark = pytest.mark.unit


def test_a_cached_build_is_reused(dev_model):
    stamp = dev_model.stamp.stat().st_mtime_ns
    ensure_dev_model(dev_model.root)
    assert dev_model.stamp.stat().st_mtime_ns == stamp


def test_model_has_orpheus_vocabulary(dev_model):
    config = json.loads((dev_model.model / "config.json").read_text())
    assert config["vocab_size"] == orpheus.VOCAB_SIZE == 156940
    assert config["model_type"] == "llama"


def test_tokenizer_keeps_text_below_the_audio_ids(dev_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dev_model.model)
    ids = tokenizer.encode("Hello there, naïve café! <laugh>", add_special_tokens=False)
    assert ids and max(ids) < orpheus.TEXT_VOCAB_SIZE
    assert len(tokenizer) == orpheus.VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids("<|begin_of_text|>") == orpheus.BEGIN_OF_TEXT
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") == orpheus.EOT_ID
    assert tokenizer.convert_tokens_to_ids("<custom_token_2>") == orpheus.END_OF_SPEECH
    assert tokenizer.decode(ids) == "Hello there, naïve café! <laugh>"


def test_snac_encodes_and_decodes(dev_model):
    from snac import SNAC

    codec = SNAC.from_pretrained(str(dev_model.codec)).eval()
    audio = torch.randn(1, 1, 4096) * 0.1
    with torch.inference_mode():
        codes = codec.encode(audio)
        decoded = codec.decode(codes)
    assert [c.shape[-1] for c in codes] == [2, 4, 8]
    assert decoded.shape == (1, 1, 4096)


def test_the_dev_codec_tells_speech_at_the_training_loudness_from_silence(dev_model, tmp_path):
    """The head-of-line benchmark and trimmed training data need speech frames that are not
    silence frames; a random SNAC without the input gain encodes ~90% of them as silence."""
    speak("Please call me back this afternoon.", tmp_path / "clip.wav", 0.0, "wav", 175, True)
    codec = SnacCodec.load(dev_model.codec, device="cpu")
    silence = set(codec.encode(np.zeros(orpheus.SAMPLE_RATE, dtype=np.float32)))
    frames = codec.encode(normalise_loudness(decode(tmp_path / "clip.wav")))
    speech = frames[1:-1]  # the first and last frames straddle the clip's edges
    assert len(speech) >= 10
    assert all(frame not in silence for frame in speech)
    assert len({frame.l0 for frame in speech}) >= 4


@pytest.mark.parametrize("voice", DEV_VOICES)
def test_dev_voices_are_rank_16_loras_with_non_zero_weights(dev_model, voice):
    folder = dev_model.adapters / voice
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 16
    assert set(config["target_modules"]) == set(LORA_TARGET_MODULES)
    assert not config.get("modules_to_save")
    weights = load_file(folder / "adapter_model.safetensors")
    assert {name.split(".")[-3] for name in weights} >= set(LORA_TARGET_MODULES)
    assert all(np.abs(t.float().numpy()).max() > 0 for t in weights.values())
    assert json.loads((folder / "voice.json").read_text())["voice_id"] == voice


def test_dev_voices_differ_from_each_other(dev_model):
    a, b = (load_file(dev_model.adapters / v / "adapter_model.safetensors") for v in DEV_VOICES[:2])
    assert any(not torch.equal(a[name], b[name]) for name in a)
