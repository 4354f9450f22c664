"""Where the suite's CPU goes: a pytest plugin that samples the run's process tree (pytest and
every process it started, down to the engine cores) twice a second and charges each process's
CPU time to its kind (engine core, front end, training, browser, ...) and to the test running.

    PYTHONPATH=scripts .venv/bin/pytest -p suite_profile --cpu-profile=/tmp/cpu.json

At the end it prints the CPU-seconds of each kind and of the 25 costliest tests (with their
wall time), and writes both, with every test's, to the JSON file.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

SAMPLE_SECONDS = 0.5


def kind(process: psutil.Process) -> str:
    """What a process of the run is, from its title and command line."""
    try:
        name = process.name()
        line = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "EngineCor" in name or "EngineCore" in line:
        return "engine core"
    if "redis-server" in line:
        return "redis"
    if "chrom" in name or "chrom" in line:
        return "browser"
    if "espeak" in line or line.startswith("sox") or "/sox " in line:
        return "espeak/sox"
    if " train" in line or "clone_runner" in line or "lora_training" in line:
        return "training"
    if "voicehost" in line and ("serve" in line or "gateway" in line or "worker" in line):
        return "front end / gateway"
    if "multiprocessing" in line or "spawn_main" in line:
        return "encoding / spawned"
    return "other: " + name[:24]


class CpuProfile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.root = psutil.Process(os.getpid())
        self.seen: dict[int, tuple[psutil.Process, str, float]] = {}  # pid -> (proc, kind, cpu)
        self.by_kind: dict[str, float] = defaultdict(float)
        self.by_test: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.current = "collection / between tests"
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in tree:
            try:
                times = process.cpu_times()
                cpu = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            last = self.seen.get(process.pid)
            if last is None or last[0] != process:
                label = "pytest" if process == self.root else kind(process)
                delta = cpu  # its whole life so far: it began since the last sample
            else:
                label, delta = last[1], cpu - last[2]
                if label == "encoding / spawned":  # a spawned child names itself once it runs
                    label = kind(process)
            self.seen[process.pid] = (process, label, cpu)
            with self.lock:
                self.by_kind[label] += delta
                self.by_test[self.current] += delta

    def _run(self) -> None:
        while not self.stopped.wait(SAMPLE_SECONDS):
            self._sample()

    def enter(self, test: str) -> None:
        self._sample()
        with self.lock:
            self.current = test
        self.entered = time.monotonic()

    def leave(self, test: str) -> None:
        self._sample()
        self.wall[test] += time.monotonic() - self.entered
        with self.lock:
            self.current = "collection / between tests"

    def finish(self, reporter) -> None:
        self.stopped.set()
        self._sample()
        total = sum(self.by_kind.values())
        wall = time.monotonic() - self.started
        lines = [f"CPU profile: {total:.0f} CPU-s in {wall:.0f} s wall ({total / wall:.2f} cores)"]
        # what the kernel charged to this process and its reaped descendants: the rest were too
        # short-lived for a sample (espeak-ng, sox) or orphaned
        usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        rusage = sum(u.ru_utime + u.ru_stime for u in usage)
        lines.append(f"  (getrusage: self and reaped children {rusage:.0f} CPU-s)")
        for label, cpu in sorted(self.by_kind.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {cpu:8.1f} CPU-s  {label}")
        lines.append("  the 25 costliest tests (CPU-s, wall s):")
        for test, cpu in sorted(self.by_test.items(), key=lambda kv: -kv[1])[:25]:
            lines.append(f"  {cpu:8.1f} {self.wall.get(test, 0):7.1f}  {test}")
        for line in lines:
            reporter.write_line(line)
        self.path.write_text(
            json.dumps(
                {
                    "wall_s": wall,
                    "cpu_s": total,
                    "by_kind": self.by_kind,
                    "by_test": {t: [c, self.wall.get(t, 0)] for t, c in self.by_test.items()},
                },
                indent=1,
            )
        )


profile: CpuProfile | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-profile", default=None, help="write the run's CPU profile here")


def pytest_configure(config: pytest.Config) -> None:
    global profile
    path = config.getoption("--cpu-profile")
    if path:
        lane = config.getoption("lane", None)  # tests/lanes.py: one profile per lane
        if lane:
            path = str(Path(path).with_suffix(f".lane{lane.partition('/')[0]}.json"))
        profile = CpuProfile(Path(path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if profile is not None:
        profile.enter(item.nodeid)
    yield
    if profile is not None:
        profile.leave(item.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    if profile is not None:
        profile.finish(terminalreporter)
