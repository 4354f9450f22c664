"""A real Prometheus (Debian's ``prometheus``) scrapes the shared dev server and a gateway in
front of it, with deploy/monitoring's rules loaded: every metric the rules and the dashboard
name returns a series once the server has done what makes it (a stream, a voice not found, a
stream refused at capacity), every expression of theirs evaluates, every rule evaluates without
an error. The gateway (no engine: its own Redis, the dev server joined as its worker with one
heartbeat) is scraped for the ring's metrics, which only a gateway exports."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml
from helpers import (
    Server,
    free_port,
    gateway_before,
    launch,
    metric,
    monitoring_exprs,
    named_metrics,
    runtime_settings,
    stop,
    wait_until,
)

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus missing: scripts/system_deps.sh installs it"
)
HTTP_TIMEOUT = 120
SPEECH = {"input": "Monitoring starts with a little speech.", "voice": "tara"}


@pytest.fixture(scope="module")
async def gateway(server: Server, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """``voicehost gateway`` with the dev server as its one worker."""
    root = tmp_path_factory.mktemp("monitoring-gateway")
    async with gateway_before(server.url, "dev", 8, root) as url:
        yield url


@pytest.fixture(scope="module")
def prometheus(
    server: Server, gateway: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A Prometheus of the test's own (free port, its own storage), scraping every second."""
    assert PROMETHEUS is not None
    root = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(MONITORING / name) for name in ("alerts.yml", "recording.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [urlsplit(url).netloc]}]}
            for job, url in (("voicehost-worker", server.url), ("voicehost-gateway", gateway))
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        PROMETHEUS,
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    process = launch(command, dict(os.environ), root / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: ready(url) or process.poll() is not None, 60, step=0.2)
        assert process.poll() is None, (root / "prometheus.log").read_text()[-3000:]
        yield url
    finally:
        stop(process)


def ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


async def query(http: aiohttp.ClientSession, prometheus: str, expr: str) -> list[dict]:
    async with http.get(prometheus + "/api/v1/query", params={"query": expr}) as response:
        answer = await response.json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


DECODE_COST = "voicehost_decode_seconds_per_audio_second"


async def stream_while_watching(
    http: aiohttp.ClientSession, server: Server, ws: aiohttp.ClientWebSocketResponse
) -> dict[str, float]:
    """Speak over the open socket, reading ``/metrics`` while it streams: the most of each of
    the gauges that count what is in flight, and of the decoder's cost per audio second."""
    watched = {
        "voicehost_lora_adapters_in_use": 0.0,
        'voicehost_frontend_streams{frontend="0"}': 0.0,
        DECODE_COST: 0.0,
    }
    text = " ".join(["Every word of this is counted while it streams."] * 2)
    await ws.send_json({"type": "config", "voice": "tara", "response_format": "pcm"})
    await ws.send_json({"type": "text", "text": text})
    await ws.send_json({"type": "end"})

    async def watch() -> None:
        while True:
            for name in watched:
                watched[name] = max(watched[name], await metric(http, server, name))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    audio = 0
    try:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                audio += len(message.data)
    finally:
        watcher.cancel()
    assert audio > 0
    return watched


async def test_every_metric_the_rules_and_dashboard_name_has_a_series_in_a_real_prometheus(
    server: Server, gateway: str, prometheus: str, http: aiohttp.ClientSession
):
    speech = server.url + "/v1/audio/speech"
    async with http.post(speech, json={**SPEECH, "response_format": "pcm"}) as response:
        assert response.status == 200 and len(await response.read()) > 0
    async with http.post(speech, json={**SPEECH, "voice": "no-such-voice"}) as response:
        assert response.status == 404, await response.text()
    # measured admission asking far beyond what the engine does: the socket is admitted (the
    # first stream always is) and holds its stream while open; a second stream is refused
    async with runtime_settings(server, realtime_tokens_per_second=1_000_000):
        async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
            async with http.post(speech, json=SPEECH) as response:
                assert response.status == 503, await response.text()
                assert (await response.json())["error"]["code"] == "at_capacity"
            in_flight = await stream_while_watching(http, server, ws)
    # the decoder's cost, read once it had decoded 2 s of audio in its window (0 before)
    assert in_flight.pop(DECODE_COST) > 0, in_flight
    assert all(most >= 1 for most in in_flight.values()), in_flight

    exprs = monitoring_exprs()
    names = named_metrics(exprs)
    assert len(names) > 20
    pattern = "|".join(sorted(names))
    deadline = time.monotonic() + 60
    while True:  # each series, once a scrape after the activity above has been stored
        found = await query(http, prometheus, f'count by (__name__) ({{__name__=~"{pattern}"}})')
        missing = names - {series["metric"]["__name__"] for series in found}
        if not missing or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert not missing, f"no series in Prometheus for: {sorted(missing)}"
    refused = await query(http, prometheus, 'voicehost_errors_total{kind="at_capacity"}')
    assert refused and float(refused[0]["value"][1]) >= 1
    ring = await query(http, prometheus, 'voicehost_ring_workers{job="voicehost-gateway"}')
    assert [float(s["value"][1]) for s in ring] == [1.0]

    for expr in exprs:  # every rule's and panel's expression is PromQL this Prometheus runs
        await query(http, prometheus, expr)
    deadline = time.monotonic() + 30
    while True:  # every rule evaluated at least once, none with an error
        async with http.get(prometheus + "/api/v1/rules") as response:
            groups = (await response.json())["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        pending = [r["name"] for r in evaluated if r.get("lastEvaluation", "").startswith("0001")]
        if not pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert {g["name"] for g in groups} == {"voicehost.alerts", "voicehost.recording"}
    files = [yaml.safe_load((MONITORING / n).read_text()) for n in ("alerts.yml", "recording.yml")]
    assert len(evaluated) == sum(len(g["rules"]) for f in files for g in f["groups"])
    assert not pending, pending
    broken = [(r["name"], r.get("lastError")) for r in evaluated if r["health"] != "ok"]
    assert not broken, json.dumps(broken)
