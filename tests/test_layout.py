"""The package's layout, pinned: imports point one way (core <- api <- cluster), the benchmark
client stays out of what serving imports, and the settings load no web framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "voicehost"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function (a lazy import counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def importers(target: str, files: list[Path]) -> list[str]:
    """The files among ``files`` that import ``target`` or anything under it."""
    return sorted(
        str(f.relative_to(PACKAGE.parent))
        for f in files
        if any(m == target or m.startswith(target + ".") for m in imported_modules(f))
    )


def package_files(*parts: str) -> list[Path]:
    return sorted(PACKAGE.joinpath(*parts).rglob("*.py"))


def test_the_api_never_imports_the_cluster():
    assert importers("voicehost.cluster", package_files("api")) == []


def test_core_modules_import_neither_the_api_nor_the_cluster():
    core = [
        f
        for f in package_files()
        if f.parent == PACKAGE or f.parent.name == "text"  # not api/, cluster/, bench/
    ]
    core = [f for f in core if f.name not in ("cli.py", "__main__.py")]  # the entry points
    assert core, "no core modules found"
    assert importers("voicehost.api", core) == []
    assert importers("voicehost.cluster", core) == []


def test_only_the_cli_imports_the_benchmark_client():
    serving = [f for f in package_files() if "bench" not in f.relative_to(PACKAGE).parts]
    assert importers("voicehost.bench", serving) == ["voicehost/cli.py"]


def test_importing_the_settings_loads_no_web_framework_and_no_log_filter():
    probe = (
        "import logging, sys\n"
        "import voicehost.config\n"
        "assert 'aiohttp' not in sys.modules, sorted(m for m in sys.modules if 'aiohttp' in m)\n"
        "assert not logging.getLogger('aiohttp.access').filters\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_rules_above_see_a_lazy_import(tmp_path):
    """The checker itself: an import inside a function is found."""
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from voicehost.cluster.worker import WorkerCluster\n")
    assert "voicehost.cluster.worker" in imported_modules(module)
