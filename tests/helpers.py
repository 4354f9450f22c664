"""What the tests share besides fixtures: dev processes started the tests' way, a Redis server
of a test's own, the upload forms, waiting for a condition, and reading a server's answers.

Fixtures live in ``conftest.py``; test modules import these from here, never from each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np
import psutil
import pytest
import redis
import yaml

from lora_training.recipe import VoiceJob
from voicehost.cluster.state import WorkerPresence, connect
from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths
from voicehost.speech.admission import WorkerLoad
from voicehost.tools import devserver
from voicehost.tools.devserver import (
    DevServer,
    free_port,
    http_status,
    stop,
    voicehost_command,
)

__all__ = [
    "CHROMIUM",
    "DEV_DIR",
    "EARLY_SERVERS",
    "EarlyServer",
    "PageWatch",
    "RedisServer",
    "Server",
    "adapter_form",
    "adapter_parts",
    "alive",
    "audio_form",
    "dev_env",
    "dev_server",
    "early_server",
    "engines_stopped",
    "eventually",
    "free_port",
    "gateway_before",
    "http_status",
    "is_frontend",
    "job_spec",
    "key_entries",
    "launch",
    "manage_versions_as_a_tenant",
    "metric",
    "monitoring_exprs",
    "named_metrics",
    "no_directory",
    "open_playground",
    "process_tree",
    "random_frames",
    "read_socket",
    "runtime_settings",
    "same_audio",
    "say_over_socket",
    "start_early",
    "stop",
    "stop_in_background",
    "tiny_ctc_model",
    "voicehost_command",
    "wait_ready",
    "wait_until",
]

Server = DevServer
DEV_DIR = Settings().dev_dir

# Every dev process of the tests: the shared dev model; codec noise off, so audio depends only
# on tokens; nucleus sampling and the repetition penalty off unless a test sets them (vLLM's CPU
# sampler sorts the 157k-token vocabulary for top-p at every step of every request, which made
# the dev engine 2.4x slower, and counts every token of it for the penalty, a quarter of a
# step; serving's defaults are checked in test_engine, the penalty is on in the hot tests
# (conftest's HOT_SETTINGS), and both are measured by the benchmarks).
TEST_ENV = {
    "VOICEHOST_DEV_DIR": str(DEV_DIR),
    "VOICEHOST_CODEC_NOISE": "false",
    "VOICEHOST_TOP_P": "1.0",
    "VOICEHOST_REPETITION_PENALTY": "1.0",
    # this machine's own addresses (192.0.2.2, fd00::2), a client's WebRTC candidates, are private
    "VOICEHOST_WEBRTC_PRIVATE_CANDIDATES": "true",
}


# --- dev processes ---------------------------------------------------------------------------

# The unit test running now (conftest sets it): it may start no server process.
unit_test: str | None = None


def refuse_in_a_unit_test(what: str) -> None:
    """Fail the running test if it is marked ``unit``: the marker must not lie."""
    if unit_test is not None:
        pytest.fail(f"{unit_test} is marked unit but starts {what}", pytrace=False)


def launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``devserver.launch``: a process in its own process group, logging to ``log``."""
    refuse_in_a_unit_test(" ".join(command[:4]))
    return devserver.launch(command, env, log)


def dev_env(**extra: str) -> dict[str, str]:
    """The environment of a test's dev-model process, with ``extra`` settings added."""
    return devserver.dev_env(**{**TEST_ENV, **extra})


# How long a server the suite starts may take to be ready. A start that fails is seen at once
# (its process exits, or /healthz says so); this only ends one that hangs. On a fresh machine
# the first run's three boots beside the unit tests read vLLM and torch from a cold disk: the
# keyed host was ready after 301 s once (its first `import vllm` 55 s, its engine 2 min more),
# and 27 of its tests failed at the old 300 s.
READY_TIMEOUT = 600.0


def wait_ready(
    process: subprocess.Popen, url: str, log: Path, timeout: float = READY_TIMEOUT
) -> list[int]:
    """``devserver.wait_ready``, failing the test with the process's log tail."""
    try:
        return devserver.wait_ready(process, url, log, timeout)
    except devserver.StartFailed as error:
        pytest.fail(str(error), pytrace=False)


@contextlib.contextmanager
def dev_server(root: Path, **env: str) -> Iterator[Server]:
    """``devserver.dev_server`` with the tests' environment; a start that fails fails the test
    with the server's log tail."""
    refuse_in_a_unit_test("a dev server")
    try:
        with devserver.dev_server(root, READY_TIMEOUT, **{**TEST_ENV, **env}) as server:
            yield server
    except devserver.StartFailed as error:
        pytest.fail(str(error), pytrace=False)


class EarlyServer:
    """A dev server started when the run is known to need it, before its first test: it boots
    (half a minute or more) while the tests before that one run, watched from the start by a
    thread that records its readiness."""

    def __init__(self, root: Path, **env: str) -> None:
        self.server = devserver.start_dev_server(root, **{**TEST_ENV, **env})
        self.engines = 1
        self.failure: devserver.StartFailed | None = None
        self.watch = threading.Thread(target=self._wait, daemon=True)
        self.watch.start()

    def _wait(self) -> None:
        s = self.server
        try:
            s.readiness.extend(devserver.wait_ready(s.process, s.url, s.log, READY_TIMEOUT))
        except devserver.StartFailed as error:
            self.failure = error

    def running(self) -> bool:
        return self.server.process.poll() is None

    def ready(self) -> Server:
        """The server once it is ready; fails the test with its log tail if it never is."""
        self.watch.join()
        if self.failure is not None:
            pytest.fail(str(self.failure), pytrace=False)
        return self.server

    def stop(self) -> None:
        if self.running() and self.failure is None and self.server.readiness:
            undocumented.extend(undocumented_errors(self.server.url))
        stop_in_background(self.server.process)
        engines_stopped(self)


# Error answers a server gave that its OpenAPI operation does not list (the error table,
# voicehost.api.errors, counts them in voicehost_undocumented_errors_total): read from each dev
# server before it stops, and the run fails on any (conftest's pytest_sessionfinish).
undocumented: list[str] = []


def undocumented_errors(url: str) -> list[str]:
    """``operation code (n)`` for each undocumented error answer ``url``'s server counted
    (its metrics read with the keyed host's admin key, ``cluster_fleet.KEYED_KEYS``, where they
    are private)."""
    import urllib.error
    import urllib.request

    for headers in ({}, {"Authorization": "Bearer key-admin"}):
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url + "/metrics", headers=headers), timeout=10
            ) as response:
                text = response.read().decode()
            break
        except urllib.error.HTTPError as error:
            if error.code not in (401, 403):
                return [f"{url}/metrics answered {error.code}"]
        except OSError:
            return []  # stopped already (a test drained it): nothing to read
    else:
        return [f"{url}/metrics: not readable with the admin key"]
    found = []
    for line in text.splitlines():
        if line.startswith("voicehost_undocumented_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            if float(value) > 0:
                found.append(f"{labels.split('{', 1)[1].rstrip('}')} ({float(value):g})")
    return found


# Processes told to stop whose end nobody waits for: a server's shutdown takes seconds (vLLM's
# engine and workers), which the next module need not wait out. conftest waits for them all at
# the end of the run.
stopping: list[threading.Thread] = []


def stop_in_background(*processes: subprocess.Popen) -> None:
    """``stop`` each of ``processes`` (SIGTERM, then SIGKILL to its group) on a thread."""
    for process in processes:
        thread = threading.Thread(target=stop, args=(process,), daemon=True)
        thread.start()
        stopping.append(thread)


class Early(Protocol):
    """Something started before its first test: ``ready`` waits for it, ``stop`` ends it (and
    calls ``engines_stopped``), ``running`` says whether its engine cores still run (a test may
    kill them); ``engines``: the engine cores it boots."""

    engines: int

    def ready(self) -> object: ...

    def running(self) -> bool: ...

    def stop(self) -> None: ...


# The suite's engine budget (tests/project/test_engine_budget.py keeps it): each engine core
# boot costs 40-50 CPU-seconds on this 2-core machine and holds 3.7 GiB (a host of two front
# ends 5.6), so a run boots at most ENGINE_BOOTS, at most MAX_ENGINES at once; a start that
# does not fit waits (deferred) or fails, naming what runs.
MAX_ENGINES = 3
ENGINE_BOOTS = 4
# the engine cores this process may run at once: MAX_ENGINES, or its lane's share when the
# suite runs as lanes side by side (tests/lanes.py; conftest sets it)
engine_cap = MAX_ENGINES
_running: dict[int, Early] = {}  # by id(): each Early whose engines are up
booted: list[tuple[str, int]] = []  # (fixture, engine cores) of every start of this run


def engines_running() -> int:
    """Engine cores running now: those started and not stopped, less any a test has killed."""
    return sum(e.engines for e in _running.values() if e.running())


def record_start(fixture: str, started: Early) -> None:
    """Count ``started``'s engine cores as running and booted; fail past the budget."""
    now = engines_running() + started.engines
    _running[id(started)] = started
    booted.append((fixture, started.engines))
    if now > engine_cap:
        running = [name for name, e in taken.items() if e.running()]
        running += [name for name, e in early_servers.items() if e.running()]
        pytest.fail(
            f"{fixture} started {started.engines} engine cores beside {running}: {now} at once, "
            f"over this process's budget of {engine_cap}",
            pytrace=False,
        )


def engines_stopped(early: Early) -> None:
    _running.pop(id(early), None)


@dataclass(frozen=True)
class EarlyStart:
    start: Callable[[pytest.TempPathFactory], Early]
    engines: int
    # started at collection (False), or only once the unit tests are done (True): a boot that
    # would only add to the boots the unit tests already run beside
    deferred: bool
    # deferred until the first test of this module (its ``__name__``), if given
    with_module: str | None = None


# Dev servers to start early, by the name of the fixture that serves them: each module
# registers its own at import (collection), and conftest starts those the selected tests need.
EARLY_SERVERS: dict[str, EarlyStart] = {}
early_servers: dict[str, Early] = {}  # started, not yet taken by their fixture


def start_early(fixture: str, *, engines: int = 1, with_module: str | None = None) -> Callable:
    """Register a function ``(tmp_path_factory) -> Early`` as what ``fixture`` serves: started
    at collection, or with the first test of ``with_module`` if given."""

    def register(start: Callable[[pytest.TempPathFactory], Early]) -> Callable:
        deferred = with_module is not None
        EARLY_SERVERS[fixture] = EarlyStart(start, engines, deferred, with_module)
        return start

    return register


started_early: set[str] = set()
modules_reached: set[str] = set()  # modules a test of which has run


def start_early_servers(
    fixtures: Sequence[str],
    tmp_path_factory: pytest.TempPathFactory,
    *,
    deferred: bool,
    module: str | None = None,
) -> None:
    """Start what ``fixtures`` serve that is registered with ``deferred`` and not yet started,
    each only while its engines fit beside those running (``MAX_ENGINES``); one deferred to a
    module only once a test of that module has run (``module``: the running test's)."""
    if module is not None:
        modules_reached.add(module)
    for fixture in fixtures:
        early = EARLY_SERVERS.get(fixture)
        if early is None or early.deferred != deferred or fixture in started_early:
            continue
        if early.with_module is not None and early.with_module not in modules_reached:
            continue
        if engines_running() + early.engines > engine_cap:
            continue  # started once the engines before it have stopped, or by its fixture
        started = early.start(tmp_path_factory)
        started_early.add(fixture)
        early_servers[fixture] = started
        record_start(fixture, started)


@contextlib.contextmanager
def early_server(fixture: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The server registered for ``fixture``, started early (or now, if it was not), ready
    when the block starts and stopped when it ends."""
    refuse_in_a_unit_test("a dev server")
    early = early_servers.pop(fixture, None)
    if early is None:  # not started early: now
        early = EARLY_SERVERS[fixture].start(tmp_path_factory)
        started_early.add(fixture)
        try:
            record_start(fixture, early)
        except BaseException:  # over the budget: failed, and not left running (it leaked once)
            early.stop()
            raise
    taken[fixture] = early
    try:
        yield early.ready()
    finally:
        if taken.pop(fixture, None) is not None:  # not retired before
            early.stop()


taken: dict[str, Early] = {}  # taken by their fixture, not yet stopped


def retire(fixture: str) -> None:
    """Stop what ``fixture`` serves now, if it runs (no test left in the run needs it)."""
    early = taken.pop(fixture, None)
    if early is not None:
        early.stop()


def started(fixture: str) -> Early | None:
    """What ``fixture`` serves, if it has been started and not stopped."""
    return early_servers.get(fixture) or taken.get(fixture)


# --- keys ------------------------------------------------------------------------------------


def key_entries(keys: dict[str, tuple[str, str, list[str]]]) -> list[dict[str, object]]:
    """``VOICEHOST_API_KEYS`` entries of ``keys`` (key -> (id, tenant, scopes))."""
    from voicehost.tenancy.keys import hash_key

    return [
        {"id": i, "tenant": t, "scopes": s, "sha256": hash_key(k)} for k, (i, t, s) in keys.items()
    ]


# --- Redis -----------------------------------------------------------------------------------


@dataclass
class RedisServer:
    """A ``redis-server`` of a test's own on ``port``, its data (append-only file) in ``folder``."""

    port: int
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def start(self) -> None:
        refuse_in_a_unit_test("a Redis server")
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self.folder), "--appendonly", "yes", "--save", ""]
        command += ["--appendfsync", "everysec"]  # "always" stalls every write on a busy disk
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)  # redis flushes the AOF and exits
        self.process.wait(timeout=10)


@contextlib.asynccontextmanager
async def gateway_before(
    server_url: str, worker_id: str, capacity: int, root: Path, **env: str
) -> AsyncIterator[str]:
    """``voicehost gateway`` (its URL) with a Redis of its own and one running server joined as
    its worker ``worker_id`` (one real heartbeat, long-lived: the server itself is no cluster
    worker), ``env`` its settings besides. No engine of its own: a gateway only routes."""
    redis_server = RedisServer(free_port(), root)
    redis_server.start()
    port = free_port()
    settings = dev_env(
        VOICEHOST_REDIS_URL=redis_server.url,
        VOICEHOST_SHARED_DIR=str(root / "shared"),
        VOICEHOST_MEMBERSHIP_POLL_SECONDS="0.5",
        **env,
    )
    log = root / "gateway.log"
    process = launch([*voicehost_command("gateway", "--dev"), "--port", str(port)], settings, log)
    registry = Settings(redis_url=redis_server.url, worker_ttl_seconds=3600)
    redis = connect(registry)
    load = WorkerLoad(0, 0, capacity, capacity)
    presence = WorkerPresence(redis, registry, worker_id, server_url, lambda: load)
    try:
        await presence.heartbeat()
        await asyncio.to_thread(wait_ready, process, f"http://127.0.0.1:{port}", log)
        yield f"http://127.0.0.1:{port}"
    finally:
        await redis.aclose()
        stop(process)
        redis_server.stop()


# --- waiting ---------------------------------------------------------------------------------


def wait_until(condition: Callable[[], object], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")


async def eventually(condition: Callable[[], object], within: float, step: float = 0.05) -> float:
    """``wait_until`` without blocking the event loop (streams keep running meanwhile)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if await asyncio.to_thread(condition):
            return time.monotonic() - started
        await asyncio.sleep(step)
    raise AssertionError(f"not within {within} s")


# --- requests and answers --------------------------------------------------------------------


def same_audio(a: bytes | np.ndarray, b: bytes | np.ndarray) -> bool:
    """Equal up to the float rounding of different decode windows (noise is off): 16-bit PCM
    as bytes or as samples."""
    x, y = (
        (np.frombuffer(v, dtype="<i2") if isinstance(v, bytes) else v).astype(np.int32)
        for v in (a, b)
    )
    return x.size == y.size and (x.size == 0 or np.abs(x - y).max() <= 64)


def audio_form(paths: Sequence[Path], metadata: Path | None = None, **fields: str):
    """A ``POST /v1/voices`` clone upload: the audio files, transcripts and other fields."""
    form = aiohttp.FormData()
    for key, value in fields.items():
        form.add_field(key, value)
    for path in paths:
        form.add_field("audio", path.read_bytes(), filename=path.name)
    if metadata is not None:
        form.add_field("transcripts", metadata.read_bytes(), filename="metadata.csv")
    return form


def adapter_form(
    dev_model: DevModelPaths, voice_id: str, config: dict | None = None, source: str = "dev-b"
):
    """A ``POST /v1/voices`` adapter upload of a dev voice's weights (``source``'s) as
    ``voice_id``, with its adapter config or ``config``."""
    folder = dev_model.adapters / source
    form = aiohttp.FormData()
    form.add_field("voice_id", voice_id)
    form.add_field("name", "Uploaded")
    cfg = config or json.loads((folder / "adapter_config.json").read_text())
    form.add_field("adapter_config", json.dumps(cfg).encode(), filename="adapter_config.json")
    weights = (folder / "adapter_model.safetensors").read_bytes()
    form.add_field("adapter_model", weights, filename="adapter_model.safetensors")
    return form


async def manage_versions_as_a_tenant(
    http: aiohttp.ClientSession,
    url: str,
    dev_model: DevModelPaths,
    voice: str,
    own: dict[str, str],
    other: dict[str, str],
) -> None:
    """A tenant's key with the ``voices`` scope (``own``'s headers) adds, lists, promotes and
    deletes its own voice's versions; another tenant's key (``other``) gets 404 for each."""
    form = adapter_form(dev_model, voice, source="dev-a")
    async with http.post(url + "/v1/voices", data=form, headers=own) as r:
        assert r.status == 201, await r.text()
    versions = f"{url}/v1/voices/{voice}/versions"
    async with http.post(versions, data=adapter_parts(dev_model, "dev-c"), headers=own) as r:
        assert r.status == 201, await r.text()
        assert (await r.json())["version"]["version"] == 2
    for method, target in [
        ("POST", versions),
        ("GET", versions),
        ("POST", versions + "/1/promote"),
        ("DELETE", versions + "/2"),
    ]:
        form = (
            adapter_parts(dev_model, "dev-b") if method == "POST" and target == versions else None
        )
        async with http.request(method, target, data=form, headers=other) as r:
            assert r.status == 404, (method, target, r.status, await r.text())
            assert (await r.json())["error"]["code"] == "voice_not_found"
    async with http.get(versions, headers=own) as r:
        assert r.status == 200, await r.text()
        listed = await r.json()
    assert listed["live"] == 2 and [v["version"] for v in listed["versions"]] == [1, 2]
    async with http.post(versions + "/1/promote", headers=own) as r:
        assert r.status == 200, await r.text()
    async with http.delete(versions + "/2", headers=own) as r:
        assert r.status == 204, await r.text()
    async with http.get(versions, headers=own) as r:
        assert [v["version"] for v in (await r.json())["versions"]] == [1]
    async with http.delete(f"{url}/v1/voices/{voice}", headers=own) as r:
        assert r.status == 204, await r.text()


def adapter_parts(dev_model, source: str, **fields: str) -> aiohttp.FormData:
    """An adapter upload of the dev adapter ``source``'s files."""
    folder = dev_model.adapters / source
    form = aiohttp.FormData()
    for key, value in fields.items():
        form.add_field(key, value)
    config = (folder / "adapter_config.json").read_bytes()
    form.add_field("adapter_config", config, filename="adapter_config.json")
    weights = (folder / "adapter_model.safetensors").read_bytes()
    form.add_field("adapter_model", weights, filename="adapter_model.safetensors")
    return form


async def no_directory(voice_id: str, folder: Path) -> None:
    """A clone runner's ``on_voice_ready`` that adds nothing to a voice directory (the job
    alone is tested)."""
    return None


def job_spec(jobs_dir: Path, job_id: str, dev_model: DevModelPaths) -> VoiceJob:
    """The dev model's clone of the audio in ``job_id``'s inputs folder, as a job runs it."""
    return VoiceJob(
        audio=[jobs_dir / job_id / "inputs"],
        voice_id=f"v-{job_id[-6:]}",
        base_model=str(dev_model.model),
        base_model_name="voicehost-dev",
        codec=str(dev_model.codec),
        adapters_dir=jobs_dir / job_id / "out",
        work_dir=jobs_dir / job_id / "work",
    )


async def say_over_socket(
    ws: aiohttp.ClientWebSocketResponse, voice: str, text: str
) -> tuple[list[str], int]:
    """Speak ``text`` on an open realtime socket (config, text, end) and read it to its close:
    the types of the events received, in order, and the bytes of audio."""
    await ws.send_json({"type": "config", "voice": voice, "response_format": "pcm"})
    await ws.send_json({"type": "text", "text": text})
    await ws.send_json({"type": "end"})
    return await read_socket(ws)


async def read_socket(ws: aiohttp.ClientWebSocketResponse) -> tuple[list[str], int]:
    """Read an open realtime socket to its close: the types of the events received, in
    order, and the bytes of audio."""
    events, audio = [], 0
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            audio += len(message.data)
        else:
            events.append(json.loads(message.data)["type"])
    return events, audio


@contextlib.asynccontextmanager
async def runtime_settings(
    server: Any, *, headers: dict[str, str] | None = None, frontends: int = 1, **values: object
) -> AsyncIterator[dict[str, object]]:
    """``values`` set on the dev server ``server`` at run time (``PATCH /internal/dev/settings``)
    while the block runs, then set back: what a test would otherwise boot a server of its own
    for. On a host of ``frontends`` front ends each is changed (a connection of its own each
    time, until every front end has answered); ``headers``: the internal token where the server
    has one. Yields every runtime setting's value."""
    from voicehost.api.edge import FRONTEND_HEADER

    url = server.url + "/internal/dev/settings"

    async def patch(body: dict[str, object]) -> dict[str, object]:
        answers: dict[str, dict[str, object]] = {}
        for attempt in range(64):
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
                async with http.patch(url, json=body) as response:
                    assert response.status == 200, await response.text()
                    answers[response.headers.get(FRONTEND_HEADER, "0")] = await response.json()
            if len(answers) >= frontends:
                return next(iter(answers.values()))
            await asyncio.sleep(0.05 if attempt < 8 else 0.3)  # a busy front end accepts late
        raise AssertionError(f"{len(answers)} of {frontends} front ends answered")

    before = await patch({})
    now = await patch(values)
    try:
        yield now
    finally:
        await patch({name: before[name] for name in values})


async def metric(http: aiohttp.ClientSession, server: Server, name: str) -> float:
    """A server metric from ``/metrics``: ``name`` alone sums its labelled series, ``name{...}``
    reads one series."""
    async with http.get(server.url + "/metrics") as response:
        text = await response.text()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    assert values, f"{name} not in /metrics"
    return sum(values)


def random_frames(count: int, seed: int) -> list[orpheus.Frame]:
    """``count`` frames of random codes, the first all 0 and the last all 4095 (both real
    codes)."""
    rng = random.Random(seed)
    frames = [
        orpheus.Frame.from_codes(
            [rng.randrange(4096)],
            [rng.randrange(4096) for _ in range(2)],
            [rng.randrange(4096) for _ in range(4)],
        )
        for _ in range(count)
    ]
    frames[0] = orpheus.Frame((0,), (0, 0), (0, 0, 0, 0))  # code 0 is a real code
    frames[-1] = orpheus.Frame((4095,), (4095, 4095), (4095, 4095, 4095, 4095))
    return frames


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and every process under it, now."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def is_frontend(process: psutil.Process) -> bool:
    """Whether ``process`` is one of a host's front ends (``voicehost.host``: a spawned
    child, named ``voicehost-frontend-N`` where the platform lets it be)."""
    try:
        return "voicehost-frontend" in process.name() or any(
            "voicehost.host" in part or "multiprocessing.spawn" in part
            for part in process.cmdline()
        )
    except psutil.NoSuchProcess:
        return False


def is_engine_core(process: psutil.Process) -> bool:
    """Whether ``process`` is vLLM's engine core: False once it has gone (a process of a tree
    may end after the tree was read, as a replaced encoding process does)."""
    try:
        return "EngineCore" in process.name()
    except psutil.NoSuchProcess:
        return False


def alive(processes: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running (a zombie, dead but not yet reaped, is not)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


# --- the playground in a browser -----------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


class PageWatch:
    """What a page told its console, threw, or failed to load (a request that failed, an
    answer of 400 or more), as it happens."""

    def __init__(self, page) -> None:
        self.console: list[str] = []
        self.errors: list[str] = []
        self.failed: list[str] = []
        self.responses: list[tuple[int, str]] = []  # every answer: (status, method URL)
        self.urls: list[str] = []  # every request's URL, the realtime socket's included
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("websocket", lambda ws: self.urls.append(ws.url))
        page.on(
            "response", lambda r: self.responses.append((r.status, f"{r.request.method} {r.url}"))
        )

    def _console(self, message) -> None:
        if message.type in ("error", "warning"):
            self.console.append(f"{message.type}: {message.text}")

    def bad_answers(self) -> list[tuple[int, str]]:
        return [(status, what) for status, what in self.responses if status >= 400]

    def problems(self) -> list[str]:
        """Everything that went wrong so far: console errors and warnings, exceptions, failed
        requests, answers of 400 or more."""
        answers = [f"{status} {what}" for status, what in self.bad_answers()]
        return [*self.console, *self.errors, *self.failed, *answers]

    def clear(self) -> None:
        for found in (self.console, self.errors, self.failed, self.responses, self.urls):
            found.clear()


@contextlib.asynccontextmanager
async def open_playground(chromium, url: str):
    """A fresh browser context (its own session storage) on the playground at ``url``, once
    the page has started: yields the page, its ``PageWatch`` and the page's response."""
    from playwright.async_api import expect

    context = await chromium.new_context(viewport={"width": 1100, "height": 900})
    try:
        page = await context.new_page()
        watch = PageWatch(page)
        response = await page.goto(url + "/")
        await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=30_000)
        yield page, watch, response
    finally:
        await context.close()


# --- a forced aligner's model ------------------------------------------------------------------

CTC_VOCAB = ["<pad>", "<unk>", "|", "'", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"]


def tiny_ctc_model(folder: Path) -> Path:
    """A wav2vec2 CTC model of random weights (hidden size 32, two layers) and its processor,
    saved in ``folder`` as transformers saves a real one: what ``VOICEHOST_ALIGNER_MODEL`` loads.
    It aligns nothing well; it exercises the interface, as the MMS aligners would."""
    import torch
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.json"
    vocab.write_text(json.dumps({token: index for index, token in enumerate(CTC_VOCAB)}))
    tokenizer = Wav2Vec2CTCTokenizer(
        str(vocab), unk_token="<unk>", pad_token="<pad>", word_delimiter_token="|"
    )
    features = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, return_attention_mask=False
    )
    Wav2Vec2Processor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(folder)
    config = Wav2Vec2Config(
        vocab_size=len(CTC_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    Wav2Vec2ForCTC(config).save_pretrained(folder)
    return folder


# --- deploy/monitoring --------------------------------------------------------------------------

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
MONITORING_RULES = ("alerts.yml", "recording.yml")
DASHBOARD = MONITORING / "grafana" / "voicehost.json"
# a metric's name in PromQL: not part of a recorded name (level:metric:operations) nor of a word
EXPORTED = re.compile(r"(?<![\w:$])(voicehost_[a-z0-9_]+|up(?=\{))(?![\w:])")


def monitoring_exprs() -> list[str]:
    """Every PromQL expression of deploy/monitoring: the rules' and the dashboard panels' (its
    ``$job`` and ``$instance`` variables as any value)."""
    exprs = [
        rule["expr"]
        for name in MONITORING_RULES
        for group in yaml.safe_load((MONITORING / name).read_text())["groups"]
        for rule in group["rules"]
    ]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    return [e.replace("$job", ".*").replace("$instance", ".*") for e in exprs]


def named_metrics(exprs: Sequence[str]) -> set[str]:
    """The exported metrics (series names as scraped) that ``exprs`` read."""
    return {name for expr in exprs for name in EXPORTED.findall(expr)}
