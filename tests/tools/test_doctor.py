"""``voicehost doctor``: passes on the dev model in-process, names what is wrong in a model
folder whose special token sits at another id, and speaks each voice through a running server."""

from __future__ import annotations

import json
import shutil

import pytest

from voicehost.cli import main

CHECKS_ON_THIS_MACHINE = {"python", "torch", "cuda", "vllm", "gpu", "engine", "codec"}


@pytest.fixture
def no_adapters(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICEHOST_ADAPTERS_DIR", str(tmp_path / "no-adapters"))
    monkeypatch.delenv("VOICEHOST_REDIS_URL", raising=False)


@pytest.mark.unit
def test_doctor_passes_on_the_dev_model(tmp_path, dev_model, no_adapters, capsys):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--dev", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and CHECKS_ON_THIS_MACHINE <= set(rows)
    assert rows["model vocabulary"]["detail"].startswith("156940 ids")
    assert rows["special tokens"]["detail"] == "all 12 at their Orpheus ids"
    assert "kv cache auto" in rows["engine"]["detail"]  # the model's dtype on this CPU
    assert "constrained sampling on" in rows["engine"]["detail"]
    assert {"adapter dev-a", "adapter dev-b", "adapter dev-c"} <= set(rows)
    assert rows["languages"]["detail"].startswith("en (tara, leah, jess, leo, dan, mia, zac, zoe)")
    printed = capsys.readouterr().out
    assert "special tokens" in printed and "FAIL" not in printed


@pytest.mark.unit
def test_doctor_fails_with_a_clear_line_on_a_special_token_at_the_wrong_id(
    tmp_path, dev_model, no_adapters, capsys
):
    """A model folder whose tokenizer swapped start and end of speech: it would load and serve,
    and every stream would stop at once."""
    folder = tmp_path / "swapped"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        shutil.copy(dev_model.model / name, folder / name)
    (folder / "model.safetensors").symlink_to(dev_model.model / "model.safetensors")
    tokenizer = json.loads((dev_model.model / "tokenizer.json").read_text())
    for token in tokenizer["added_tokens"]:
        if token["id"] in (128257, 128258):
            token["content"] = {128257: "<custom_token_2>", 128258: "<custom_token_1>"}[token["id"]]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    args = ["doctor", "--model", str(folder), "--codec", str(dev_model.codec)]
    assert main([*args, "--json", str(tmp_path / "doctor.json")]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert errors == [
        "voicehost doctor: special tokens failed: start_of_speech <custom_token_1> is id "
        "128258, Orpheus has 128257; end_of_speech <custom_token_2> is id 128257, Orpheus has "
        "128258"
    ]
    rows = {c["name"]: c for c in json.loads((tmp_path / "doctor.json").read_text())["checks"]}
    assert rows["codec"]["ok"] and rows["model vocabulary"]["ok"]  # only the one check fails


def test_doctor_speaks_each_voice_through_a_running_server(tmp_path, server, no_adapters):
    out = tmp_path / "doctor.json"
    args = ["doctor", "--dev", "--url", server.url, "--voice", "tara", "--voice", "dev-a"]
    assert main([*args, "--json", str(out)]) == 0
    rows = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    for voice in ("tara", "dev-a"):
        assert rows[f"voice {voice}"]["ok"]
        assert "first audio" in rows[f"voice {voice}"]["detail"]
        assert "real-time factor" in rows[f"voice {voice}"]["detail"]
    assert rows["constrained sampling"]["ok"]
    assert rows["constrained sampling"]["detail"].startswith("0 malformed frames, 0 stray")
    # a voice the server does not have is a failed row, and the command fails
    assert main(["doctor", "--dev", "--url", server.url, "--voice", "nobody"]) == 1
