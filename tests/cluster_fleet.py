"""The suite's cluster (conftest's ``fleet``, ``french_worker`` and ``second_worker``): a Redis of
its own, a gateway, and dev workers of two base models, over real HTTP with API keys.

- **w1** (``voicehost-dev``, English): one engine core, two front ends, one encoding process
  each; booted at collection. Before the cluster's own tests it is the keyed host of test_auth
  and test_frontends (keys of several tenants, one in a keys file, private metrics, per-key
  quotas, word timing by a forced aligner from a folder): a host whose keys cannot change while
  it runs, so they are all here. The cluster's kill -9 of one of its front ends ends it.
- **fr** (``voicehost-dev-fr``, French: the dev model built with ``--language fr``): two front
  ends too; booted with test_auth. test_frontends' first tests are its: the two-language test
  shows each voice spoken only by its model's worker, then one drains it and kills its engine
  core. It has ended before w2 boots (``helpers.MAX_ENGINES``: the shared server, w1, and fr
  or w2).
- **w2** (``voicehost-dev``): one front end with an encoding process, booted while
  test_frontends' tests of w1 run; the cluster's last tests drain it and kill it.

Four engine boots in a run with the shared server: w1 serves as the keyed host, whose boot is
fr's now."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import (
    DEV_DIR,
    RedisServer,
    dev_env,
    engines_stopped,
    free_port,
    key_entries,
    launch,
    started,
    stop_in_background,
    tiny_ctc_model,
    undocumented,
    undocumented_errors,
    wait_ready,
    wait_until,
)

from voicehost.model.devmodel import ensure_dev_model
from voicehost.tenancy.keys import hash_key

HEARTBEAT = 1.0  # the defaults: two engines on 2 busy cores can starve a worker for 2 s
TTL = 5.0
POLL = 0.5
SLACK = 1.0  # scheduling on a busy 2-core machine
JOB_LEASE = 3.0  # a clone job's runner renews its lease every second
TOKEN = "internal-token-for-cluster-tests"  # a keyed gateway forwards callers with it
ADMIN_KEY = "key-cluster-admin"  # every cluster test's caller but the quota's
QUOTA_KEY = "key-cluster-quota"  # the quota test's alone: no other test's stream counts against it
BUSY_KEY = "key-cluster-busy"  # fills a worker to its capacity: the at-capacity tests' alone
KEY_MAX_STREAMS = 4  # per key in the whole cluster; the other tests open at most 3 streams at once
WORKER_CAPACITY = KEY_MAX_STREAMS  # streams a worker admits: the busy key alone fills one
TENANT_KEYS = {"ta": "key-cluster-tenant-a", "tb": "key-cluster-tenant-b"}  # voices scope only
CLUSTER_KEYS = [
    {"id": "fleet", "tenant": "ops", "scopes": ["admin"], "sha256": hash_key(ADMIN_KEY)},
    *[
        {"id": tenant, "tenant": tenant, "scopes": ["voices"], "sha256": hash_key(key)}
        for tenant, key in TENANT_KEYS.items()
    ],
    {"id": "quota", "tenant": "q", "scopes": ["synthesize"], "sha256": hash_key(QUOTA_KEY)},
    {"id": "busy", "tenant": "busy", "scopes": ["synthesize"], "sha256": hash_key(BUSY_KEY)},
]

# The keyed host's keys (test_auth's and test_frontends'): key -> (id, tenant, scopes). Tenants
# A and B are test_auth's, acme and globex test_frontends' (its capacity and quota tests); an
# admin for both. Each holds at most KEYED_QUOTA streams at once (its entry's ``max_streams``:
# the cluster's keys hold KEY_MAX_STREAMS), so two keys fill a worker.
KEYED_QUOTA = 2
KEYED_KEYS = {
    "key-a": ("a", "A", ["synthesize", "voices"]),
    "key-a-speak": ("a-speak", "A", ["synthesize"]),
    "key-a-manage": ("a-manage", "A", ["voices"]),
    "key-b": ("b", "B", ["synthesize", "voices"]),
    "key-admin": ("ops", "ops", ["admin"]),
    "key-acme-1": ("acme-1", "acme", ["synthesize"]),
    "key-acme-2": ("acme-2", "acme", ["synthesize"]),
    "key-globex": ("globex", "globex", ["synthesize"]),
    # fr's last test's: the leases of the streams its engine core's death cuts stay in Redis
    # until they expire (15 s), so no key a later test speaks with holds them
    "key-drain-1": ("drain-1", "drain", ["synthesize"]),
    "key-drain-2": ("drain-2", "drain", ["synthesize"]),
}
KEYED_FILE_KEYS = {"key-b-file": ("b-file", "B", ["synthesize", "voices"])}  # w1's keys file
KEYS = [
    *CLUSTER_KEYS,
    *[{**entry, "max_streams": KEYED_QUOTA} for entry in key_entries(KEYED_KEYS)],
]

FRENCH_MODEL = "voicehost-dev-fr"


@dataclass
class Node:
    name: str
    url: str
    process: subprocess.Popen
    log: Path


@dataclass
class Cluster:
    redis: RedisServer
    gateway: Node
    workers: dict[str, Node]
    root: Path
    env: dict[str, str]


def cluster_env(root: Path, redis_server: RedisServer) -> dict[str, str]:
    """What every process of the cluster is started with (gateway, workers, runners)."""
    return dev_env(
        VOICEHOST_REDIS_URL=redis_server.url,
        VOICEHOST_SHARED_DIR=str(root / "shared"),
        VOICEHOST_ADAPTER_CACHE_DIR=str(root / "cache"),
        VOICEHOST_HEARTBEAT_SECONDS=str(HEARTBEAT),
        VOICEHOST_WORKER_TTL_SECONDS=str(TTL),
        VOICEHOST_MEMBERSHIP_POLL_SECONDS=str(POLL),
        # a checkpoint after each: r1's kill lands between the first and the last (the clone test)
        VOICEHOST_CLONE_EPOCHS="3",
        VOICEHOST_JOB_LEASE_SECONDS=str(JOB_LEASE),
        VOICEHOST_MIN_SPEECH_SECONDS="10",
        VOICEHOST_API_KEYS=json.dumps(KEYS),
        VOICEHOST_INTERNAL_TOKEN=TOKEN,
        VOICEHOST_KEY_MAX_STREAMS=str(KEY_MAX_STREAMS),
        VOICEHOST_WORKER_CAPACITY=str(WORKER_CAPACITY),
        # the gate on, above anything a clone can measure: a clone here is held
        VOICEHOST_EVAL_REPORT_ONLY="false",
        VOICEHOST_EVAL_MIN_SIMILARITY="0.999",
        # 6 sentences (the most) and a baseline's: evaluating outlasts the lease (the clone test)
        VOICEHOST_EVAL_SENTENCES="6",
        VOICEHOST_EVAL_BASELINES="1",
        VOICEHOST_REQUIRE_CONSENT="true",  # as in production, not as --dev would have it
        # the usage each front end counts reaches the cluster's within test_frontends' waits
        VOICEHOST_USAGE_FLUSH_SECONDS="0.2",
    )


def bearer(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def start_gateway(root: Path, env: dict[str, str], name: str, hash_seed: str) -> Node:
    port = free_port()
    log = root / f"{name}.log"
    command = [sys.executable, "-m", "voicehost", "gateway", "--dev", "--port", str(port)]
    process = launch(command, {**env, "PYTHONHASHSEED": hash_seed}, log)
    return Node(name, f"http://127.0.0.1:{port}", process, log)


def start_worker(root: Path, env: dict[str, str], name: str) -> Node:
    port = free_port()
    log = root / f"{name}.log"
    command = [sys.executable, "-m", "voicehost", "worker", "--dev", "--port", str(port)]
    process = launch([*command, "--worker-id", name], env, log)
    return Node(name, f"http://127.0.0.1:{port}", process, log)


def members(cluster: Cluster, gateway: Node | None = None) -> set[str]:
    import urllib.request

    url = (gateway or cluster.gateway).url + "/v1/cluster"
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=bearer()), timeout=2
    ) as response:
        return {w["id"] for w in json.loads(response.read())["workers"]}


# w1: one engine core with two front ends, one ring member all the same, and the keyed host's
# settings (above). w2: a worker alone (one front end) with an encoding process: the cluster's
# last test kills it with SIGKILL. fr: two front ends with an encoding process each, the
# French dev model, long segments (test_frontends' last test holds three long streams on it).
W2_ENV = {"VOICEHOST_FRONTENDS": "1", "VOICEHOST_ENCODE_PROCESSES": "1"}


def w1_env(root: Path) -> dict[str, str]:
    keys_file = root / "keys.json"
    keys_file.write_text(json.dumps(key_entries(KEYED_FILE_KEYS)))
    return {
        "VOICEHOST_FRONTENDS": "2",
        "VOICEHOST_ENCODE_PROCESSES": "1",
        "VOICEHOST_API_KEYS_FILE": str(keys_file),
        "VOICEHOST_METRICS_PUBLIC": "false",
        "VOICEHOST_ALIGNER_MODEL": str(tiny_ctc_model(root / "tiny-ctc")),
    }


def french_env(root: Path) -> dict[str, str]:
    """fr's own settings: the dev model's copy that says it speaks French (its voices pierre,
    amelie, marie) under a base model name of its own, and no dev adapters (w1 publishes those,
    for ``voicehost-dev``)."""
    folder = root / "dev-fr"
    shutil.copytree(DEV_DIR, folder, ignore=shutil.ignore_patterns("adapters"))
    ensure_dev_model(folder, language="fr")
    (folder / "adapters").mkdir()
    return {
        "VOICEHOST_DEV_DIR": str(folder),
        "VOICEHOST_BASE_MODEL_NAME": FRENCH_MODEL,
        "VOICEHOST_FRONTENDS": "2",
        "VOICEHOST_ENCODE_PROCESSES": "1",
        "VOICEHOST_SEGMENT_MAX_CHARS": "900",
    }


class EarlyFleet:
    """The cluster's Redis, gateway and w1, started at collection: w1 boots beside the unit
    tests, and serves test_auth's and test_frontends' tests before the cluster's."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.redis = RedisServer(free_port(), root)
        self.redis.start()
        self.env = cluster_env(root, self.redis)
        self.w1 = start_worker(root, {**self.env, **w1_env(root)}, "w1")
        self.gateway = start_gateway(root, self.env, "gateway", "1")
        self.engines = 1

    def running(self) -> bool:
        return self.w1.process.poll() is None

    def ready(self) -> Cluster:
        wait_ready(self.w1.process, self.w1.url, self.w1.log)
        wait_ready(self.gateway.process, self.gateway.url, self.gateway.log)
        cluster = Cluster(self.redis, self.gateway, {"w1": self.w1}, self.root, self.env)
        wait_until(lambda: "w1" in members(cluster), 10)
        return cluster

    def stop(self) -> None:
        if self.running():
            undocumented.extend(undocumented_errors(self.w1.url))
        stop_in_background(self.gateway.process, self.w1.process)
        engines_stopped(self)
        self.redis.stop()


class EarlyWorker:
    """One more worker of the fleet (w2, or fr), joined to its Redis; the fleet must have
    started first (it is registered first, and at collection)."""

    def __init__(self, name: str, own: Callable[[Path], dict[str, str]]) -> None:
        fleet = started("fleet")
        if not isinstance(fleet, EarlyFleet):
            pytest.fail(f"{name} joins the fleet, which has not started", pytrace=False)
        self.node = start_worker(fleet.root, {**fleet.env, **own(fleet.root)}, name)
        self.engines = 1

    def running(self) -> bool:
        return self.node.process.poll() is None

    def ready(self) -> Node:
        wait_ready(self.node.process, self.node.url, self.node.log)
        return self.node

    def stop(self) -> None:
        if self.running():
            undocumented.extend(undocumented_errors(self.node.url))
        stop_in_background(self.node.process)
        engines_stopped(self)
