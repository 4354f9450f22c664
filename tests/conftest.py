"""Shared fixtures: the dev model (built once, cached) and one real server over real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
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


def dev_env(**extra: str) -> dict[str, str]:
    """The environment of a dev-model process; codec noise off, so audio depends only on tokens."""
    return {
        **os.environ,
        "VOICEHOST_DEV_DIR": str(DEV_DIR),
        "VOICEHOST_CODEC_NOISE": "false",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        **extra,
    }


def launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a process in its own process group (with vLLM's engine processes under it)."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float = 300) -> list[int]:
    """Poll ``url/readyz`` until 200; fail with the log's tail if the process dies or stalls.
    Returns the readiness statuses seen."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"{process.args} exited with {process.returncode}:\n{text}")
        try:
            status = http_status(f"{url}/readyz")
        except OSError:
            time.sleep(0.2)
            continue
        seen.append(status)
        if status == 200:
            return seen
        if http_status(f"{url}/healthz") != 200:
            pytest.fail(f"start-up failed:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"not ready in {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    """Stop a ``launch``ed process, then anything of its group still running (vLLM's engine
    processes outlive a parent that died before shutting them down)."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def dev_server(root: Path, **env: str) -> Iterator[Server]:
    """``voicehost serve --dev`` in a subprocess with its own adapters and jobs folders under
    ``root`` and ``env`` (``VOICEHOST_*`` settings) added; stopped on exit."""
    adapters = root / "adapters"
    adapters.mkdir(exist_ok=True)
    log = root / "server.log"
    port = free_port()
    command = [sys.executable, "-m", "voicehost", "serve", "--dev", "--port", str(port)]
    command += ["--adapters", str(adapters)]
    # Nucleus sampling off unless a test sets it: vLLM's CPU sampler sorts the 157k-token
    # vocabulary for top-p at every step of every request, which made the dev engine 2.4x
    # slower (serving's defaults are checked in test_engine and measured by the benchmarks).
    env = {"VOICEHOST_TOP_P": "1.0", **env}
    process = launch(command, dev_env(VOICEHOST_JOBS_DIR=str(root / "jobs"), **env), log)
    server = Server(f"http://127.0.0.1:{port}", adapters, log, process)
    try:
        server.readiness.extend(wait_ready(process, server.url, log))
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="session")
def server(dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared ``voicehost serve --dev``: open (no keys), with its own adapters folder."""
    with dev_server(
        tmp_path_factory.mktemp("server"),
        VOICEHOST_CLONE_EPOCHS="1",
        VOICEHOST_WS_IDLE_TIMEOUT_SECONDS="3",
        # the dev model says ~90 frames whatever the text: few, long segments keep tests short
        VOICEHOST_SEGMENT_MAX_CHARS="900",
        VOICEHOST_SEGMENT_PREFETCH="8",
        VOICEHOST_MAX_UPLOAD_MB="20",
    ) as server:
        yield server


async def say_over_socket(
    ws: aiohttp.ClientWebSocketResponse, voice: str, text: str
) -> tuple[list[str], int]:
    """Speak ``text`` on an open realtime socket (config, text, end) and read it to its close:
    the types of the events received, in order, and the bytes of audio."""
    await ws.send_json({"type": "config", "voice": voice, "response_format": "pcm"})
    await ws.send_json({"type": "text", "text": text})
    await ws.send_json({"type": "end"})
    events, audio = [], 0
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            audio += len(message.data)
        else:
            events.append(json.loads(message.data)["type"])
    return events, audio


async def metric(http: aiohttp.ClientSession, server: Server, name: str) -> float:
    """A server metric from ``/metrics``: ``name`` alone sums its labelled series, ``name{...}``
    reads one series."""
    async with http.get(server.url + "/metrics") as response:
        text = await response.text()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    assert values, f"{name} not in /metrics"
    return sum(values)
