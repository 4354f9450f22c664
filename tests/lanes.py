"""Lanes: the suite as two pytest processes side by side (``make test``, through
``scripts/test_lanes.py``), each running the modules of its lane.

One pytest process runs one test at a time: while a test waits on an engine (most of a server
test's time) the other core idles, and while the unit tests run the engines boot beside one
pytest process only. Two lanes keep both cores busy. Each engine fixture belongs to one lane,
so each still boots once in a run (the engine budget: ``helpers.ENGINE_BOOTS``), and each lane
runs at most its share of ``helpers.MAX_ENGINES`` at once.

    pytest --lane 1/2    # the shared server's modules and their share of the rest
    pytest --lane 2/2    # the cluster's (w1 the keyed host first, then fr, w2) and the rest

Tests marked ``paced`` or ``last`` (they hold code to real time, or measure the engine's rate)
wait, in a run of lanes, until every other lane has reached its own paced tests or ended
(``VOICEHOST_LANES_DIR``, where each lane says so): they run on a machine the other lane no
longer loads.

A module goes to the lane of the engine fixture its tests use; a module that uses none goes
where ``ENGINELESS_LANES`` puts it (its measured cost: docs/BENCHMARKS.md), else to lane 2 if
all its tests are unit tests, else to lane 1. A module's lane is the same whatever ``-m`` or
``-k`` selects, so ``make test-fast`` runs the unit tests in the lanes ``make test`` does. Without
``--lane`` one process runs everything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import helpers
import pytest

LANES = 2
# the lane of each fixture that boots engine cores, and the cores each lane runs at once at
# most (together helpers.MAX_ENGINES): the shared server in lane 1; the cluster's w1 in lane 2,
# beside fr, then beside w2 (tests/cluster_fleet.py)
FIXTURE_LANES = {"server": 1, "fleet": 2, "french_worker": 2, "second_worker": 2}
LANE_ENGINES = {1: 1, 2: 2}
# modules without an engine whose cost would tip the lanes' balance: where each goes (the
# others go to lane 2, beside the cluster's modules (the keyed host's too), if all their tests are
# unit tests, else to lane 1). Measured (docs/BENCHMARKS.md): lane 1's server modules hold about
# a third of the unit tests' time and finished the whole run 40 s before lane 2; these,
# about a fifth of it, even out both `make test` and `make test-fast`.
ENGINELESS_LANES: dict[str, int] = {
    "test_quality": 1,
    "test_lifeline": 1,
    # a Redis of their own each, no engine: beside the cluster's modules, in the lane that
    # ends first (lane 1 holds the shared server's modules, the trainings and the browser)
    **dict.fromkeys(
        (
            "test_cluster_models",
            "test_cluster_voices",
            "test_cluster_usage",
            "test_membership",
            "test_leases",
            "test_alert_metrics",
        ),
        2,
    ),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        default=None,
        metavar="K/N",
        help=f"run only lane K of the suite's N={LANES} lanes (tests/lanes.py)",
    )


def selected_lane(config: pytest.Config) -> int | None:
    """The lane this process runs (1 or 2), or None for the whole suite."""
    value = config.getoption("lane")
    if value is None:
        return None
    lane, _, count = value.partition("/")
    if count != str(LANES) or lane not in {str(k) for k in range(1, LANES + 1)}:
        raise pytest.UsageError(f"--lane {value}: give K/{LANES}, K from 1 to {LANES}")
    return int(lane)


def module_lanes(items: list[pytest.Item]) -> dict[str, int]:
    """The lane of each module (by its path relative to the tests) of ``items``."""
    fixtures: dict[str, set[str]] = {}
    units: dict[str, bool] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        fixtures.setdefault(module, set()).update(getattr(item, "fixturenames", ()))
        unit = item.get_closest_marker("unit") is not None
        units[module] = units.get(module, True) and unit
    lanes = {}
    for module, names in fixtures.items():
        engine_lanes = {FIXTURE_LANES[name] for name in names & FIXTURE_LANES.keys()}
        if len(engine_lanes) > 1:
            raise pytest.UsageError(
                f"{module} uses engine fixtures of lanes {sorted(engine_lanes)}: a module's "
                "tests share one lane's engines (tests/lanes.py)"
            )
        stem = module.rsplit("/", 1)[-1].removesuffix(".py")
        if engine_lanes:
            (lanes[module],) = engine_lanes
        elif stem in ENGINELESS_LANES:
            lanes[module] = ENGINELESS_LANES[stem]
        else:
            lanes[module] = 2 if units[module] else 1
    return lanes


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect: a module's lane is its whole own
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = selected_lane(config)
    if lane is None:
        return
    lanes = module_lanes(items)
    keep = [item for item in items if lanes[item.nodeid.split("::")[0]] == lane]
    dropped = [item for item in items if lanes[item.nodeid.split("::")[0]] != lane]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    """A lane runs at most its share of the engine cores at once (``helpers.engine_cap``)."""
    lane = selected_lane(config)
    helpers.engine_cap = helpers.MAX_ENGINES if lane is None else LANE_ENGINES[lane]


LANES_DIR = "VOICEHOST_LANES_DIR"  # set by scripts/test_lanes.py: where lanes say how far they are
PACED_WAIT_SECONDS = 900.0
_paced_reached = False


def _mark(config: pytest.Config, stage: str) -> None:
    folder, lane = os.environ.get(LANES_DIR), selected_lane(config)
    if folder and lane is not None:
        Path(folder, f"lane-{lane}.{stage}").touch()


def _others_paced_or_done(config: pytest.Config) -> bool:
    folder, lane = Path(os.environ[LANES_DIR]), selected_lane(config)
    others = [k for k in range(1, LANES + 1) if k != lane]
    return all(
        (folder / f"lane-{k}.paced").exists() or (folder / f"lane-{k}.done").exists()
        for k in others
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _paced_reached
    paced = item.get_closest_marker("paced") or item.get_closest_marker("last")
    unit = item.get_closest_marker("unit") is not None  # light, and no server boots in a lane
    if paced is None or unit or _paced_reached or LANES_DIR not in os.environ:
        return
    _paced_reached = True
    _mark(item.config, "paced")
    started = time.monotonic()
    deadline = started + PACED_WAIT_SECONDS
    while not _others_paced_or_done(item.config) and time.monotonic() < deadline:
        time.sleep(0.5)
    _waited.append(time.monotonic() - started)


_waited: list[float] = []  # how long this lane waited for the other at its paced tests


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A lane's idle time, for whoever balances the lanes (said after the run: a line written
    while a test sets up is captured with it)."""
    if _waited:
        lane = selected_lane(terminalreporter.config)
        terminalreporter.write_line(
            f"lane {lane}: waited {_waited[0]:.1f} s for the other lane at its paced tests"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    _mark(session.config, "done")
