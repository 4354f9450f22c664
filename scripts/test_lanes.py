"""Run the suite as its lanes side by side (``make test``): one pytest process per lane
(``tests/lanes.py`` says which modules each runs and why), their output interleaved line by
line, each line marked with its lane, then each lane's summary and the run's engine boots
summed over the lanes, held to the suite's budget.

    .venv/bin/python scripts/test_lanes.py [pytest arguments for every lane]

The exit status is the first failing lane's (a lane that selected no tests does not fail), or
1 when the lanes together booted more engine cores than the budget allows.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import ENGINE_BOOTS  # noqa: E402
from lanes import LANES, LANES_DIR  # noqa: E402

NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
BOOTED = re.compile(r"engine cores booted: (\d+) of \d+: (.*)")
# pytest's last line, with or without -q: "3 failed, 290 passed, ... in 288.97s (0:04:48)"
SUMMARY = re.compile(r"^=* ?(\d+ \w+.*|no tests ran.*) in [\d.]+s.*?=*$")


def run_lanes(arguments: list[str]) -> int:
    started = time.monotonic()
    progress = tempfile.mkdtemp(prefix="voicehost-lanes-")  # how far each lane is (tests/lanes.py)
    processes = {
        lane: subprocess.Popen(
            [sys.executable, "-m", "pytest", f"--lane={lane}/{LANES}", *arguments],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", LANES_DIR: progress},
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches each lane once, through us
        )
        for lane in range(1, LANES + 1)
    }
    summaries: dict[int, str] = {}
    boots: dict[int, tuple[int, str]] = {}
    lock = threading.Lock()

    def relay(lane: int, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            if match := BOOTED.search(line):
                boots[lane] = (int(match.group(1)), match.group(2))
            if SUMMARY.match(line):
                summaries[lane] = line.strip("= ")
            with lock:
                print(f"[lane {lane}] {line}", flush=True)

    relays = [
        threading.Thread(target=relay, args=(lane, process), daemon=True)
        for lane, process in processes.items()
    ]
    for thread in relays:
        thread.start()
    try:
        codes = {lane: process.wait() for lane, process in processes.items()}
    except KeyboardInterrupt:
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
        codes = {lane: process.wait() for lane, process in processes.items()}
    for thread in relays:
        thread.join()
    shutil.rmtree(progress, ignore_errors=True)

    print(f"\nlanes side by side: {time.monotonic() - started:.0f} s wall")
    for lane in processes:
        print(f"  lane {lane}: {summaries.get(lane, 'no summary')} (exit {codes[lane]})")
    cores = sum(n for n, _ in boots.values())
    which = "; ".join(f"lane {lane}: {what}" for lane, (_, what) in sorted(boots.items()))
    print(f"engine cores booted in all: {cores} of {ENGINE_BOOTS} ({which or 'none'})")
    # 5: pytest selected nothing in that lane (-k, -m), fine while another lane ran tests
    failed = [code for code in codes.values() if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    if all(code == NO_TESTS for code in codes.values()):
        return NO_TESTS
    if cores > ENGINE_BOOTS:
        print(f"FAILED: the lanes booted {cores} engine cores, over the budget of {ENGINE_BOOTS}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_lanes(sys.argv[1:]))
