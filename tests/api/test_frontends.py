"""``voicehost serve --frontends 2`` on the dev engine: one vLLM engine core, two serving
processes accepting on one port, each an engine client of the core (``voicehost.api.host``).

Its own server: the shared one has one front end. The last test here drains it with SIGTERM;
the kill -9 test starts one more and kills it as soon as its processes stand (no warm-up)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import psutil
import pytest
from helpers import EarlyServer, alive, early_server, process_tree, start_early, wait_until

from voicehost.api.edge import FRONTEND_HEADER
from voicehost.tools import devserver

SPEECH = "/v1/audio/speech"


# Booted while test_auth runs (before this module), not at collection beside every other
# server: its three processes each load vLLM, and under the start's crowd that took over 300 s.
@start_early("frontends", engines=2, with_module="test_auth")
def start_frontends(tmp_path_factory) -> EarlyServer:
    return EarlyServer(tmp_path_factory.mktemp("frontends"), VOICEHOST_FRONTENDS="2")


@pytest.fixture(scope="module")
def frontends(dev_model, tmp_path_factory):
    with early_server("frontends", tmp_path_factory) as server:
        yield server


async def speak(url: str, text: str, seed: int) -> tuple[str, int]:
    """One speech request on a connection of its own: which front end answered, and the
    bytes of PCM it sent."""
    body = {"input": text, "voice": "dev-a", "response_format": "pcm", "seed": seed}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(url + SPEECH, json=body) as response:
            assert response.status == 200, await response.text()
            return response.headers[FRONTEND_HEADER], len(await response.read())


async def test_both_front_ends_speak_from_one_engine_core(frontends):
    tree = process_tree(frontends.process.pid)
    names = [p.name() for p in tree]
    assert sum("EngineCore" in n for n in names) == 1, names  # one core for the host
    served: dict[str, int] = {}
    for _ in range(5):  # the kernel picks the acceptor: both get some of 8 connections
        answers = await asyncio.gather(*(speak(frontends.url, "Hi there.", s) for s in range(8)))
        for frontend, size in answers:
            assert size > 0
            served[frontend] = served.get(frontend, 0) + 1
        if set(served) == {"0", "1"}:
            break
    assert set(served) == {"0", "1"}, served


async def readiness(url: str) -> tuple[str, int, str]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.get(url + "/readyz") as response:
            body = await response.json()
            message = body.get("error", {}).get("message", "")
            return response.headers[FRONTEND_HEADER], response.status, message


async def test_one_front_end_draining_makes_the_host_unready_then_sigterm_drains_them_all(
    frontends,
):
    """The last test of the module. Streams run on the host; one front end is drained
    (``/internal/drain``): ``/readyz`` is 503 from every front end, not only that one. Then
    SIGTERM to the host: each stream is spoken to its end, and every process exits."""
    tree = process_tree(frontends.process.pid)
    text = "Drain me. " * 8
    streams = [asyncio.ensure_future(speak(frontends.url, text, s)) for s in range(4)]
    await asyncio.sleep(1.0)  # the streams are admitted
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(frontends.url + "/internal/drain") as response:
            assert response.status == 200
            drained = response.headers[FRONTEND_HEADER]
    answers = [await readiness(frontends.url) for _ in range(12)]
    assert all(status == 503 for _, status, _ in answers), answers
    others = [message for frontend, _, message in answers if frontend != drained]
    assert others, answers  # the kernel spread 12 connections over both
    assert all(f"[{drained}]" in message for message in others), others
    os.kill(frontends.process.pid, signal.SIGTERM)
    spoken = await asyncio.gather(*streams)
    assert all(size > 0 for _, size in spoken)
    await asyncio.to_thread(frontends.process.wait, 60)
    gone = await asyncio.to_thread(wait_until, lambda: not alive(tree), 30)
    print(f"{len(tree)} processes of the host were gone {gone:.2f} s after the drain")


def test_kill_9_of_the_host_leaves_no_front_end_and_no_engine_core(dev_model, tmp_path):
    """SIGKILL to the host's pid: the front ends die with their parent and the reaper ends
    the engine core, as for one serving process."""
    server = devserver.start_dev_server(tmp_path, VOICEHOST_FRONTENDS="2")
    try:

        def standing() -> bool:
            names = [p.name() for p in process_tree(server.process.pid)]
            frontends = sum(1 for p in process_tree(server.process.pid) if _is_frontend(p))
            return any("EngineCore" in n for n in names) and frontends == 2

        wait_until(standing, 120, step=0.5)
        tree = process_tree(server.process.pid)
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        started = time.monotonic()
        wait_until(lambda: not alive(tree), 15)
        print(f"{len(tree)} processes gone {time.monotonic() - started:.2f} s after kill -9")
    finally:
        devserver.stop(server.process)


def _is_frontend(process: psutil.Process) -> bool:
    try:
        return "voicehost-frontend" in process.name() or any(
            "voicehost.api.host" in part or "multiprocessing.spawn" in part
            for part in process.cmdline()
        )
    except psutil.NoSuchProcess:
        return False
