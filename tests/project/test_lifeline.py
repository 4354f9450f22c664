"""Engine processes end with the serving process that started them, however it died (kill -9).

vLLM starts its engine processes with multiprocessing's spawn; the reaper
(``voicehost.lifeline.start_reaper``) kills them once their server is gone. The cluster tests
kill -9 a real worker alone and find its whole tree gone (test_cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from helpers import alive, wait_until

from voicehost.lifeline import descendants

pytestmark = pytest.mark.unit

PARENT = """
import multiprocessing, time
from voicehost import lifeline

def child():
    time.sleep(60)

if __name__ == "__main__":
    if {reaper}:
        lifeline.start_reaper()
    process = multiprocessing.get_context("spawn").Process(target=child, name="Engine")
    process.start()
    print(process.pid, flush=True)
    time.sleep(60)
"""


def spawn_and_kill_parent(tmp_path, reaper: bool) -> psutil.Process:
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(reaper=reaper))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    time.sleep(1.5)  # the reaper has seen the child
    parent.kill()
    parent.wait()
    return child


def test_a_spawned_child_of_a_killed_server_is_reaped(tmp_path):
    child = spawn_and_kill_parent(tmp_path, reaper=True)
    wait_until(lambda: not alive([child]), 15)


def test_without_the_reaper_such_a_child_outlives_its_killed_parent(tmp_path):
    """The control: what the reaper prevents."""
    child = spawn_and_kill_parent(tmp_path, reaper=False)
    try:
        time.sleep(2.0)
        assert alive([child])
    finally:
        child.kill()


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def test_descendants_are_found_through_every_generation():
    sleeper = "import time; time.sleep(30)"
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"
    child = subprocess.Popen([sys.executable, "-c", grandchild])
    try:

        def grandchildren() -> list[int]:  # other children of this process may come and go
            return [p for p in descendants(os.getpid()) if _parent(p) == child.pid]

        wait_until(grandchildren, 20)
        found = descendants(os.getpid())
        assert child.pid in found and set(grandchildren()) <= set(found)
    finally:
        for process in psutil.Process(child.pid).children(recursive=True):
            process.kill()
        child.kill()
        child.wait()
