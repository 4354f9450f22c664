"""``voicehost serve --frontends 2`` on the dev engine: one vLLM engine core, two serving
processes accepting on one port, each an engine client of the core (``voicehost.host``).
What is one per host is tested as such: the capacity and each key's quota count both front
ends' streams, ``/metrics`` and ``/v1/usage`` answer for the host from either, and the audit
chain stays one chain when both write to it at once. Each front end encodes in an encoding
process of its own (``VOICEHOST_ENCODE_PROCESSES=1``): its loss ends only its streams, and
SIGTERM and kill -9 leave none behind.

On the keyed host (conftest's ``keyed_host``, which test_auth shares: the cluster's w1, before
the cluster's own tests; ``tests/cluster_fleet.py``): a capacity of 4 streams and a quota of 2 per
key, whose refusals are tested here too. A host's kill -9 is the cluster's (its w1).

First fr, the cluster's French worker (a host of two front ends too, of the French dev model):
the cluster's two-language test, behind the cluster's gateway beside w1, then a test that
drains fr, SIGTERMs it and kills its engine core mid-stream. It ends fr, and w2 boots while the
keyed host's tests run (``tests/cluster_fleet.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest
from cluster_fleet import (
    ADMIN_KEY,
    FRENCH_MODEL,
    KEYED_QUOTA,
    TOKEN,
    WORKER_CAPACITY,
    Cluster,
    Node,
    members,
)
from helpers import (
    adapter_form,
    alive,
    is_engine_core,
    is_frontend,
    process_tree,
    read_socket,
    wait_until,
)

from voicehost.api.auth import INTERNAL_TOKEN_HEADER
from voicehost.api.edge import FRONTEND_HEADER, REQUEST_ID_HEADER
from voicehost.host import launcher
from voicehost.host.frontend import CORE_LOST_SIGNAL
from voicehost.tenancy.audit import Head, verify_events

SPEECH = "/v1/audio/speech"
# the keyed host's (w1: cluster_fleet): streams it admits in all and per key, its keys by the
# name each test calls them (a and b: tenant acme; c: globex; admin) and its internal token
CAPACITY, QUOTA = WORKER_CAPACITY, KEYED_QUOTA
KEYS = {"a": "key-acme-1", "b": "key-acme-2", "c": "key-globex", "admin": "key-admin"}
KEYS |= {"d1": "key-drain-1", "d2": "key-drain-2"}  # fr's last test's (cluster_fleet)
INTERNAL_TOKEN = TOKEN
LONG_TEXT = "A long sentence that keeps the engine busy for a good while. " * 3


@pytest.fixture(scope="module")
def frontends(keyed_host: Node) -> Node:
    """The keyed host (w1): one engine core, two front ends (conftest)."""
    return keyed_host


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def connection() -> aiohttp.ClientSession:
    """A session whose every request has a connection of its own: the kernel picks the front
    end that accepts each (``SO_REUSEPORT``)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def speak(
    url: str, text: str, seed: int, key: str = "a", fmt: str = "pcm"
) -> tuple[str, int]:
    """One speech request: which front end answered, and the bytes of ``fmt`` it sent (for a
    compressed format, the samples they decode to)."""
    body = {"input": text, "voice": "dev-a", "response_format": fmt, "seed": seed}
    async with connection() as http:
        async with http.post(url + SPEECH, json=body, headers=auth(key)) as response:
            assert response.status == 200, await response.text()
            data = await response.read()
            return response.headers[FRONTEND_HEADER], len(data) if fmt == "pcm" else decoded(data)


def decoded(data: bytes) -> int:
    """The samples a compressed stream decodes to."""
    with av.open(io.BytesIO(data)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


def encoding_processes(pid: int) -> list[Any]:
    """The encoding processes (``voicehost.audio.encoding``) in a host's tree."""
    return [p for p in process_tree(pid) if "voicehost.audio.encoding" in " ".join(p.cmdline())]


async def from_both(
    call: Callable[[], Awaitable[tuple[str, Any]]], least: int = 8, parallel: int = 1
) -> list[Any]:
    """What ``call`` answers (each ``(front end, answer)``), ``parallel`` calls at a time,
    until both front ends have answered: at least ``least`` calls, at most 64. Both front ends
    accept on the host's one socket, and the one waiting takes a connection: one whose loop is
    busy (a loaded machine) takes none for a while (64 in 60 ms all went to one), so past
    ``least`` the calls are spread over about 3 s."""
    answers: list[tuple[str, Any]] = []
    while len(answers) < 64:
        answers += await asyncio.gather(*(call() for _ in range(parallel)))
        if {frontend for frontend, _ in answers} == {"0", "1"}:
            if len(answers) >= least:
                break
        elif len(answers) >= least:
            await asyncio.sleep(0.05)
    assert {frontend for frontend, _ in answers} == {"0", "1"}, answers
    return [answer for _, answer in answers]


def draining_front_end(ready: str, told: str) -> None:
    """A front end draining after SIGTERM (which it ignores): it ends once told its core is
    lost, touching ``told``, or after 10 s if no one tells it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(CORE_LOST_SIGNAL, lambda *_: (Path(told).touch(), os._exit(0)))
    Path(ready).touch()
    time.sleep(10)


def core_that_ends(how: str) -> None:
    """An engine core that ends as vLLM's does on the stop's own signal (exit 0), or killed."""
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.unit
@pytest.mark.parametrize(("how", "failure"), [("killed", True), ("stopped", False)])
def test_a_core_lost_while_the_host_drains_ends_the_streams_and_only_a_kill_is_a_failure(
    tmp_path, how, failure
):
    """The host's watch (``launcher._wait``), stopping after SIGTERM, over real processes: a
    draining front end is told its core is lost at once (its streams end with the error, not
    at the drain timeout); the host fails if the core was killed, not if it ended on the stop's
    own signal (Ctrl-C and a supervisor's SIGTERM reach the whole process group)."""
    context = multiprocessing.get_context("fork")
    ready, told = tmp_path / "ready", tmp_path / "told"
    front_end = context.Process(target=draining_front_end, args=(str(ready), str(told)))
    front_end.start()
    wait_until(ready.exists, 10)
    core = context.Process(target=core_that_ends, args=(how,))
    core.start()
    started = time.monotonic()
    assert launcher._wait([front_end], [core], lambda: True) is failure
    assert told.exists() and time.monotonic() - started < 5
    assert core.exitcode == (-signal.SIGKILL if how == "killed" else 0)


def serving_front_end(ready: str) -> None:
    """A front end with streams in flight: after SIGTERM it would drain for a minute (it
    ignores it here)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(ready).touch()
    time.sleep(60)


@pytest.mark.unit
@pytest.mark.parametrize("stop_came", [False, True])
def test_a_front_end_killed_ends_the_host_at_once_and_as_a_failure(tmp_path, stop_came):
    """The host's watch over real processes: one of two front ends SIGKILLed ends the other
    at once (its streams cut, not drained behind a ring that no longer routes to it) and the
    host as a failure (exit 1 for its supervisor), even when a stop signal came meanwhile
    (the host once exited 0 then, after a minute's drain)."""
    context = multiprocessing.get_context("fork")
    ready = [tmp_path / f"ready-{index}" for index in range(2)]
    front_ends = [context.Process(target=serving_front_end, args=(str(r),)) for r in ready]
    for process in front_ends:
        process.start()
    wait_until(lambda: all(r.exists() for r in ready), 10)
    os.kill(front_ends[0].pid, signal.SIGKILL)
    started = time.monotonic()
    assert launcher._wait(front_ends, [], lambda: stop_came) is True
    assert time.monotonic() - started < 5
    assert [p.exitcode for p in front_ends] == [-signal.SIGKILL, -signal.SIGKILL]


# --- fr first: the cluster's two languages, then fr drained and ended (w2 boots meanwhile) ---


async def gateway_speaks(
    cluster: Cluster, voice: str, text: str
) -> tuple[int, str | None, bytes, str | None]:
    """A speech request through the cluster's gateway (its admin key): status, the worker that
    spoke (``X-Voicehost-Worker``), the body and ``Retry-After``."""
    body = {"input": text, "voice": voice, "response_format": "pcm"}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with connection() as http:
        async with http.post(cluster.gateway.url + SPEECH, json=body, headers=headers) as r:
            worker, retry = r.headers.get("X-Voicehost-Worker"), r.headers.get("Retry-After")
            return r.status, worker, await r.read(), retry


async def test_each_voice_is_spoken_only_by_the_worker_of_its_base_model(
    fleet: Cluster, french_worker: Node, dev_model
):
    """The cluster's two languages: w1 serves ``voicehost-dev`` (English), fr the French dev
    model under a name of its own (``voicehost-dev-fr``), behind one gateway. Each says its
    model and its voices' languages; the gateway lists both models and every voice with its
    language, and places each voice on its model's ring only: the French voices, and a French
    adapter uploaded at the gateway, are spoken by fr, over HTTP and the socket; the English
    ones by w1; an adapter of a model no worker serves is refused, naming those served. (fr
    drained: the next test.)"""
    await asyncio.to_thread(wait_until, lambda: members(fleet) >= {"w1", "fr"}, 10)
    store = fleet.redis.client()
    assert store.hget("vh:member:w1", "base_model") == "voicehost-dev"
    assert store.hget("vh:member:fr", "base_model") == FRENCH_MODEL
    assert json.loads(store.hget("vh:member:fr", "voices")) == {
        "pierre": "fr",
        "amelie": "fr",
        "marie": "fr",
    }
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    gateway = fleet.gateway.url
    async with connection() as http:
        async with http.get(gateway + "/v1/models", headers=admin) as response:
            models = {m["id"]: m["languages"] for m in (await response.json())["data"]}
        assert models[FRENCH_MODEL] == ["fr"] and models["voicehost-dev"] == ["en"], models
        async with http.get(gateway + "/v1/audio/voices", headers=admin) as response:
            listed = {v["id"]: v.get("language") for v in (await response.json())["voices"]}
    assert {listed[v] for v in ("pierre", "amelie", "marie")} == {"fr"}, listed
    assert {listed[v] for v in ("tara", "leo", "dev-a")} == {"en"}, listed
    config = json.loads((dev_model.adapters / "dev-b" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = FRENCH_MODEL
    form = adapter_form(dev_model, "lea-fr", config)
    form.add_field("language", "fr")
    async with connection() as http:
        async with http.post(gateway + "/v1/voices", data=form, headers=admin) as response:
            assert response.status == 201, await response.text()
        german = adapter_form(dev_model, "hans", {**config, "base_model_name_or_path": "3b-de"})
        async with http.post(gateway + "/v1/voices", data=german, headers=admin) as response:
            refusal = (await response.json())["error"]
    assert (response.status, refusal["code"]) == (400, "invalid_adapter"), refusal
    assert f"'{FRENCH_MODEL}'" in refusal["message"]  # the models the cluster serves, named
    try:
        assert store.hget("vh:voice:lea-fr", "base_model") == FRENCH_MODEL
        spoken = {}
        for voice, text in [
            ("pierre", "Il est 14h30, le 3 mars."),
            ("amelie", "Ça coûte 42,50 €."),
            ("lea-fr", "Bonjour !"),
            ("tara", "It is half past two."),
            ("leo", "That costs $42.50."),
            ("dev-a", "Hello there."),
        ]:
            status, worker, audio, _ = await gateway_speaks(fleet, voice, text)
            assert status == 200 and len(audio) > 0, (voice, audio[:200])
            spoken[voice] = worker
        assert spoken == {
            "pierre": "fr",
            "amelie": "fr",
            "lea-fr": "fr",
            "tara": "w1",
            "leo": "w1",
            "dev-a": "w1",
        }, spoken
        async with connection() as http:
            async with http.ws_connect(gateway + SPEECH + "/ws", headers=admin) as ws:
                await ws.send_json({"type": "config", "voice": "marie", "response_format": "pcm"})
                await ws.send_json({"type": "text", "text": "Merci beaucoup."})
                await ws.send_json({"type": "end"})
                events, audio = await read_socket(ws)
        assert events[0] == "ready" and events[-1] == "done" and audio > 0, events
    finally:
        async with connection() as http:
            async with http.delete(gateway + "/v1/voices/lea-fr", headers=admin) as response:
                assert response.status == 204, await response.text()


async def test_a_drained_host_under_sigterm_whose_engine_core_dies_ends_every_stream(
    fleet: Cluster, french_worker: Node
):
    """fr's last test: it ends it (before the keyed host's tests, while w2 boots). A raw
    stream, an SSE stream (mp3, through the encoding processes) and a socket play, of a French
    voice. One front end is drained (``/internal/drain``, as ``voicehost drain`` reaches one of
    them): ``/readyz`` is 503 from every front end at once, every front end has drained by the
    time the drain is answered (told over the host's channel: new streams 503 ``not_ready``),
    and ``/internal/load`` on either counts the host's streams; fr has left the ring, and the
    cluster's gateway answers its voices 503 ``model_unavailable`` with ``Retry-After``, never
    speaking them on w1 (another model's worker). SIGTERM to the host reaches its front ends,
    which keep their streams playing. Then the engine core is killed: a front end's engine
    client does not watch a core it did not start, so the host does. It tells its front ends,
    which fail their engine requests: every stream ends as a failure after the first byte does
    (before, they waited for tokens for ever, then were cut by the front end's end), the SSE
    stream and the socket with an error event. The host exits by itself, not cleanly, leaving
    no process: front ends, encoding processes, core. (A SIGTERM that drains a host to a clean
    exit is the cluster's last test, on w2.)"""
    frontends = french_worker
    url = frontends.url
    tree = process_tree(frontends.process.pid)
    assert len(encoding_processes(frontends.process.pid)) == 2
    body = {"input": LONG_TEXT * 8, "voice": "pierre", "response_format": "pcm", "seed": 7}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        raw = await http.post(url + SPEECH, json=body, headers=auth("d1"))
        mp3 = {**body, "response_format": "mp3", "stream_format": "sse"}
        sse = await http.post(url + SPEECH, json=mp3, headers=auth("d1"))
        for response in (raw, sse):
            assert response.status == 200, await response.text()
            assert await response.content.readany()
        ws = await http.ws_connect(url + "/v1/audio/speech/ws", headers=auth("d2"))
        await ws.send_json({"type": "config", "voice": "pierre", "response_format": "pcm"})
        await ws.send_json({"type": "text", "text": LONG_TEXT})
        while (await ws.receive(timeout=60)).type != aiohttp.WSMsgType.BINARY:
            pass  # ready, segment.started: then audio
        internal = {INTERNAL_TOKEN_HEADER: INTERNAL_TOKEN}
        async with connection() as client:
            async with client.post(url + "/internal/drain", headers=internal) as response:
                assert response.status == 200
                drained = response.headers[FRONTEND_HEADER]
        answers = []
        while len(answers) < 40 and len({frontend for frontend, _, _ in answers}) < 2:
            answers.append(await readiness(url))  # the kernel spreads connections over both
        assert all(status == 503 for _, status, _ in answers), answers
        others = [message for frontend, _, message in answers if frontend != drained]
        assert others, answers
        assert all(f"[{drained}]" in m or "draining" in m for m in others), others
        # the drained front end answered once it had told the others over the host's channel
        refusals = await from_both(lambda: attempt(url, "c", "pierre"))
        assert all(refusal == (503, "not_ready") for refusal in refusals), refusals
        # out of the ring: no worker serves the French model, and w1 never speaks its voices
        await asyncio.to_thread(wait_until, lambda: "fr" not in members(fleet), 10)
        status, worker, answer, retry = await gateway_speaks(fleet, "pierre", "Bonjour.")
        assert (status, worker) == (503, None) and retry and int(retry) >= 1, answer
        error = json.loads(answer)["error"]
        assert error["code"] == "model_unavailable" and FRENCH_MODEL in error["message"], error

        async def load() -> tuple[str, int]:
            async with connection() as client:
                async with client.get(url + "/internal/load", headers=internal) as response:
                    answer = await response.json()
                    assert answer["draining"] is True
                    return response.headers[FRONTEND_HEADER], answer["active_streams"]

        assert set(await from_both(load, least=2)) == {3}  # the host's three, on either
        os.kill(frontends.process.pid, signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert await raw.content.readany()  # draining: the streams play on
        assert frontends.process.poll() is None
        await ws.send_json({"type": "text", "text": LONG_TEXT})  # more for the socket to say
        await ws.send_json({"type": "end"})
        (core,) = [p for p in tree if is_engine_core(p)]
        core.kill()
        # each ends within the session's timeout (a TimeoutError fails the test): with the
        # error, or whole if its speech had already ended; never cut without a word
        with contextlib.suppress(aiohttp.ClientPayloadError):
            await raw.read()
        events = [
            json.loads(line[len("data: ") :])
            for line in (await sse.text()).splitlines()
            if line.startswith("data: ")
        ]
        last = [event["type"] for event in events][-1]
        assert last in ("error", "speech.audio.done"), events[-3:]
        if last == "error":
            assert events[-1]["error"]["code"] == "synthesis_failed", events[-1]
        said = []
        while (message := await ws.receive(timeout=60)).type in (
            aiohttp.WSMsgType.BINARY,
            aiohttp.WSMsgType.TEXT,
        ):
            if message.type == aiohttp.WSMsgType.TEXT:
                said.append(json.loads(message.data))
        # the socket's last text was sent after the drain, before the core died: never spoken
        assert said and said[-1]["type"] == "error", said[-3:]
        print(f"after the core's death: SSE ended with {last}, the socket with {said[-1]}")
    code = await asyncio.to_thread(frontends.process.wait, 60)
    assert code != 0  # a host without its engine core is not a clean exit
    gone = await asyncio.to_thread(wait_until, lambda: not alive(tree), 30)
    print(f"{len(tree)} processes of the host were gone {gone:.2f} s after its core died")


# --- the keyed host (w1) ---------------------------------------------------------------------


async def test_both_front_ends_speak_from_one_engine_core(frontends):
    tree = process_tree(frontends.process.pid)
    names = [p.name() for p in tree]
    assert sum("EngineCore" in n for n in names) == 1, names  # one core for the host
    sizes = await from_both(lambda: speak(frontends.url, "Hi.", 1), least=4, parallel=QUOTA)
    assert all(size > 0 for size in sizes), sizes
    encoding = encoding_processes(frontends.process.pid)
    assert sorted(is_frontend(p.parent()) for p in encoding) == [True, True], encoding
    assert len({p.parent().pid for p in encoding}) == 2  # one each
    mp3 = lambda: speak(frontends.url, "Hi.", 1, fmt="mp3")  # noqa: E731
    samples = await from_both(mp3, least=4, parallel=QUOTA)
    assert all(count > 0 for count in samples), samples


async def test_a_forced_aligner_from_a_folder_times_the_words_of_both_front_ends(frontends):
    """``VOICEHOST_ALIGNER_MODEL``: SSE's words and the captioned endpoint's are the CTC
    model's, from either front end; spans in the text, times within the audio, in order."""
    text = "It costs $42.50, Dr. Smith said. Then he left."
    body = {"input": text, "voice": "dev-a", "response_format": "pcm", "seed": 2}

    async def sse() -> tuple[str, tuple[list[dict], int]]:
        async with connection() as http:
            timed = {**body, "stream_format": "sse", "timestamps": "word"}
            async with http.post(url + SPEECH, json=timed, headers=auth("a")) as response:
                assert response.status == 200, await response.text()
                lines = (await response.read()).decode().splitlines()
                events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
                words = [e for e in events if e["type"] == "speech.word"]
                return response.headers[FRONTEND_HEADER], (words, events[-1]["samples"])

    url = frontends.url
    for words, samples in await from_both(sse, least=2, parallel=QUOTA):
        assert {w["aligner"] for w in words} == {"ctc:tiny-ctc"}
        assert [text[w["start"] : w["end"]] for w in words] == text.split()
        ends = [w["audio_end"] for w in words]
        assert ends == sorted(ends) and ends[-1] * 24000 <= samples + 24
    async with connection() as http:
        captioned = SPEECH + "/captioned"
        async with http.post(url + captioned, json=body, headers=auth("a")) as response:
            answer = await response.json()
    assert answer["aligner"] == "ctc:tiny-ctc"
    assert [text[w["start"] : w["end"]] for w in answer["words"]] == text.split()


async def test_an_encoding_process_lost_mid_stream_ends_its_stream_then_is_replaced(frontends):
    """The encoding processes are killed while an mp3 SSE stream plays: the stream ends with
    an ``encoding_failed`` error event (not cut, not hung), the front ends stay up, and the
    next mp3 streams, from both, are whole (a new encoding process each)."""
    url = frontends.url
    body = {"input": LONG_TEXT, "voice": "dev-b", "response_format": "mp3", "seed": 7}
    body["stream_format"] = "sse"  # open_stream's: speech that goes on for seconds
    before = encoding_processes(frontends.process.pid)
    async with connection() as http:
        async with http.post(url + SPEECH, json=body, headers=auth("b")) as response:
            assert response.status == 200, await response.text()
            first = await response.content.readline()
            assert json.loads(first.removeprefix(b"data: "))["type"] == "speech.audio.delta"
            for process in before:
                process.kill()
            events = [
                json.loads(line.removeprefix(b"data: "))
                async for line in response.content
                if line.startswith(b"data: ")
            ]
    assert events and events[-1]["type"] == "error", [e["type"] for e in events]
    assert events[-1]["error"]["code"] == "encoding_failed"
    samples = await from_both(lambda: speak(url, "Hi.", 2, fmt="mp3"), least=4, parallel=QUOTA)
    assert all(count > 0 for count in samples), samples
    after = encoding_processes(frontends.process.pid)
    assert len(after) == 2 and not {p.pid for p in after} & {p.pid for p in before}
    errors = await from_both(lambda: host_metric(url, "voicehost_stream_errors_total"))
    assert all(count >= 1 for count in errors), errors


async def open_stream(
    http: aiohttp.ClientSession, url: str, key: str, fmt: str = "pcm"
) -> aiohttp.ClientResponse:
    """A speech stream that has started playing (its first bytes are in), left open."""
    body = {"input": LONG_TEXT, "voice": "dev-b", "response_format": fmt, "seed": 7}
    response = await http.post(url + SPEECH, json=body, headers=auth(key))
    assert response.status == 200, await response.text()
    assert await response.content.readany()
    return response


async def attempt(url: str, key: str, voice: str = "dev-b") -> tuple[str, tuple[int, str]]:
    """A speech request expected to be refused: its front end, status and error code."""
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm"}
    async with connection() as http:
        async with http.post(url + SPEECH, json=body, headers=auth(key)) as response:
            code = (await response.json())["error"]["code"] if response.status != 200 else ""
            return response.headers[FRONTEND_HEADER], (response.status, code)


async def host_metric(url: str, name: str) -> tuple[str, float]:
    """A metric as one front end renders it (to the admin: metrics are private here): the
    front end, and the sum of its series."""
    async with connection() as http:
        async with http.get(url + "/metrics", headers=auth("admin")) as response:
            text = await response.text()
            frontend = response.headers[FRONTEND_HEADER]
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    ]
    assert values, f"{name} not in /metrics"
    return frontend, sum(values)


async def test_the_capacity_and_a_keys_quota_count_the_streams_of_both_front_ends(frontends):
    """Keys a and b hold their quotas (2 streams each): the host's capacity of 4. Every front
    end then refuses key a with 429 and key c with 503, whichever holds the streams: with
    counts of its own, a front end holding fewer would admit them. ``/metrics`` on either says
    4 streams. Once the streams end, both admit again."""
    url = frontends.url
    async with connection() as http:
        held = [await open_stream(http, url, key) for key in ("a", "a", "b", "b")]
        try:
            holders = sorted(r.headers[FRONTEND_HEADER] for r in held)
            over = await from_both(lambda: attempt(url, "a"))
            assert all(a == (429, "quota_exceeded") for a in over), over
            full = await from_both(lambda: attempt(url, "c"))
            assert all(a == (503, "at_capacity") for a in full), full
            streams = await from_both(lambda: host_metric(url, "voicehost_active_streams"))
            assert all(v == CAPACITY for v in streams), (streams, holders)
        finally:
            for response in held:
                response.close()

    async def admitted() -> bool:
        answers = await from_both(lambda: attempt(url, "a"))
        return all(a == (200, "") for a in answers)

    # each check speaks with key a until both front ends have answered (8 requests or more, a
    # second or more each on a loaded machine), so the bound is the checks', not the release's
    deadline = time.monotonic() + 30
    while not await admitted():  # the closed streams are let go on both
        assert time.monotonic() < deadline, "the host did not admit key a again"
        await asyncio.sleep(0.2)


async def test_usage_and_metrics_from_either_front_end_count_the_whole_host(frontends):
    """Key c speaks over both front ends; ``/v1/usage`` from either counts every character
    once, and the streams counter on either is the host's."""
    url = frontends.url
    text = "Once."
    spoken = await from_both(lambda: speak(url, text, 3, key="c"), least=4, parallel=QUOTA)
    characters = len(text) * len(spoken)

    async def usage() -> tuple[str, object]:
        async with connection() as http:
            query = {"tenant": "globex"}
            async with http.get(url + "/v1/usage", params=query, headers=auth("admin")) as r:
                assert r.status == 200, await r.text()
                return r.headers[FRONTEND_HEADER], (await r.json())["total"]["characters"]

    deadline = time.monotonic() + 10
    while True:  # each front end adds its counts to the host's file within the flush interval
        counted = await from_both(usage)
        if all(c == characters for c in counted):
            break
        assert time.monotonic() < deadline, (counted, characters)
        await asyncio.sleep(0.3)
    segments = await from_both(lambda: host_metric(url, "voicehost_segments_total"))
    assert len(set(segments)) == 1, segments  # one figure for the host


async def test_both_front_ends_writing_at_once_keep_one_audit_chain(frontends):
    """Refusals for scope, 12 at once, over both front ends, each an audit event: the chain
    read back verifies against its head, every event once, seq unbroken."""
    url = frontends.url

    async def refused(index: int) -> tuple[str, str]:
        async with connection() as http:
            body = {"entries": [{"grapheme": "vh", "alias": "voice host"}]}
            async with http.put(
                url + f"/v1/lexicons/chain{index}", json=body, headers=auth("a")
            ) as response:
                assert response.status == 403, await response.text()
                return response.headers[FRONTEND_HEADER], response.headers[REQUEST_ID_HEADER]

    # waves of 12 at once until both front ends have written: one that wakes first may accept
    # a whole wave of connections from the shared socket
    writers: list[tuple[str, str]] = []
    for wave in range(8):
        writers += await asyncio.gather(*(refused(12 * wave + i) for i in range(12)))
        if len(writers) >= 24 and {frontend for frontend, _ in writers} == {"0", "1"}:
            break
    assert {frontend for frontend, _ in writers} == {"0", "1"}, writers
    events: list[dict] = []
    async with connection() as http:
        after = 0
        while True:
            params = {"after": str(after), "limit": "500"}
            async with http.get(url + "/v1/audit", params=params, headers=auth("admin")) as r:
                page = await r.json()
            events += page["events"]
            if page["next_after"] is None:
                break
            after = page["next_after"]
    head = Head(**page["head"])
    assert verify_events(events, head).ok, verify_events(events, head).reason
    logged = [e["request_id"] for e in events]
    assert all(logged.count(request) == 1 for _, request in writers), writers


async def test_a_webrtc_session_is_patched_and_ended_through_either_front_end(frontends):
    """Both front ends share the port, so a session's PATCH and DELETE may reach the one that
    does not hold it: that one asks the other over the host's channel and hands it over.
    Another key's request is 404 on both."""
    from aiortc import RTCPeerConnection

    url = frontends.url
    trickle = {**auth("a"), "Content-Type": "application/trickle-ice-sdpfrag"}
    fragment = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"

    async def open_session() -> tuple[RTCPeerConnection, str, str]:
        """A client's offer answered: its peer, the front end holding it, its location."""
        pc = RTCPeerConnection()
        pc.createDataChannel("voicehost")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        headers = {**auth("a"), "Content-Type": "application/sdp"}
        async with connection() as http:
            offer = pc.localDescription.sdp
            async with http.post(url + "/v1/audio/speech/webrtc", data=offer, headers=headers) as r:
                assert r.status == 201, await r.text()
                return pc, r.headers[FRONTEND_HEADER], r.headers["Location"]

    async def call(method: str, location: str, key: str = "a") -> tuple[str, int]:
        headers = {**trickle, **auth(key)}
        async with connection() as http:
            async with http.request(method, url + location, data=fragment, headers=headers) as r:
                return r.headers[FRONTEND_HEADER], r.status

    pc, _, location = await open_session()
    try:
        patched = await from_both(lambda: call("PATCH", location), least=2)
        assert set(patched) == {204}, patched  # from the holder and from the other
        assert set(await from_both(lambda: call("PATCH", location, "b"), least=2)) == {404}
        assert (await call("DELETE", location))[1] == 204
    finally:
        await pc.close()
    # a DELETE the other front end answers: the holder has ended its session when it answers
    for _ in range(12):  # each DELETE lands on either front end: sessions until one lands apart
        pc, holder, location = await open_session()
        try:
            answered_by, status = await call("DELETE", location)
            assert status == 204
            if answered_by != holder:
                break
        finally:
            await pc.close()
    assert answered_by != holder
    assert (await host_metric(url, "voicehost_webrtc_sessions"))[1] == 0  # no poll to wait for
    assert set(await from_both(lambda: call("DELETE", location), least=2)) == {404}


async def readiness(url: str) -> tuple[str, int, str]:
    async with connection() as http:
        async with http.get(url + "/readyz") as response:
            body = await response.json()
            message = body.get("error", {}).get("message", "")
            return response.headers[FRONTEND_HEADER], response.status, message


async def refused(http: aiohttp.ClientSession, url: str, key: str) -> tuple[int, str]:
    """Status and error code of a speech request expected to be refused at once."""
    body = {"input": "Hello there.", "voice": "dev-b"}
    async with http.post(url + SPEECH, json=body, headers=auth(key)) as response:
        error = (await response.json())["error"]
        assert int(response.headers["Retry-After"]) >= 1
        return response.status, error["code"]


async def refused_webrtc(url: str, key: str) -> str:
    """The code a WebRTC session gets when its stream cannot be admitted: its offer is answered
    (a pending offer is not counted as a stream), and the refusal comes on the data channel when
    its config arrives, as an error event, then the session's end."""
    from voicehost.client import ApiError, AsyncClient

    async with AsyncClient(url, api_key=KEYS[key]) as client:
        with pytest.raises(ApiError) as refusal:
            async with client.webrtc("dev-b"):
                pass
    assert refusal.value.status is None  # an event, not an HTTP answer
    return refusal.value.code


async def test_beyond_capacity_and_quota_streams_are_refused_at_once_with_retry_after(frontends):
    """Key a holds its quota (2): its third stream is 429 by HTTP and refused on WebRTC's data
    channel, though the host has room; key b's two streams fill the host (4): key c is 503 by
    HTTP and the socket's handshake and refused on WebRTC's channel, answered while the
    admitted streams play (no queue). A stream whose client leaves is let go at once, and the
    others play to their end meanwhile."""
    url = frontends.url
    async with aiohttp.ClientSession() as http:
        first = await open_stream(http, url, "a")
        second = await open_stream(http, url, "a")
        assert await refused(http, url, "a") == (429, "quota_exceeded")
        assert await refused_webrtc(url, "a") == "quota_exceeded"
        third = await open_stream(http, url, "b")
        fourth = await open_stream(http, url, "b")
        assert await refused(http, url, "c") == (503, "at_capacity")
        assert (await host_metric(url, "voicehost_active_streams"))[1] == CAPACITY
        assert await refused_webrtc(url, "c") == "at_capacity"
        with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
            await http.ws_connect(url + "/v1/audio/speech/ws", headers=auth("c"))
        assert handshake.value.status == 503
        first.close()
        deadline = time.monotonic() + 2
        while True:
            body = {"input": "Hi.", "voice": "dev-b", "response_format": "pcm"}
            async with http.post(url + SPEECH, json=body, headers=auth("c")) as response:
                if response.status == 200:
                    assert await response.read()
                    break
                assert response.status == 503 and time.monotonic() < deadline
            await asyncio.sleep(0.1)
        for admitted in (second, third, fourth):  # played to their end meanwhile
            assert await admitted.read() and admitted.status == 200
