"""Shared fixtures: the dev model (built once, cached), one real server over real HTTP shared by
every module that needs no settings of its own, and a Redis of a test's own. Helpers the tests
share are in helpers.py."""

from __future__ import annotations

import os

# One OpenMP thread per process, this one and the dev processes it starts (vLLM binds each dev
# engine to one core anyway): on two cores shared by half a dozen booting servers, a torch that
# parallelises each small op over two threads waits at every barrier for the thread the kernel
# has descheduled. A speaker-embedder test took 64-73 s so, and 3.6 s with one thread. Set
# before anything imports torch (helpers does): torch reads it once, when it is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import cluster_fleet
import helpers
import hypothesis
import pytest
from helpers import CHROMIUM, DEV_DIR, RedisServer, Server, free_port

from voicehost.config import ORPHEUS_VOICES
from voicehost.model.devmodel import DevModelPaths, ensure_dev_model

pytest_plugins = ["lanes"]  # --lane K/N: make test runs the suite as lanes side by side

# Property tests check what is computed, never how fast: hypothesis' 200 ms deadline per example
# failed a token-layer test on a loaded 2-core machine (292 ms once, 0.05 ms when retried).
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")

# A test that means a Redis of its own must never reach the machine's: no URL from the
# environment (Settings() has none by default, and connect() refuses to run without one).
os.environ.pop("VOICEHOST_REDIS_URL", None)


# The fixtures that start a server process (a dev server, workers, a gateway, a Redis): a test
# marked ``unit`` (make test-fast) that asks for one, even through another fixture, fails.
SERVER_FIXTURES = frozenset(
    {
        "server",
        "keyed_host",
        "fleet",
        "french_worker",
        "second_worker",
        "gateway",
        "cluster",
        "redis_server",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    helpers.unit_test = None
    if item.get_closest_marker("unit") is None:
        # a server no test left needs ends now (its engines free for the next, even when the
        # test that was to end it failed), then what was deferred boots beside these tests
        position = positions.get(item.nodeid, 0)
        for fixture, last in last_use.items():
            if last < position:
                helpers.retire(fixture)
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
    "VOICEHOST_MAX_UPLOAD_MB": "20",
    # a WebRTC peer that vanishes, or never connects, is found out in seconds (test_webrtc)
    "VOICEHOST_WEBRTC_CONSENT_SECONDS": "6",
    "VOICEHOST_WEBRTC_CONNECT_TIMEOUT_SECONDS": "5",
    # the dev model is one model in every language: this one speaks English and French, with
    # Orpheus' voices and one French voice, so the languages' tests join it (no French server)
    "VOICEHOST_LANGUAGES": "en,fr",
    "VOICEHOST_BUILTIN_VOICES": json.dumps([*ORPHEUS_VOICES, "pierre"]),
}


@helpers.start_early("server")
def start_shared_server(tmp_path_factory: pytest.TempPathFactory) -> helpers.EarlyServer:
    return helpers.EarlyServer(tmp_path_factory.mktemp("server"), **SERVER_ENV)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first, so the dev servers boot while they run: the modules with unit tests
    only, then the others with each module's unit tests before the rest. Tests marked
    ``paced`` come after them, when no server is booting beside them, and the one marked
    ``last`` (it ends the shared server) after every other. A module's tests stay together (its
    module fixtures start once) and otherwise in the order they were written."""

    def is_unit(item: pytest.Item) -> bool:
        return item.get_closest_marker("unit") is not None

    modules = {item.module: index for index, item in reversed(list(enumerate(items)))}
    servers_in = {item.module for item in items if not is_unit(item)}

    def order(item: pytest.Item) -> tuple[int, int, bool]:
        if item.get_closest_marker("last") is not None:
            group = 3
        elif item.get_closest_marker("paced") is not None:
            group = 2
        else:
            group = 1 if item.module in servers_in else 0
        return group, modules[item.module] if group else 0, not is_unit(item)

    items.sort(key=order)


needed: list[str] = []  # the early servers the selected tests ask for, by first use
last_use: dict[str, int] = {}  # each early server's last test (its index in the run)
positions: dict[str, int] = {}  # each test's index in the run


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the dev servers the selected tests will ask for (the shared one and the modules'
    own), so that they boot side by side and while the tests before their first user run; those
    registered as deferred start with the first test that is not a unit test."""
    if session.config.option.collectonly:
        return
    first_use: dict[str, int] = {}
    for index, item in enumerate(session.items):
        positions[item.nodeid] = index
        for name in getattr(item, "fixturenames", ()):
            first_use.setdefault(name, index)
            if name in helpers.EARLY_SERVERS:
                last_use[name] = index
    # by first use, and in the order registered where a test is the first of several (the
    # fleet before the workers that join it)
    registered = list(helpers.EARLY_SERVERS)
    needed[:] = sorted(
        set(helpers.EARLY_SERVERS) & set(first_use),
        key=lambda name: (first_use[name], registered.index(name)),
    )
    helpers.start_early_servers(needed, session.config._tmp_path_factory, deferred=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for early in helpers.early_servers.values():  # started, but no test got to its fixture
        early.stop()
    for thread in helpers.stopping:  # every process stopped in the background has ended
        thread.join()
    if helpers.undocumented:  # answers the OpenAPI document does not list (helpers.undocumented)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                "FAILED: error answers their OpenAPI operation does not list (add them to "
                "voicehost.api.errors): " + "; ".join(helpers.undocumented)
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not helpers.booted:
        return
    # the engine budget (tests/project/test_engine_budget.py): what this run booted
    cores = sum(engines for _, engines in helpers.booted)
    boots = ", ".join(f"{fixture} ({engines})" for fixture, engines in helpers.booted)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"engine cores booted: {cores} of {helpers.ENGINE_BOOTS}: {boots}")
    if cores > helpers.ENGINE_BOOTS:
        if reporter is not None:
            reporter.write_line(f"FAILED: over the engine budget of {helpers.ENGINE_BOOTS}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the cluster: w1 (the keyed host before the cluster's tests), fr, w2 ----------------------


@helpers.start_early("fleet")
def start_fleet(tmp_path_factory: pytest.TempPathFactory) -> cluster_fleet.EarlyFleet:
    return cluster_fleet.EarlyFleet(tmp_path_factory.mktemp("cluster"))


# Booted with test_auth's first test (its tests leave a core mostly idle); ended by
# test_frontends' first tests, before w2 boots.
@helpers.start_early("french_worker", with_module="test_auth")
def start_french_worker(tmp_path_factory: pytest.TempPathFactory) -> cluster_fleet.EarlyWorker:
    return cluster_fleet.EarlyWorker("fr", cluster_fleet.french_env)


# Booted while test_frontends' tests of the keyed host (w1) run, once fr has ended
# (helpers.MAX_ENGINES).
@helpers.start_early("second_worker", with_module="test_frontends")
def start_second_worker(tmp_path_factory: pytest.TempPathFactory) -> cluster_fleet.EarlyWorker:
    return cluster_fleet.EarlyWorker("w2", lambda root: cluster_fleet.W2_ENV)


@pytest.fixture(scope="session")
def fleet(
    dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster_fleet.Cluster]:
    """The cluster's Redis, gateway and w1 (``cluster_fleet.EarlyFleet``), ready."""
    with helpers.early_server("fleet", tmp_path_factory) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def french_worker(
    fleet: cluster_fleet.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster_fleet.Node]:
    """fr, the French dev model's worker in the cluster, ready."""
    with helpers.early_server("french_worker", tmp_path_factory) as node:
        yield node


@pytest.fixture(scope="session")
def second_worker(
    fleet: cluster_fleet.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cluster_fleet.Node]:
    """w2, the cluster's second English worker, ready."""
    with helpers.early_server("second_worker", tmp_path_factory) as node:
        yield node


@pytest.fixture(scope="module")
def keyed_host(fleet: cluster_fleet.Cluster) -> Iterator[cluster_fleet.Node]:
    """w1 as test_auth and test_frontends use it: a host of two front ends with keys
    (``cluster_fleet.KEYED_KEYS``, one in a keys file), the internal token, private metrics and word
    timing from a forced aligner in a folder. The error answers its OpenAPI operations do not
    list are read once the module is done (w1 ends by a kill, whose end reads none)."""
    node = fleet.workers["w1"]
    yield node
    if node.process.poll() is None:
        helpers.undocumented.extend(helpers.undocumented_errors(node.url))


# --- the shared server, hot -------------------------------------------------------------------

# The shared server sampling at temperature 1.5 (test_frame_constraint), admitting a stream only
# while each keeps 1.2 x 100 audio tokens/s (test_admission): this CPU engine's dev streams make
# 150-230 tokens/s alone, 150-190 two at once, 90-155 three or four at once. Past that the
# front end's decoding, which the engine's rates do not show, slows them more than predicted:
# a bound the engine meets within three or four streams keeps admission's prediction honest.
# One segment at a time per stream,
# so that a stream is one engine request; with serving's repetition penalty (TEST_ENV turns it
# off elsewhere). Set at run time for the test alone, then set back.
HOT_SETTINGS = {
    "temperature": 1.5,
    "top_p": 1.0,
    "repetition_penalty": 1.1,
    "realtime_tokens_per_second": 100,
    "realtime_margin": 1.2,
    "segment_prefetch": 1,
    "segment_max_chars": 120,
}


@pytest.fixture
async def hot_server(server: Server) -> AsyncIterator[Server]:
    """The shared server with ``HOT_SETTINGS`` while the test runs. At the shared settings'
    temperature 0.6 the dev model almost never samples a wrong position, so only a hot engine
    shows that none gets through (unconstrained, this one drops about one frame in five:
    docs/BENCHMARKS.md); and admission from measured capacity would refuse the streams other
    tests open at once, hence off but for this test."""
    async with helpers.runtime_settings(server, **HOT_SETTINGS):
        yield server


@pytest.fixture
async def hot_sampling(server: Server) -> AsyncIterator[Server]:
    """The shared server sampling as ``HOT_SETTINGS`` do, its admission as it was (measured
    admission off, as on every dev server): a test of what hot sampling makes runs its streams
    at once rather than as admission lets them in one by one."""
    sampling = {k: v for k, v in HOT_SETTINGS.items() if not k.startswith("realtime_")}
    async with helpers.runtime_settings(server, **sampling):
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


# --- fixtures many modules share ---------------------------------------------------------------
# Imported where they are used: a run that asks for none of these loads no torch or SNAC.


@pytest.fixture(scope="session")
def codec(dev_model: DevModelPaths):
    """The dev SNAC on the CPU, without its noise blocks, so a decode depends only on the frames:
    loaded once. Tests make their own ``SnacCodec`` around ``codec.model`` to change a setting."""
    from voicehost.model.codec import SnacCodec

    codec = SnacCodec.load(dev_model.codec, device="cpu", noise=False)
    yield codec
    codec.close()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    """16 espeak-ng clips, about 40 s of speech (a voice needs 30): 3 are held out as references
    and 13 trained on. Read only: a test that changes it works on a copy of its folder."""
    from voicehost.tools.devcorpus import build_corpus

    return build_corpus(tmp_path_factory.mktemp("corpus"), count=16)


@pytest.fixture(scope="session")
def rules(dev_model: DevModelPaths):
    """What the dev engine accepts: adapters for ``voicehost-dev`` up to rank 16, of its shape."""
    from voicehost.voices.validation import AdapterRules, ModelShape

    shape = ModelShape.from_config(dev_model.model / "config.json")
    return AdapterRules("voicehost-dev", 16, shape)


@pytest.fixture
async def redis_client(redis_server: RedisServer):
    """An asyncio client of the test's own Redis, answering in strings."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()
