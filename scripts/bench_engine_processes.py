"""What a dev engine costs with its CPU worker in the engine core's process (``in_core_worker``)
against vLLM's own layout (the worker in a process of its own), in one run.

For each layout: ``voicehost serve --dev`` from launch to ``/readyz`` 200 (wall seconds, and the
CPU seconds of the whole process tree), the tree's resident memory once ready, then the wall and
CPU seconds of ``--requests`` speech requests one after another (the same text and seed each
time). vLLM's layout is asked for as an operator would: a core binding
(``VLLM_CPU_OMP_THREADS_BIND``, here the first core) keeps the worker in its own process. Both
layouts run with ``OMP_NUM_THREADS=1``, as the tests do; the order alternates over ``--rounds``.

    python scripts/bench_engine_processes.py --rounds 1 --requests 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voicehost.tools import devserver

TEXT = "Hello there, this is a test of the speech."
LAYOUTS = {"in-core": {}, "vllm": {"VLLM_CPU_OMP_THREADS_BIND": "0"}}


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(layout: str, requests: int) -> dict[str, float | int | str]:
    env = LAYOUTS[layout]
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with tempfile.TemporaryDirectory() as root:
            started = time.monotonic()
            with devserver.dev_server(Path(root)) as server:
                boot = time.monotonic() - started
                processes = tree(server.process.pid)
                boot_cpu = cpu_seconds(processes)
                rss = sum(p.memory_info().rss for p in processes) / 2**30
                body = {"input": TEXT, "voice": "dev-a", "response_format": "pcm", "seed": 3}
                request = urllib.request.Request(
                    server.url + "/v1/audio/speech",
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
                spoken = time.monotonic()
                for _ in range(requests):
                    with urllib.request.urlopen(request) as response:
                        response.read()
                speech = time.monotonic() - spoken
                speech_cpu = cpu_seconds(processes) - boot_cpu
                names = sorted(p.name() for p in processes)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {
        "layout": layout,
        "processes": len(names),
        "boot_s": round(boot, 1),
        "boot_cpu_s": round(boot_cpu, 1),
        "rss_gib": round(rss, 2),
        "speech_s": round(speech, 1),
        "speech_cpu_s": round(speech_cpu, 1),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    order = list(LAYOUTS)
    for round_ in range(args.rounds):
        for layout in order if round_ % 2 == 0 else order[::-1]:
            print(json.dumps(measure(layout, args.requests)), flush=True)


if __name__ == "__main__":
    main()
