"""Voice adapters: the validator refuses each kind of bad adapter; the directory finds new ones."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from voicehost.voices.folders import FolderVoiceDirectory
from voicehost.voices.validation import AdapterRules, InvalidAdapter, validate_adapter

pytestmark = pytest.mark.unit


@pytest.fixture
def adapter(dev_model, tmp_path):
    """A copy of a good dev voice, to break in each test."""
    folder = tmp_path / "my-voice"
    shutil.copytree(dev_model.adapters / "dev-a", folder)
    return folder


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_a_good_adapter_passes(adapter, rules):
    voice = validate_adapter(adapter, rules)
    assert voice.voice_id == "my-voice"
    assert voice.name == "Dev voice A"
    assert voice.adapter_path == adapter
    assert len(voice.checksum) == 64


def break_pickle(folder):
    (folder / "adapter_model.bin").write_bytes(b"\x80\x04pickle")


def break_missing_config(folder):
    (folder / "adapter_config.json").unlink()


def break_missing_weights(folder):
    (folder / "adapter_model.safetensors").unlink()


def break_config_json(folder):
    (folder / "adapter_config.json").write_text("{not json")


def break_rank(folder):
    edit_json(folder / "adapter_config.json", r=64)


def break_modules_to_save(folder):
    edit_json(folder / "adapter_config.json", modules_to_save=["lm_head", "embed_tokens"])


def break_bias(folder):
    edit_json(folder / "adapter_config.json", bias="all")


def break_base_model(folder):
    edit_json(folder / "voice.json", base_model="meta-llama/Llama-3.2-3B")


def break_target_modules(folder):
    edit_json(folder / "adapter_config.json", target_modules=["q_proj", "embed_tokens"])


def break_weights_file(folder):
    (folder / "adapter_model.safetensors").write_bytes(b"this is not safetensors at all")


def break_tensor_shape(folder):
    path = folder / "adapter_model.safetensors"
    weights = load_file(path)
    name = next(n for n in weights if "q_proj.lora_A" in n)
    weights[name] = torch.zeros(16, 7)
    save_file(weights, path)


def break_extra_tensor(folder):
    path = folder / "adapter_model.safetensors"
    weights = load_file(path)
    weights["base_model.model.lm_head.weight"] = torch.zeros(4, 4)
    save_file(weights, path)


def break_target_modules_type(folder):
    edit_json(folder / "adapter_config.json", target_modules=5)


def break_rank_type(folder):
    edit_json(folder / "adapter_config.json", r="16")


def break_tensor_rank(folder):
    path = folder / "adapter_model.safetensors"
    weights = load_file(path)
    name = next(n for n in weights if "v_proj.lora_B" in n)
    weights[name] = torch.zeros(())
    save_file(weights, path)


def break_manifest_style(folder):
    edit_json(folder / "voice.json", prompt_style="shout")


@pytest.mark.parametrize(
    ("breaker", "message"),
    [
        (break_pickle, "pickle"),
        (break_missing_config, "adapter_config.json is missing"),
        (break_missing_weights, "adapter_model.safetensors is missing"),
        (break_config_json, "not valid JSON"),
        (break_rank, "exceeds max_lora_rank"),
        (break_modules_to_save, "modules_to_save"),
        (break_bias, "bias"),
        (break_base_model, "base model"),
        (break_target_modules, "target modules"),
        (break_weights_file, "not a readable safetensors"),
        (break_tensor_shape, "shape"),
        (break_extra_tensor, "unexpected tensor"),
        (break_manifest_style, "prompt_style"),
        (break_target_modules_type, "target_modules"),
        (break_rank_type, "rank"),
        (break_tensor_rank, "expected a matrix"),
    ],
)
def test_each_kind_of_bad_adapter_is_refused(adapter, rules, breaker, message):
    breaker(adapter)
    with pytest.raises(InvalidAdapter, match=message):
        validate_adapter(adapter, rules)


def test_a_voice_id_outside_the_pattern_is_refused(adapter, rules):
    bad = adapter.rename(adapter.parent / "Bad Voice")
    with pytest.raises(InvalidAdapter, match="voice id"):
        validate_adapter(bad, rules)


def test_the_directory_lists_good_and_broken_adapters(dev_model, tmp_path, rules):
    shutil.copytree(dev_model.adapters / "dev-b", tmp_path / "good")
    shutil.copytree(dev_model.adapters / "dev-b", tmp_path / "broken")
    break_rank(tmp_path / "broken")
    directory = FolderVoiceDirectory([tmp_path], ["tara"], rules)
    directory.scan()
    assert [v.voice_id for v in directory.voices()] == ["good", "tara"]
    assert [b.voice_id for b in directory.broken_adapters()] == ["broken"]
    assert "max_lora_rank" in directory.broken_adapters()[0].error
    assert directory.get("broken") is None


def test_the_directory_finds_a_new_folder_at_once_and_forgets_a_removed_one(
    dev_model, tmp_path, rules
):
    directory = FolderVoiceDirectory([tmp_path], [], rules)
    directory.scan()
    assert directory.discover("late") is None
    shutil.copytree(dev_model.adapters / "dev-c", tmp_path / "late")
    assert directory.get("late") is None  # not scanned yet
    assert directory.discover("late").adapter_path == tmp_path / "late"
    shutil.rmtree(tmp_path / "late")
    directory.scan()
    assert directory.get("late") is None


async def test_a_listing_holds_what_another_process_added_or_removed_since_the_scan(
    dev_model, tmp_path, rules
):
    """A host's front ends share the adapters folder: the one that did not take an upload
    lists it at once, and stops listing a voice the other deleted."""
    directory = FolderVoiceDirectory([tmp_path], [], rules)
    directory.scan()
    shutil.copytree(dev_model.adapters / "dev-c", tmp_path / "added")
    assert [v.voice_id for v in (await directory.list_voices())[0]] == ["added"]
    shutil.rmtree(tmp_path / "added")
    assert (await directory.list_voices())[0] == []


def test_the_directory_revalidates_a_changed_adapter(dev_model, tmp_path, rules):
    shutil.copytree(dev_model.adapters / "dev-a", tmp_path / "v")
    directory = FolderVoiceDirectory([tmp_path], [], rules)
    directory.scan()
    before = directory.get("v").checksum
    path = tmp_path / "v" / "adapter_model.safetensors"
    weights = {k: t * 2 for k, t in load_file(path).items()}
    save_file(weights, path)
    directory.scan()
    assert directory.get("v").checksum != before


# --- adapters a user actually has -------------------------------------------------------------


@pytest.mark.unit
def test_the_served_model_is_accepted_by_its_name_path_or_folder_and_the_error_says_which(
    adapter, dev_model
):
    from voicehost.config import Settings
    from voicehost.model.served import served_model

    settings = Settings(dev=True, dev_dir=dev_model.root)
    rules = AdapterRules.from_settings(settings, served_model(settings))
    for declared in (str(dev_model.model), "model", "voicehost-dev", "some/hub/voicehost-dev"):
        edit_json(adapter / "adapter_config.json", base_model_name_or_path=declared)
        assert validate_adapter(adapter, rules).voice_id == "my-voice", declared
    edit_json(adapter / "adapter_config.json", base_model_name_or_path="meta-llama/Llama-3.2-3B")
    with pytest.raises(InvalidAdapter, match="accepted: 'voicehost-dev', '/") as error:
        validate_adapter(adapter, rules)
    assert str(dev_model.model) in str(error.value)


@pytest.mark.unit
def test_full_dotted_target_modules_match_on_their_last_part(adapter, rules):
    dotted = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "v_proj"]
    edit_json(adapter / "adapter_config.json", target_modules=dotted)
    assert validate_adapter(adapter, rules).voice_id == "my-voice"
    edit_json(adapter / "adapter_config.json", target_modules=["model.embed_tokens"])
    with pytest.raises(InvalidAdapter, match=r"model\.embed_tokens"):
        validate_adapter(adapter, rules)
    edit_json(adapter / "adapter_config.json", target_modules=["model.layers.0.q_proj.lm_head"])
    with pytest.raises(InvalidAdapter, match="not attention/MLP projections"):
        validate_adapter(adapter, rules)
