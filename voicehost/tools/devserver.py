"""Start dev-model processes and wait for them: the one harness of the tests, ``voicehost bench
--start-server`` and the scripts.

A process runs in its own process group (``launch``), so ``stop`` also ends the vLLM engine
processes under it, which outlive a parent that died before shutting them down. ``wait_ready``
polls ``/readyz`` and raises ``StartFailed`` with the tail of the process's log when it exits, its
start-up fails or it stalls. ``dev_server`` wraps the three around ``voicehost serve --dev``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

LOG_TAIL_CHARS = 3000


class StartFailed(RuntimeError):
    """A process that was to serve did not get ready; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def voicehost_command(*args: str) -> list[str]:
    """``python -m voicehost ARGS`` with this interpreter."""
    return [sys.executable, "-m", "voicehost", *args]


def dev_env(**extra: str) -> dict[str, str]:
    """This process's environment for a dev-model child, with ``extra`` (``VOICEHOST_*``
    settings) added; the CPU engine's KV cache is 1 GiB unless the environment says otherwise."""
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        **extra,
    }


# A dev engine is not bound to cores: its worker runs in the engine core's process with the
# environment's OpenMP threads (``engine.in_core_worker``), wherever the kernel puts it. A
# benchmark that wants engines side by side on cores of their own binds each: vLLM's own
# binding (``auto``) would put every engine's threads on the first core of the machine.
_engine_starts = itertools.count()


def engine_core_env() -> dict[str, str]:
    """The CPU binding of the next engine this process starts: one core each, in turn over the
    cores this process may use. Empty when the environment already sets one."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[next(_engine_starts) % len(cores)])}


def launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own process group, its stdout and stderr written to ``log``."""
    with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def launch_redis(port: int, log: Path) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``port`` that keeps nothing on disk (a restart starts it empty)."""
    command = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    return launch(command, dev_env(), log)


def log_tail(log: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of ``log`` (empty when it cannot be read)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_ready(
    process: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 300
) -> list[int]:
    """Poll ``url/readyz`` until it answers 200; the readiness statuses seen, in order.

    Raises ``StartFailed`` (with the log's tail) when the process exits, ``/healthz`` says its
    start-up failed, or ``timeout`` seconds pass.
    """
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartFailed(f"{process.args} exited with {process.returncode}:\n{log_tail(log)}")
        status = http_status(f"{url}/readyz", timeout=5)
        if status is None:  # not listening yet, or too busy to answer in time
            time.sleep(0.2)
            continue
        seen.append(status)
        if status == 200:
            return seen
        health = http_status(f"{url}/healthz", timeout=5)
        if health is not None and health != 200:  # it answered: its start-up failed
            raise StartFailed(f"{process.args}: start-up failed:\n{log_tail(log)}")
        time.sleep(0.5)
    raise StartFailed(f"{process.args}: not ready in {timeout:.0f} s:\n{log_tail(log)}")


def stop(process: subprocess.Popen[bytes], grace: float = 30) -> None:
    """SIGTERM to a ``launch``ed process, SIGKILL after ``grace`` seconds, then SIGKILL to
    anything of its process group still running."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class DevServer:
    """A running ``voicehost serve --dev``."""

    url: str
    adapters: Path
    log: Path
    process: subprocess.Popen[bytes]
    readiness: list[int] = field(default_factory=list)  # /readyz statuses until it was ready

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_dev_server(root: Path, **env: str) -> DevServer:
    """``voicehost serve --dev`` started on a free port with its adapters and jobs folders and
    its log under ``root`` and ``env`` (``VOICEHOST_*`` settings) added; not waited for (see
    ``wait_ready``), and the caller's to ``stop``."""
    adapters = root / "adapters"
    adapters.mkdir(parents=True, exist_ok=True)
    log = root / "server.log"
    port = free_port()
    command = voicehost_command("serve", "--dev", "--port", str(port), "--adapters", str(adapters))
    folders = {
        "VOICEHOST_JOBS_DIR": str(root / "jobs"),
        "VOICEHOST_LEXICONS_DIR": str(root / "lexicons"),
    }
    env = {**folders, **env}
    process = launch(command, dev_env(**env), log)
    return DevServer(f"http://127.0.0.1:{port}", adapters, log, process)


@contextlib.contextmanager
def dev_server(root: Path, ready_timeout: float = 300, **env: str) -> Iterator[DevServer]:
    """``start_dev_server``, ready when the block starts and stopped when it ends."""
    server = start_dev_server(root, **env)
    try:
        server.readiness.extend(wait_ready(server.process, server.url, server.log, ready_timeout))
        yield server
    finally:
        stop(server.process)


@contextlib.contextmanager
def served(
    url: str | None, ready_timeout: float = 600
) -> Iterator[tuple[str, subprocess.Popen[bytes] | None]]:
    """``url`` as it is, or (``None``) a dev server started for the block in a temporary folder
    and stopped after it: yields the URL and the server's process (``None`` when not started
    here). Says on stderr where the server's log is."""
    if url is not None:
        yield url, None
        return
    root = Path(tempfile.mkdtemp(prefix="voicehost-dev-server-"))
    print(f"starting a dev server (log {root / 'server.log'}) ...", file=sys.stderr, flush=True)
    with dev_server(root, ready_timeout) as server:
        print(f"server ready at {server.url}", file=sys.stderr, flush=True)
        yield server.url, server.process
