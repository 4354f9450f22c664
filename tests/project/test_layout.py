"""The package's layout, pinned: packages follow the data and import only the ones below them
(text, voices, model, audio, webrtc, tenancy, speech, host, lora_training, cloning, serving, api,
cluster, then the tools, the client, its integrations and the entry points); lora_training and the
serving side depend one way; the benchmark client stays out of what serving imports, and the
settings load no web framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "voicehost"

# Lowest first: each may import only those before it (and the shared modules below).
LAYERS = [
    "text",  # the text stage: segmentation, normalisation, lexicons applied
    "voices",  # the voice type, voice@n, the folders on disk, adapter validation
    "model",  # the token format, the codec, the engine, the dev model
    "audio",  # response formats, tempo, where speech starts, the speaker embedder
    "webrtc",  # the WebRTC peer's rules: ICE servers, ports and screen, what an offer holds
    "tenancy",  # keys, audit, usage, the lexicon store
    "speech",  # the synthesis pipeline, admission, capacity
    "host",  # one engine core, several front ends: the launcher, shared tables, the channel
    "lora_training",  # training components: on the core above, never the serving side
    "cloning",  # jobs, consent, candidate and evaluation
    "serving",  # the serving process that composes it all
    "api",  # HTTP
    "cluster",  # Redis, workers, gateways
    "tools",  # doctor, the dev server and corpus, the benchmark client
    "client",  # the public Python client
    "integrations",  # the client in agent frameworks' terms (LiveKit Agents)
    "cli",  # the entry point
]
# Shared by every layer; they import no package (config: only the ids).
SHARED = {"ids", "metrics", "lifeline", "config", "errors"}
# What config.py imports of the project: the ids alone, no layer (issue 43). The rules built from
# settings are built by their own layers (AdapterRules.from_settings, LexiconLimits.from_settings,
# Realtime.from_settings), and what the model's layout decides by the model (model/served.py).
CONFIG_IMPORTS = {"voicehost.ids"}


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


def unit_of(module: str) -> str | None:
    """The layer (or shared module) a dotted module belongs to; ``None`` outside the project."""
    parts = module.split(".")
    if parts[0] == "lora_training":
        return "lora_training"
    if parts[0] != "voicehost" or len(parts) < 2:
        return None
    return parts[1]


def unit_of_file(path: Path) -> str:
    relative = path.relative_to(ROOT).parts
    if relative[0] == "lora_training":
        return "lora_training"
    return relative[1].removesuffix(".py")


def project_files() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "lora_training").rglob("*.py")])


def importers(target: str, files: list[Path]) -> list[str]:
    """The files among ``files`` that import ``target`` or anything under it."""
    return sorted(
        str(f.relative_to(ROOT))
        for f in files
        if any(m == target or m.startswith(target + ".") for m in imported_modules(f))
    )


def upward_imports() -> list[str]:
    """Every import of a file that reaches a layer at or above its own (other than itself)."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    found = []
    for path in project_files():
        unit = unit_of_file(path)
        if unit in ("__init__", "__main__", "config"):  # config: below
            continue
        for module in imported_modules(path):
            target = unit_of(module)
            if target is None or target == unit or target not in rank:
                continue
            if unit in SHARED or rank[target] >= rank[unit]:
                found.append(f"{path.relative_to(ROOT)} imports {module}")
    return sorted(found)


def test_every_module_is_in_a_layer_or_shared():
    units = {unit_of_file(p) for p in project_files()} - {"__init__", "__main__"}
    assert units - set(LAYERS) - SHARED == set()
    top_level = [p.name for p in PACKAGE.glob("*.py")]
    # the shared modules (ids, errors, metrics, lifeline, config), the entry points, the client
    assert len(top_level) <= 10, top_level


def test_packages_import_only_the_layers_below_them():
    assert upward_imports() == []


def test_the_settings_import_no_layer_only_the_ids():
    tree = ast.parse((PACKAGE / "config.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and unit_of(node.module):
            folder = ROOT.joinpath(*node.module.split("."))
            if folder.is_dir():  # `from voicehost.model import orpheus`: the module
                modules.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                modules.add(node.module)
    assert modules <= CONFIG_IMPORTS, modules


def test_lora_training_and_the_serving_side_depend_one_way():
    """Training needs the token format, the codec, the adapter contract and the audio helpers;
    the serving side (cloning, the serving process, the API, the CLI) runs training."""
    training = sorted((ROOT / "lora_training").rglob("*.py"))
    used = {unit_of(m) for f in training for m in imported_modules(f)} - {None, "lora_training"}
    shared = {"config", "lifeline", "ids", "errors"}
    assert used <= {"model", "audio", "voices", "text", *shared}, used
    serving_side = [p for p in PACKAGE.rglob("*.py") if importers("lora_training", [p])]
    units = {unit_of_file(p) for p in serving_side}
    assert units <= {"cloning", "serving", "cli"}, units


def test_the_api_imports_no_training_module():
    """Intake (``voicehost.cloning.intake``) runs the training pipeline's checks; their errors
    are the service's own (``voicehost.errors``), answered from the error table."""
    assert importers("lora_training", sorted((PACKAGE / "api").rglob("*.py"))) == []


def test_the_api_never_imports_the_cluster():
    assert importers("voicehost.cluster", sorted((PACKAGE / "api").rglob("*.py"))) == []


def test_only_the_cli_imports_the_benchmark_client():
    bench = PACKAGE / "tools" / "bench"
    serving = [f for f in PACKAGE.rglob("*.py") if bench not in f.parents]
    assert importers("voicehost.tools.bench", serving) == ["voicehost/cli.py"]


def test_importing_the_settings_loads_no_web_framework_and_no_log_filter():
    probe = (
        "import logging, sys\n"
        "import voicehost.config\n"
        "assert 'aiohttp' not in sys.modules, sorted(m for m in sys.modules if 'aiohttp' in m)\n"
        "assert not logging.getLogger('aiohttp.access').filters\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_rules_above_see_a_lazy_import_and_an_upward_one(tmp_path):
    """The checker itself: an import inside a function is found, and placed in its layer."""
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from voicehost.cluster.worker import WorkerCluster\n")
    assert "voicehost.cluster.worker" in imported_modules(module)
    assert unit_of("voicehost.cluster.worker") == "cluster"
    assert unit_of("voicehost.speech.synthesis") == "speech"
    assert unit_of("lora_training.recipe") == "lora_training"
    assert LAYERS.index("model") < LAYERS.index("speech") < LAYERS.index("api")
