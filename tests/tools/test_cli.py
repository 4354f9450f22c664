"""The command line: dev-model, serve's refusals, and a failed start-up reported on /healthz."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from helpers import free_port, http_status

from voicehost.cli import main
from voicehost.model.devmodel import DevModelPaths, fingerprint


def voicehost(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "voicehost", *args], capture_output=True, text=True, **kwargs
    )


@pytest.mark.unit
def test_dev_model_command_builds_into_the_given_folder(tmp_path, dev_model):
    # in this process (the console script itself is the other tests' subprocess): a second
    # interpreter importing torch and transformers cost more than the build
    assert main(["dev-model", "--out", str(tmp_path / "dm")]) == 0
    assert json.loads((tmp_path / "dm" / "stamp.json").read_text())["seed"] == 1234
    assert (tmp_path / "dm" / "adapters" / "dev-c" / "adapter_model.safetensors").is_file()
    # the same seed, the same weights as the session's own build (one build, not two, checks it)
    assert fingerprint(DevModelPaths(tmp_path / "dm")) == fingerprint(dev_model)


@pytest.mark.unit
def test_serve_without_a_model_or_dev_says_what_to_pass():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEHOST_")}
    result = voicehost("serve", timeout=60, env=env)
    assert result.returncode == 2
    assert "--model" in result.stderr and "--dev" in result.stderr


def test_a_model_that_cannot_load_is_reported_not_fatal(tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "voicehost", "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--model", str(tmp_path / "no-such-model")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if http_status(url + "/healthz") == 503:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            raise AssertionError("start-up failure never reported on /healthz")
        assert http_status(url + "/readyz") == 503
        assert process.poll() is None  # still up, reporting it
        with pytest.raises(urllib.error.HTTPError) as failed:  # said in words, and at once:
            urllib.request.urlopen(url + "/healthz", timeout=5)  # before vLLM is imported
        said = failed.value.read().decode()
        assert "the model folder" in said and "does not exist" in said, said
    finally:
        process.terminate()
        process.wait(timeout=30)
