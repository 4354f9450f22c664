"""Shared fixtures: the dev model (built once, cached), one real server over real HTTP shared by
every module that needs no settings of its own, and a Redis of a test's own. Helpers the tests
share are in helpers.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from helpers import DEV_DIR, RedisServer, Server, dev_server, free_port

from voicehost import devserver
from voicehost.devmodel import DevModelPaths, ensure_dev_model

# A test that means a Redis of its own must never reach the machine's: no URL from the
# environment (Settings() has none by default, and connect() refuses to run without one).
os.environ.pop("VOICEHOST_REDIS_URL", None)


# The fixtures that start a server process (a dev server, workers, a gateway, a Redis): a test
# marked ``unit`` (make test-fast) that asks for one, even through another fixture, fails.
SERVER_FIXTURES = frozenset(
    {"server", "small_server", "keyed", "gateway", "cluster", "redis_server"}
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    helpers.unit_test = None
    if item.get_closest_marker("unit") is None:
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
}


class EarlyServer:
    """The shared server, started as soon as the run is known to need it: it boots (half a
    minute) while the tests before its first user run, watched from the start by a thread that
    records its readiness."""

    def __init__(self, root: Path) -> None:
        self.server = devserver.start_dev_server(root, **helpers.TEST_ENV, **SERVER_ENV)
        self.failure: devserver.NotReady | None = None
        self.watch = threading.Thread(target=self._wait, daemon=True)
        self.watch.start()

    def _wait(self) -> None:
        s = self.server
        try:
            s.readiness.extend(devserver.wait_ready(s.process, s.url, s.log))
        except devserver.NotReady as error:
            self.failure = error

    def ready(self) -> Server:
        self.watch.join()
        if self.failure is not None:
            pytest.fail(str(self.failure), pytrace=False)
        return self.server


early_server: EarlyServer | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    global early_server
    if any("server" in getattr(item, "fixturenames", ()) for item in session.items):
        early_server = EarlyServer(session.config._tmp_path_factory.mktemp("server"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if early_server is not None:  # also when no test got as far as the fixture
        devserver.stop(early_server.server.process)


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


@pytest.fixture(scope="session")
def server(dev_model: DevModelPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared ``voicehost serve --dev``: open (no keys), with its own adapters folder; every
    module that needs no settings of its own uses it."""
    if early_server is None:  # a run collected without it (pytest_collection_finish)
        with dev_server(tmp_path_factory.mktemp("server"), **SERVER_ENV) as server:
            yield server
        return
    try:
        yield early_server.ready()
    finally:
        devserver.stop(early_server.server.process)
