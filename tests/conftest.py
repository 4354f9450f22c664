"""Shared fixtures: the dev model (built once, cached) and one real server over real HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from voicehost.config import Settings
from voicehost.devmodel import DevModelPaths, ensure_dev_model

DEV_DIR = Settings().dev_dir


@pytest.fixture(scope="session")
def dev_model() -> DevModelPaths:
    return ensure_dev_model(DEV_DIR)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@dataclass
class Server:
    url: str
    adapters: Path
    log: Path
    process: subprocess.Popen
    readiness: list[int] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def server(dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``voicehost serve --dev`` in a subprocess, with its own adapters folder.

    The codec's noise is off so that audio is a deterministic function of the audio tokens.
    """
    root = tmp_path_factory.mktemp("server")
    adapters = root / "adapters"
    adapters.mkdir()
    log = root / "server.log"
    port = free_port()
    env = {
        **os.environ,
        "VOICEHOST_DEV_DIR": str(DEV_DIR),
        "VOICEHOST_CODEC_NOISE": "false",
        "VOICEHOST_JOBS_DIR": str(root / "jobs"),
        "VOICEHOST_CLONE_EPOCHS": "1",
        "VOICEHOST_MAX_UPLOAD_MB": "20",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    command = [sys.executable, "-m", "voicehost", "serve", "--dev", "--port", str(port)]
    command += ["--adapters", str(adapters)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", adapters, log, process)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(
                    f"server exited with {process.returncode}:\n{server.log_text()[-3000:]}"
                )
            try:
                status = http_status(f"{server.url}/readyz")
            except OSError:
                time.sleep(0.2)
                continue
            server.readiness.append(status)
            if status == 200:
                break
            if http_status(f"{server.url}/healthz") != 200:
                pytest.fail(f"server start-up failed:\n{server.log_text()[-3000:]}")
            time.sleep(0.5)
        else:
            pytest.fail(f"server not ready in 300 s:\n{server.log_text()[-3000:]}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
