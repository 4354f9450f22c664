"""The host's launcher: one engine core and its front ends (``voicehost.host``), started,
watched and stopped by one parent process."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voicehost import lifeline
from voicehost.config import Settings
from voicehost.host.board import HostBoard
from voicehost.host.frontend import (
    BOARD_FILE,
    CORE_LOST_SIGNAL,
    LORA_IDS_FILE,
    METRICS_DIR,
    CoreClient,
    FrontEnd,
)
from voicehost.host.lora_ids import HostLoraIds
from voicehost.metrics import MULTIPROCESS
from voicehost.model.engine import engine_args, engine_config

log = logging.getLogger(__name__)


def listening_socket(host: str, port: int) -> socket.socket:
    """The host's one HTTP socket, bound (each front end listens and accepts on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


# What a front end's process runs: it serves as ``FrontEnd`` on the host's HTTP socket until it is
# stopped. A module's function: the front ends are spawned, so it travels pickled, by its name.
FrontEndMain = Callable[[Settings, FrontEnd, socket.socket], None]


def run_frontend(
    settings: Settings, frontend: FrontEnd, sock: socket.socket, main: FrontEndMain
) -> None:
    """A front end's process: ``main`` on ``sock``, its engine client ``frontend.client``."""
    lifeline.die_with_parent()
    index = frontend.client.index
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s frontend-{index} %(name)s %(message)s"
    )
    main(settings, frontend, sock)


def serve_frontends(settings: Settings, main: FrontEndMain, address: str) -> None:
    """Start the engine core and ``settings.frontend_count()`` front ends, each running
    ``main`` on the HTTP port bound once at ``address``; return once they have all exited
    (after SIGTERM/SIGINT, passed on to each) or one of them has died."""
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor

    from voicehost.model.devmodel import ensure_dev_model

    count = settings.frontend_count()
    capacity = settings.stream_capacity()
    if settings.dev:
        ensure_dev_model(settings.dev_dir)
    lifeline.start_reaper()  # the engine core and the front ends end with this process
    config = engine_config(engine_args(settings, count, -1))
    listeners = bind_engine_zmq_listeners(config, count)
    sock = listening_socket(address, settings.port)
    ready_dir = Path(tempfile.mkdtemp(prefix="voicehost-frontends-"))
    HostBoard.create(ready_dir / BOARD_FILE, count, capacity)
    lora_ids = ready_dir / LORA_IDS_FILE  # the engine core knows an adapter by its id alone
    HostLoraIds.create(lora_ids)
    metrics_dir = ready_dir / METRICS_DIR  # each front end's values, summed by any of them
    metrics_dir.mkdir()
    os.environ[MULTIPROCESS] = str(metrics_dir)
    context = multiprocessing.get_context("spawn")
    frontends: list[Any] = []
    engines = None  # vLLM's manager of the engine core, once it has started
    failed = False  # stopped for a front end or the engine core dying, not for a signal
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in frontends:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("starting one engine core and %d front ends on port %d", count, settings.port)
    try:
        with launch_core_engines(
            config, Executor.get_class(config), False, listeners.addresses
        ) as launch:
            for index in range(count):
                addresses = {
                    "input_address": listeners.inputs[index].address,
                    "output_address": listeners.outputs[index].address,
                    "input_listener": listeners.inputs[index].socket,
                    "output_listener": listeners.outputs[index].socket,
                }
                frontend = FrontEnd(CoreClient(addresses, index, count, lora_ids), ready_dir)
                process = context.Process(
                    target=run_frontend,
                    args=(settings, frontend, sock, main),
                    name=f"voicehost-frontend-{index}",
                )
                process.start()
                frontends.append(process)
                listeners.inputs[index].close()
                listeners.outputs[index].close()
            launch.watched_frontend_processes = frontends
        engines = launch.engine_manager  # held: dropping it shuts the engine core down
        sock.close()  # the front ends hold it
        cores = list(getattr(engines, "processes", []))
        failed = _wait(frontends, cores, lambda: stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for process in frontends:
            if process.is_alive():
                process.terminate()
            process.join(5)
        if engines is not None:  # a failed host's streams are cut already: a short grace
            engines.shutdown(timeout=FAILED_CORE_GRACE_S if failed else None)
        listeners.cleanup()
        shutil.rmtree(ready_dir, ignore_errors=True)
        del listeners  # its __del__ would run again at exit, with vLLM's modules torn down
        gc.collect()
    if failed:  # for the supervisor: this host did not stop because it was asked to
        raise SystemExit(1)


def _wait(frontends: list[Any], cores: list[Any], stopping: Any) -> bool:
    """Until every front end has exited. A front end that dies (it exits while the others
    serve, or with a failure's exit code whenever: a SIGKILL, a crash) ends the host at once:
    the others are killed too, so that every stream of the host is cut as the host's own death
    would cut it (a gateway says ``upstream_cut``; a ring drops the host, and no drain behind
    it would serve anyone), and the host exits 1 for its supervisor to restart it, even when a
    stop signal came meanwhile. The engine core dying stops them all too: a front end's engine
    client does not watch a core it did not start, and its streams would wait for tokens that
    never come. Then the front ends get ``CORE_LOST_SIGNAL`` (each fails its engine requests,
    so every stream ends as a failure after its first byte does: an SSE or socket error event,
    raw audio cut), then SIGTERM and, after ``CORE_LOST_GRACE_S``, SIGKILL. A core lost while
    the host drains after SIGTERM ends the drained streams the same way, not at the drain
    timeout; it is a failure unless the core ended on the stop's own signal (exit code 0).
    Returns whether it stopped for a failure (not for SIGTERM or SIGINT)."""
    from multiprocessing.connection import wait

    alive = list(frontends)
    core_lost_at: float | None = None
    failed = False
    killed = False  # the host SIGKILLed its front ends: their exit codes say nothing then
    while alive:
        watched = [p.sentinel for p in alive] + [c.sentinel for c in cores]
        wait(watched, timeout=None if core_lost_at is None else 0.5)
        up = {p: p.is_alive() for p in alive}  # once: one that dies between two looks is lost
        ended = [p for p in alive if not up[p]]
        alive = [p for p in alive if up[p]]
        lost = [c for c in cores if not c.is_alive()]
        died = [p for p in ended if p.exitcode != 0 and not killed]
        if died or (ended and alive and not stopping()):
            gone = (died or ended)[0]
            log.error("front end %s exited (code %s): ending the host", gone.name, gone.exitcode)
            failed, killed = True, True
            _signal(alive, signal.SIGKILL)
        elif core_lost_at is None and lost:
            # draining or not, streams in flight would wait for tokens that never come. A core
            # that ended on the stop's own signal (Ctrl-C or a supervisor's SIGTERM reach the
            # whole group: vLLM's core exits 0 on either) is the stop, not a failure.
            if stopping() and all(c.exitcode == 0 for c in lost):
                log.warning("the engine core stopped with the host: its streams end now")
            else:
                log.error("the engine core exited (code %s): stopping the host", lost[0].exitcode)
                failed = True
            core_lost_at = time.monotonic()
            cores = []
            _signal(alive, CORE_LOST_SIGNAL)  # their streams end with an error at once
            _signal(alive, signal.SIGTERM)
        elif core_lost_at is not None and time.monotonic() - core_lost_at > CORE_LOST_GRACE_S:
            killed = True
            _signal(alive, signal.SIGKILL)
    return failed


CORE_LOST_GRACE_S = 5.0  # for front ends whose engine core is gone to end their streams
FAILED_CORE_GRACE_S = 1.0  # a failed host's core, to exit on SIGTERM before its SIGKILL (vLLM: 5)


def _signal(processes: list[Any], signum: int) -> None:
    for process in processes:
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signum)
