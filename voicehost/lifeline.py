"""Processes that end with the serving process that started them, whatever killed it.

vLLM runs its engine in processes of its own (EngineCore, and on the CPU a worker under it that
ends with EngineCore), and a clone job trains in another. A serving process that exits cleanly
shuts them down; one killed with SIGKILL cannot, and they would live on under init holding
gigabytes. So:

- a child whose code is ours (the training process) calls ``die_with_parent``: a daemon thread
  kills it once its parent is gone (it was reparented);
- for children whose code is not (vLLM's, started by multiprocessing's spawn), the serving
  process starts a reaper (``start_reaper``): a small process of its own that keeps a list of
  the server's descendants and, once the server is gone, kills every one of them, then exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_SECONDS = 0.5

_watching = False
_reaper: subprocess.Popen[bytes] | None = None


def die_with_parent(poll_seconds: float = POLL_SECONDS) -> None:
    """From now on, this process ends (SIGKILL) within ``poll_seconds`` of its parent's end."""
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="voicehost-lifeline", daemon=True).start()


def start_reaper() -> None:
    """Start this process's reaper, once (Linux: it reads ``/proc``; elsewhere nothing)."""
    global _reaper
    if _reaper is not None or not Path("/proc/self/stat").exists():
        return
    _reaper = subprocess.Popen(
        [sys.executable, "-m", "voicehost.lifeline", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the server's process group leaves it its job
    )


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process from ``/proc/<pid>/stat``; ``None`` if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":  # a zombie: already ended
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live process under ``root``: pid -> start time (which tells a reused pid)."""
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[1]
    found: dict[int, int] = {}
    pending = list(parents.get(root, []))
    while pending:
        pid = pending.pop()
        if pid not in found and pid in started:
            found[pid] = started[pid]
            pending.extend(parents.get(pid, []))
    return found


def reap(server: int, poll_seconds: float = POLL_SECONDS) -> None:
    """Follow ``server``'s descendants until it is gone, then SIGKILL those still running."""
    me = os.getpid()
    first = _stat(server)
    known: dict[int, int] = {}
    while (now := _stat(server)) is not None and first is not None and now[1] == first[1]:
        known = {pid: start for pid, start in descendants(server).items() if pid != me}
        time.sleep(poll_seconds)
    for pid, start in known.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start:  # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    reap(int(sys.argv[1]))
