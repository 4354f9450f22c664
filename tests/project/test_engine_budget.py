"""The suite's engine budget: at most ``helpers.ENGINE_BOOTS`` dev engine cores boot in one run,
at most ``helpers.MAX_ENGINES`` at once (each boot costs 40-50 CPU-seconds on the 2-core machine
the suite must finish on in 8 minutes, and holds 3.7-5.6 GiB).

Here, the engine cores the suite's fixtures declare (``start_early(..., engines=N)``), read
from the test modules' source, and the rule that every dev server is started through one.
During a run, ``helpers.record_start`` fails a start that would run more than ``MAX_ENGINES``
at once, and conftest fails the run if it booted more than ``ENGINE_BOOTS`` (its last lines
name each boot)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import helpers
import lanes
import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
# what starts a dev engine: only inside a function registered with start_early
STARTS_AN_ENGINE = {"EarlyServer", "dev_server", "start_dev_server"}


def modules() -> list[tuple[Path, ast.Module]]:
    paths = sorted(TESTS.rglob("*.py"))
    return [(p, ast.parse(p.read_text(), str(p))) for p in paths if p.name != "helpers.py"]


def declared_engines() -> dict[str, int]:
    """fixture -> engine cores, for every ``start_early`` registration in the tests."""
    declared: dict[str, int] = {}
    for path, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and called(decorator) == "start_early":
                    fixture = ast.literal_eval(decorator.args[0])
                    engines = next(
                        (
                            ast.literal_eval(k.value)
                            for k in decorator.keywords
                            if k.arg == "engines"
                        ),
                        1,
                    )
                    assert fixture not in declared, f"{fixture} is registered twice ({path})"
                    declared[fixture] = engines
    return declared


def called(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def test_the_suite_declares_at_most_four_engine_cores_and_three_at_once():
    declared = declared_engines()
    booted = sum(declared.values())
    listed = ", ".join(f"{name} ({cores})" for name, cores in sorted(declared.items()))
    assert booted <= helpers.ENGINE_BOOTS, (
        f"the suite's fixtures boot {booted} engine cores, over the budget of "
        f"{helpers.ENGINE_BOOTS}: {listed}. Share the shared server (a runtime setting: "
        f"helpers.runtime_settings) or the cluster's w1 instead of booting another."
    )
    assert helpers.ENGINE_BOOTS == 4 and helpers.MAX_ENGINES == 3
    assert all(cores <= helpers.MAX_ENGINES for cores in declared.values()), listed
    # what each is: the shared server, and the cluster's three workers (w1, which is the keyed
    # host before the cluster's tests; fr, its French worker; w2)
    engines = {name: cores for name, cores in declared.items() if cores}
    assert engines == {"server": 1, "fleet": 1, "french_worker": 1, "second_worker": 1}, listed


def test_each_engine_fixture_boots_in_one_lane_within_that_lanes_share():
    """``make test`` runs the suite as lanes side by side (tests/lanes.py): each fixture that
    boots engines belongs to one lane (so it boots once a run), and the lanes' shares of the
    engines that run at once add up to the budget's three."""
    engines = {name: cores for name, cores in declared_engines().items() if cores}
    assert set(engines) == set(lanes.FIXTURE_LANES), "a new engine fixture needs its lane"
    assert sum(lanes.LANE_ENGINES.values()) == helpers.MAX_ENGINES
    for name, cores in engines.items():
        assert cores <= lanes.LANE_ENGINES[lanes.FIXTURE_LANES[name]], name


def test_dev_servers_start_only_through_a_start_early_registration():
    """A dev server started anywhere else would boot an engine the budget does not count."""
    strays = []
    for path, tree in modules():
        registered = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
            and (
                any(
                    isinstance(d, ast.Call) and called(d) == "start_early"
                    for d in getattr(node, "decorator_list", [])
                )
                or node.name.startswith("Early")  # an Early's own start (the cluster's)
            )
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and called(node) in STARTS_AN_ENGINE:
                if id(node) not in registered:
                    strays.append(f"{path.relative_to(TESTS)}:{node.lineno} {called(node)}")
    assert not strays, f"dev servers started outside start_early: {strays}"


def test_the_budget_test_finds_a_fixture_over_the_budget(tmp_path, monkeypatch):
    """The count above reads the registrations as written: one more boot is seen."""
    extra = tmp_path / "test_extra.py"
    extra.write_text(
        "from helpers import EarlyServer, start_early\n\n"
        "@start_early('own_server', engines=1)\n"
        "def start_own(factory):\n"
        "    return EarlyServer(factory.mktemp('own'))\n"
    )
    real = modules()
    monkeypatch.setitem(
        globals(), "modules", lambda: [*real, (extra, ast.parse(extra.read_text()))]
    )
    assert declared_engines()["own_server"] == 1
    with pytest.raises(AssertionError, match="over the budget of 4: fleet"):
        test_the_suite_declares_at_most_four_engine_cores_and_three_at_once()


def test_the_test_process_runs_torch_on_one_thread_as_its_servers_do():
    """conftest sets ``OMP_NUM_THREADS`` before anything imports torch (torch reads it once, at
    its import): two lanes side by side on two cores, beside booting engines, ran a speaker-
    embedder test in 73 s with torch's default two threads, 3 s with one."""
    import torch

    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"]) == 1
