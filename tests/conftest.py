"""Shared fixtures: the dev model (built once, cached), one real server over real HTTP shared by
every module that needs no settings of its own, and a Redis of a test's own. Helpers the tests
share are in helpers.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import helpers
import pytest
from helpers import CHROMIUM, DEV_DIR, RedisServer, Server, free_port

from voicehost.model.devmodel import DevModelPaths, ensure_dev_model

# A test that means a Redis of its own must never reach the machine's: no URL from the
# environment (Settings() has none by default, and connect() refuses to run without one).
os.environ.pop("VOICEHOST_REDIS_URL", None)
# One OpenMP thread per process, this one and the dev processes it starts (vLLM binds each dev
# engine to one core anyway): on two cores shared by half a dozen booting servers, a torch that
# parallelises each small op over two threads waits at every barrier for the thread the kernel
# has descheduled. A speaker-encoder test took 64 s so, and 3.6 s with one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The fixtures that start a server process (a dev server, workers, a gateway, a Redis): a test
# marked ``unit`` (make test-fast) that asks for one, even through another fixture, fails.
SERVER_FIXTURES = frozenset(
    {
        "server",
        "small_server",
        "hot_server",
        "keyed",
        "keyed_server",
        "frontends",
        "dying_host",
        "gateway",
        "cluster",
        "redis_server",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    helpers.unit_test = None
    if item.get_closest_marker("unit") is None:
        # the unit tests are done (they run first): what was deferred boots beside these
        factory = item.session.config._tmp_path_factory
        helpers.start_early_servers(needed, factory, deferred=True, module=item.module.__name__)
        return
    helpers.unit_test = item.nodeid  # and helpers refuse to start a server while it runs
    servers = sorted(SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if servers:
        pytest.fail(
            f"{item.nodeid} is marked unit but asks for {', '.join(servers)}: a unit test "
            "starts no engine and no server (drop the mark or the fixture)",
            pytrace=False,
        )


def pytest_runtest_teardown(item: pytest.Item) -> None:
    helpers.unit_test = None


# --- the shared server -------------------------------------------------------------------------

SERVER_ENV = {
    "VOICEHOST_CLONE_EPOCHS": "1",
    "VOICEHOST_WS_IDLE_TIMEOUT_SECONDS": "3",
    # the dev model says at most 48 frames whatever the text: few, long segments keep tests short
    "VOICEHOST_SEGMENT_MAX_CHARS": "900",
    "VOICEHOST_SEGMENT_PREFETCH": "8",
    # a clone is heard on 2 sentences against 1 built-in voice: the evaluation's every figure,
    # at a third of its cost
    "VOICEHOST_EVAL_SENTENCES": "2",
    "VOICEHOST_EVAL_BASELINES": "1",
    "VOICEHOST_MAX_UPLOAD_MB": "20",
    # a WebRTC peer that vanishes, or never connects, is found out in seconds (test_webrtc)
    "VOICEHOST_WEBRTC_CONSENT_SECONDS": "6",
    "VOICEHOST_WEBRTC_CONNECT_TIMEOUT_SECONDS": "5",
}


@helpers.start_early("server")
def start_shared_server(tmp_path_factory: pytest.TempPathFactory) -> helpers.EarlyServer:
    return helpers.EarlyServer(tmp_path_factory.mktemp("server"), **SERVER_ENV)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first, so the dev servers boot while they run: the modules with unit tests
    only, then the others with each module's unit tests before the rest. Tests marked
    ``paced`` come last, when no server is booting beside them. A module's tests stay together
    (its module fixtures start once) and otherwise in the order they were written."""

    def is_unit(item: pytest.Item) -> bool:
        return item.get_closest_marker("unit") is not None

    modules = {item.module: index for index, item in reversed(list(enumerate(items)))}
    servers_in = {item.module for item in items if not is_unit(item)}

    def order(item: pytest.Item) -> tuple[int, int, bool]:
        if item.get_closest_marker("paced") is not None:
            group = 2
        else:
            group = 1 if item.module in servers_in else 0
        return group, modules[item.module] if group else 0, not is_unit(item)

    items.sort(key=order)


needed: list[str] = []  # the early servers the selected tests ask for, by first use


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the dev servers the selected tests will ask for (the shared one and the modules'
    own), so that they boot side by side and while the tests before their first user run; those
    registered as deferred start with the first test that is not a unit test."""
    first_use: dict[str, int] = {}
    for index, item in enumerate(session.items):
        for name in getattr(item, "fixturenames", ()):
            first_use.setdefault(name, index)
    needed[:] = sorted(set(helpers.EARLY_SERVERS) & set(first_use), key=first_use.get)
    helpers.start_early_servers(needed, session.config._tmp_path_factory, deferred=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for early in helpers.early_servers.values():  # started, but no test got to its fixture
        early.stop()
    for thread in helpers.stopping:  # every process stopped in the background has ended
        thread.join()


# --- the hot server ------------------------------------------------------------------------------

# A dev server sampling at temperature 1.5 (test_frame_constraint), that admits a stream only
# while each keeps 1.2 x 45 audio tokens/s (test_admission): this CPU engine's dev streams make
# about 95 tokens/s alone, 78 two at once, 63 three at once. One segment at a time per stream,
# so that a stream is one engine request.
HOT_ENV = {
    "VOICEHOST_TEMPERATURE": "1.5",
    "VOICEHOST_TOP_P": "1.0",
    "VOICEHOST_REALTIME_TOKENS_PER_SECOND": "45",
    "VOICEHOST_REALTIME_MARGIN": "1.2",
    "VOICEHOST_SEGMENT_PREFETCH": "1",
    "VOICEHOST_SEGMENT_MAX_CHARS": "120",
}


# Booted beside the cluster, before the cluster's tests (its first users, test_frame_constraint
# and test_admission, come after them): not at collection, where it would hold an engine's
# memory for twenty minutes and keep the servers booted before it from starting early.
@helpers.start_early("hot_server", with_module="test_hostile_uploads")
def start_hot_server(tmp_path_factory: pytest.TempPathFactory) -> helpers.EarlyServer:
    return helpers.EarlyServer(tmp_path_factory.mktemp("hot"), **HOT_ENV)


@pytest.fixture(scope="session")
def hot_server(
    dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """``HOT_ENV``'s server. Its own: the temperature is a server setting, not a request option,
    and at the shared server's 0.6 the dev model almost never samples a wrong position, so only
    a hot engine shows that none gets through (unconstrained, this one drops about one frame in
    five: docs/BENCHMARKS.md); and admission from measured capacity would refuse the streams
    other tests open at once."""
    with helpers.early_server("hot_server", tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def dev_model() -> DevModelPaths:
    return ensure_dev_model(DEV_DIR)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of the test's own, on a free port."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def http(request: pytest.FixtureRequest) -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session per test, for every module: its requests time out after
    ``HTTP_TIMEOUT`` seconds (600, or the module's own ``HTTP_TIMEOUT``) and carry the
    module's ``HTTP_HEADERS`` (none: the cluster's send its admin key)."""
    seconds = getattr(request.module, "HTTP_TIMEOUT", 600)
    headers = getattr(request.module, "HTTP_HEADERS", None)
    timeout = aiohttp.ClientTimeout(total=seconds, sock_read=min(seconds, 120))
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        yield session


@pytest.fixture(scope="session")
def server(dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared ``voicehost serve --dev``: open (no keys), with its own adapters folder; every
    module that needs no settings of its own uses it."""
    with helpers.early_server("server", tmp_path_factory) as server:
        yield server


# --- a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What Chromium's fake microphone says, over and over: espeak-ng reading the playground's
    first prompts with its pauses squeezed out, so that every take is speech."""
    from voicehost.api.playground import clone_prompts
    from voicehost.tools.devcorpus import speak

    wav = tmp_path_factory.mktemp("microphone") / "prompts.wav"
    speak(" ".join(clone_prompts()[:3]), wav, 0.0, "wav", squeeze_pauses=True)
    return wav


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install chromium"
    return CHROMIUM


@pytest.fixture(scope="module")
async def chromium(chromium_executable: str, fake_microphone: Path):
    """The system's headless Chromium (Debian's ``chromium``; no browser download), driven by
    playwright, with a fake microphone that needs no permission prompt: one per module."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium_executable,
            args=[
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={fake_microphone}",
            ],
        )
        try:
            yield browser
        finally:
            await browser.close()
