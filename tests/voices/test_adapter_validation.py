"""Adapter validation on its own: each rule vLLM needs of a LoRA voice, tried on small adapters
built here (tensors of the exact shapes a tiny model asks for), at its edges and with its message.
Whole dev voices are tried in test_voices."""

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from voicehost.voices.validation import (
    LORA_TARGET_MODULES,
    MAX_JSON_BYTES,
    AdapterRules,
    InvalidAdapter,
    ModelShape,
    assign_tenant,
    servable_lora_config,
    validate_adapter,
    voice_tenant,
)

pytestmark = pytest.mark.unit

SHAPE = ModelShape(hidden=8, intermediate=12, q_out=8, kv_out=4)
RULES = AdapterRules("org/voicehost-dev", max_rank=4, shape=SHAPE)
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}


def lora_tensors(rank: int, modules=LORA_TARGET_MODULES, shape: ModelShape = SHAPE) -> dict:
    """The A and B matrices of one layer, as PEFT names and shapes them."""
    tensors = {}
    for module in modules:
        block = "self_attn" if module in ATTENTION else "mlp"
        prefix = f"base_model.model.model.layers.0.{block}.{module}"
        in_features, out_features = shape.in_out(module)
        tensors[f"{prefix}.lora_A.weight"] = np.zeros((rank, in_features), np.float32)
        tensors[f"{prefix}.lora_B.weight"] = np.zeros((out_features, rank), np.float32)
    return tensors


def make_adapter(
    root: Path,
    config: dict | None = None,
    manifest: dict | None = None,
    tensors: dict | None = None,
    name: str = "my-voice",
) -> Path:
    """A servable adapter folder, changed by ``config`` (None values drop a key)."""
    folder = root / name
    folder.mkdir()
    settings = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": list(LORA_TARGET_MODULES),
        "bias": "none",
        "base_model_name_or_path": "voicehost-dev",
    }
    settings.update(config or {})
    settings = {k: v for k, v in settings.items() if v is not None}
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    if manifest is not None:
        (folder / "voice.json").write_text(json.dumps(manifest))
    rank = settings.get("r") if type(settings.get("r")) is int else 2
    save_file(lora_tensors(max(rank, 1)) if tensors is None else tensors, folder / WEIGHTS)
    return folder


WEIGHTS = "adapter_model.safetensors"


def refused(folder: Path, rules: AdapterRules = RULES) -> str:
    with pytest.raises(InvalidAdapter) as error:
        validate_adapter(folder, rules)
    return str(error.value)


# --- what passes ------------------------------------------------------------------------------


def test_a_lora_of_the_served_shapes_passes_as_a_plain_shared_voice(tmp_path):
    folder = make_adapter(tmp_path)
    voice = validate_adapter(folder, RULES)
    assert (voice.voice_id, voice.name, voice.prompt_style) == ("my-voice", "my-voice", "plain")
    assert voice.adapter_path == folder and voice.tenant is None
    assert voice.checksum == hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()


def test_the_manifest_names_the_voice_its_prompt_style_and_tenant(tmp_path):
    manifest = {"name": "Tara", "prompt_style": "named", "tenant": "A"}
    voice = validate_adapter(make_adapter(tmp_path, manifest=manifest), RULES)
    assert (voice.name, voice.prompt_style, voice.tenant) == ("Tara", "named", "A")
    plain = validate_adapter(make_adapter(tmp_path, manifest={}, name="other"), RULES)
    assert (plain.name, plain.prompt_style, plain.tenant) == ("other", "plain", None)


def test_a_voice_may_be_registered_under_another_id_than_its_folder(tmp_path):
    folder = make_adapter(tmp_path, name=".staging-123")
    assert validate_adapter(folder, RULES, voice_id="tara").voice_id == "tara"
    with pytest.raises(InvalidAdapter, match="voice id 'Tara' must match"):
        validate_adapter(folder, RULES, voice_id="Tara")
    with pytest.raises(InvalidAdapter, match=r"voice id '\.staging-123' must match"):
        validate_adapter(folder, RULES)


@pytest.mark.parametrize(
    "config",
    [
        {"peft_type": None, "bias": None},  # PEFT's defaults: LORA, bias none
        {"use_dora": False, "layer_replication": None, "modules_to_save": None},
        {"modules_to_save": []},
        {"r": 1},
        {"r": 4},  # max_lora_rank itself
        {"target_modules": ["q_proj", "v_proj"]},
        {"target_modules": ["model.layers.0.self_attn.q_proj", "mlp.down_proj"]},  # all-linear
    ],
)
def test_configs_peft_writes_for_a_servable_lora_pass(tmp_path, config):
    targets = config.get("target_modules", LORA_TARGET_MODULES)
    modules = [t.rsplit(".", 1)[-1] for t in targets]
    tensors = lora_tensors(config.get("r", 2), modules)
    validate_adapter(make_adapter(tmp_path, config=config, tensors=tensors), RULES)


def test_the_config_voicehost_trains_with_is_servable(tmp_path):
    config = servable_lora_config(4, 32).to_dict()
    config["target_modules"] = sorted(config["target_modules"])  # a set in PEFT
    config["base_model_name_or_path"] = "voicehost-dev"
    assert (config["r"], config["lora_alpha"], config["bias"]) == (4, 32, "none")
    assert config["task_type"] == "CAUSAL_LM"  # PEFT wraps a causal LM: vLLM loads that layout
    assert set(config["target_modules"]) == set(LORA_TARGET_MODULES)
    assert not config.get("modules_to_save") and config["lora_dropout"] == 0.0
    folder = make_adapter(tmp_path, config=config, tensors=lora_tensors(4))
    validate_adapter(folder, RULES)


# --- the config's rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"use_dora": True}, "use_dora True is not servable"),  # vLLM serves no DoRA
        ({"layer_replication": [[0, 1]]}, r"layer_replication \[\[0, 1\]\] is not servable"),
        ({"peft_type": "LOHA"}, "peft_type 'LOHA' is not LORA"),
        ({"peft_type": "lora"}, "peft_type 'lora' is not LORA"),
        ({"r": 0}, "rank r=0 must be a positive integer"),
        ({"r": -2}, "rank r=-2 must be a positive integer"),
        ({"r": True}, "rank r=True must be a positive integer"),
        ({"r": "2"}, "rank r='2' must be a positive integer"),
        ({"r": None}, "rank r=None must be a positive integer"),
        ({"r": 5}, "rank 5 exceeds max_lora_rank 4"),
        ({"modules_to_save": ["lm_head"]}, r"modules_to_save \['lm_head'\] is not servable"),
        ({"bias": "lora_only"}, "bias 'lora_only' must be 'none'"),
        ({"bias": None, "peft_type": None, "r": 5}, "rank 5 exceeds"),
        ({"target_modules": []}, r"target_modules \[\] must list module names"),
        ({"target_modules": "q_proj"}, "target_modules 'q_proj' must list module names"),
        ({"target_modules": ["q_proj", 5]}, "must list module names"),
        ({"target_modules": None}, "target_modules None must list module names"),
        (
            {"target_modules": ["q_proj", "model.embed_tokens"]},
            r"target modules \['model.embed_tokens'\] are not attention/MLP projections",
        ),
        ({"target_modules": ["q_proj.lora"]}, "are not attention/MLP projections"),
    ],
)
def test_each_config_vllm_cannot_serve_is_refused_saying_why(tmp_path, config, message):
    assert re.search(message, refused(make_adapter(tmp_path, config=config)))


def test_the_base_model_must_be_declared_and_every_declaration_must_match(tmp_path):
    none = make_adapter(tmp_path, config={"base_model_name_or_path": None}, name="none")
    assert refused(none) == "no base model declared (the served one is 'org/voicehost-dev')"
    in_manifest = make_adapter(
        tmp_path,
        config={"base_model_name_or_path": None},
        manifest={"base_model": "x/voicehost-dev"},
    )
    validate_adapter(in_manifest, RULES)
    both = make_adapter(tmp_path, manifest={"base_model": "meta/Llama-3.2-3B"}, name="both")
    assert refused(both).startswith(
        "base model 'meta/Llama-3.2-3B' does not match the served 'org/voicehost-dev' "
        "(accepted: 'org/voicehost-dev', or a path or hub id"
    )
    number = make_adapter(tmp_path, config={"base_model_name_or_path": 5}, name="number")
    assert refused(number).startswith("base model 5 does not match")


@pytest.mark.parametrize(
    "declared", ["voicehost-dev", "VoiceHost-Dev", "other/voicehost-dev", "/models/voicehost-dev/"]
)
def test_a_base_model_matches_by_the_last_part_of_its_name_in_any_case(tmp_path, declared):
    validate_adapter(make_adapter(tmp_path, config={"base_model_name_or_path": declared}), RULES)
    served_in_capitals = AdapterRules("/models/VOICEHOST-DEV/", 4, SHAPE)
    validate_adapter(
        make_adapter(tmp_path, config={"base_model_name_or_path": declared}, name="caps"),
        served_in_capitals,
    )


@pytest.mark.parametrize("declared", ["voicehost", "voicehost-dev/extra", "voicehost-dev-2"])
def test_a_base_model_whose_last_part_differs_is_refused(tmp_path, declared):
    folder = make_adapter(tmp_path, config={"base_model_name_or_path": declared})
    assert refused(folder).startswith(f"base model {declared!r} does not match")


def test_a_base_model_may_name_an_alias_of_the_served_model(tmp_path):
    rules = AdapterRules("orpheus", 4, SHAPE, aliases=("/models/orpheus-3b-0.1-ft",))
    folder = make_adapter(
        tmp_path, config={"base_model_name_or_path": "canopylabs/orpheus-3b-0.1-ft"}
    )
    validate_adapter(folder, rules)
    other = make_adapter(tmp_path, config={"base_model_name_or_path": "x/other"}, name="other")
    assert "(accepted: 'orpheus', '/models/orpheus-3b-0.1-ft'," in refused(other, rules)


# --- the manifest and the files -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"prompt_style": "shout"}, "voice.json: prompt_style must be 'plain' or 'named'"),
        ({"tenant": ""}, "voice.json: tenant must be a non-empty string"),
        ({"tenant": 5}, "voice.json: tenant must be a non-empty string"),
        ({"tenant": ["A"]}, "voice.json: tenant must be a non-empty string"),
    ],
)
def test_a_manifest_that_cannot_be_used_is_refused(tmp_path, manifest, message):
    assert refused(make_adapter(tmp_path, manifest=manifest)) == message


def test_pickle_files_beside_the_adapter_are_refused_and_named(tmp_path):
    folder = make_adapter(tmp_path)
    (folder / "optimizer.PT").write_bytes(b"\x80\x04")
    assert refused(folder) == "pickle files are refused (safetensors only): optimizer.PT"
    (folder / "rng.pkl").write_bytes(b"\x80\x04")
    assert refused(folder).endswith(("optimizer.PT, rng.pkl", "rng.pkl, optimizer.PT"))


def test_a_config_or_manifest_of_up_to_64_kib_is_read_and_a_larger_one_refused(tmp_path):
    folder = make_adapter(tmp_path)
    config = (folder / "adapter_config.json").read_text()
    (folder / "adapter_config.json").write_text(config + " " * (MAX_JSON_BYTES - len(config)))
    validate_adapter(folder, RULES)
    (folder / "voice.json").write_text("{}" + " " * (MAX_JSON_BYTES - 1))
    assert refused(folder) == "voice.json is over 65536 bytes"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "adapter_config.json must be a JSON object"),
        ('"r"', "adapter_config.json must be a JSON object"),
        ("{", "adapter_config.json is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "adapter_config.json is not valid JSON"),
    ],
)
def test_a_config_that_is_not_a_json_object_is_refused(tmp_path, content, message):
    folder = make_adapter(tmp_path)
    (folder / "adapter_config.json").write_text(content[:MAX_JSON_BYTES])
    assert refused(folder).startswith(message)


# --- the weights --------------------------------------------------------------------------------


def header_file(folder: Path, header: bytes, declared: int | None = None) -> None:
    """A weights file: 8 bytes of header length (``declared``, default the real one), the header."""
    length = len(header) if declared is None else declared
    (folder / WEIGHTS).write_bytes(length.to_bytes(8, "little") + header)


def test_a_header_as_long_as_the_file_allows_is_read_and_one_byte_more_refused(tmp_path):
    folder = make_adapter(tmp_path)
    header_file(folder, b"{}")  # the shortest header: 2 bytes, and then no tensors
    assert refused(folder) == "adapter_model.safetensors holds no tensors"
    header_file(folder, b"{}", declared=3)
    assert (
        refused(folder)
        == "adapter_model.safetensors is not a readable safetensors file (bad header)"
    )
    header_file(folder, b"{", declared=1)
    assert refused(folder).endswith("(bad header)")
    header_file(folder, b"[]")
    assert refused(folder).endswith("(bad header)")
    (folder / WEIGHTS).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00")  # 8 bytes: no header
    assert refused(folder).endswith("(bad header)")


def test_a_header_that_promises_data_the_file_lacks_is_refused(tmp_path):
    folder = make_adapter(tmp_path)
    tensor = {"x.q_proj.lora_A.weight": {"dtype": "F32", "shape": [2, 8], "data_offsets": [0, 64]}}
    header_file(folder, json.dumps(tensor).encode())
    message = refused(folder)
    assert message.startswith("adapter_model.safetensors is not a readable safetensors file: ")


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"base_model.model.lm_head.weight": np.zeros((4, 4), np.float32)},
            "unexpected tensor 'base_model.model.lm_head.weight' (only LoRA A/B of projections)",
        ),
        (
            {"x.q_proj.weight": np.zeros((8, 8), np.float32)},
            "unexpected tensor 'x.q_proj.weight' (only LoRA A/B of projections)",
        ),
        (
            {"x.q_proj.lora_A.weight": np.zeros((2, 8, 1), np.float32)},
            "tensor 'x.q_proj.lora_A.weight' has shape [2, 8, 1], expected a matrix",
        ),
        (
            {"x.q_proj.lora_A.weight": np.zeros((3, 8), np.float32)},
            "tensor 'x.q_proj.lora_A.weight' has shape [3, 8], expected [2, 8]",
        ),
        (
            {"x.k_proj.lora_B.weight": np.zeros((8, 2), np.float32)},
            "tensor 'x.k_proj.lora_B.weight' has shape [8, 2], expected [4, 2]",
        ),
        (
            {"x.down_proj.lora_A.weight": np.zeros((2, 8), np.float32)},
            "tensor 'x.down_proj.lora_A.weight' has shape [2, 8], expected [2, 12]",
        ),
    ],
)
def test_tensors_other_than_the_lora_matrices_of_the_served_shapes_are_refused(
    tmp_path, tensors, message
):
    assert refused(make_adapter(tmp_path, tensors=tensors)) == message


def test_without_a_model_shape_only_the_rank_of_each_matrix_is_checked(tmp_path):
    rules = AdapterRules("voicehost-dev", 4)
    odd = lora_tensors(2, shape=ModelShape(hidden=5, intermediate=7, q_out=3, kv_out=1))
    validate_adapter(make_adapter(tmp_path, tensors=odd), rules)
    wrong_rank = {"x.q_proj.lora_B.weight": np.zeros((8, 3), np.float32)}
    folder = make_adapter(tmp_path, tensors=wrong_rank, name="wrong")
    assert (
        refused(folder, rules)
        == "tensor 'x.q_proj.lora_B.weight' has shape [8, 3], expected [8, 2]"
    )


# --- the model's shape, the tenant --------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "shape"),
    [
        (
            {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8},
            ModelShape(hidden=64, intermediate=96, q_out=64, kv_out=64),
        ),
        (
            {
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
            },
            ModelShape(hidden=64, intermediate=96, q_out=64, kv_out=16),
        ),
        (
            {
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 16,
            },
            ModelShape(hidden=64, intermediate=96, q_out=128, kv_out=32),
        ),
    ],
)
def test_the_model_shape_comes_from_the_models_config(tmp_path, config, shape):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert ModelShape.from_config(path) == shape
    assert shape.in_out("o_proj") == (shape.q_out, shape.hidden)
    assert shape.in_out("v_proj") == (shape.hidden, shape.kv_out)
    assert shape.in_out("down_proj") == (shape.intermediate, shape.hidden)


def test_a_manifest_names_its_tenant_only_with_a_non_empty_string():
    assert voice_tenant({"tenant": "A"}) == "A"
    assert voice_tenant({}) is None and voice_tenant({"tenant": ""}) is None
    assert voice_tenant({"tenant": 5}) is None


def test_assigning_a_tenant_keeps_the_rest_of_the_manifest(tmp_path):
    assign_tenant(tmp_path, "A")  # no manifest yet: one is written
    assert json.loads((tmp_path / "voice.json").read_text()) == {"tenant": "A"}
    (tmp_path / "voice.json").write_text(json.dumps({"name": "Tara", "tenant": "B"}))
    assign_tenant(tmp_path, "A")
    assert json.loads((tmp_path / "voice.json").read_text()) == {"name": "Tara", "tenant": "A"}
    assign_tenant(tmp_path, None)
    assert json.loads((tmp_path / "voice.json").read_text()) == {"name": "Tara"}
