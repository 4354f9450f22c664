"""The audit trail and usage: the hash chain and its verification, the JSONL log written by two
writers, ``voicehost audit verify`` on a damaged copy, the usage ledger (unit); then every voice
and job route of the shared dev server writing its event, over real HTTP."""

import asyncio
import json
import shutil

import aiohttp
import pytest
from helpers import adapter_form, job_spec, no_directory

from voicehost.api.audit import parse_time
from voicehost.api.edge import ApiError
from voicehost.cli import main
from voicehost.cloning.jobs import CloneJobs
from voicehost.cluster.audit import RedisAuditTrail
from voicehost.cluster.state import connect
from voicehost.config import Settings
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.tenancy.audit import (
    GENESIS,
    OPERATOR,
    AuditLog,
    AuditQuery,
    Change,
    FileAuditTrail,
    Head,
    actor_of,
    canonical,
    line_hash,
    verify,
    verify_events,
)
from voicehost.tenancy.keys import Principal
from voicehost.tenancy.usage import FileUsageStore, UsageKey, UsageLedger
from voicehost.voices.validation import MANIFEST, assign_tenant

A = Principal("a", "A", frozenset({"voices"}))
B = Principal("b", "B", frozenset({"voices"}))


def changes(count: int, tenant: str | None = "A") -> list[Change]:
    return [
        Change("voice.created", actor_of(A), tenant, f"voice-{i}", details={"i": i})
        for i in range(count)
    ]


def write_log(path, count: int = 6) -> list[str]:
    AuditLog(path).append(changes(count))
    return path.read_text().splitlines()


# --- the chain ---------------------------------------------------------------------------------


@pytest.mark.unit
def test_each_line_carries_the_sha256_of_the_one_before(tmp_path):
    lines = write_log(tmp_path / "audit.jsonl", 4)
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert events[0]["prev"] == GENESIS
    for before, event in zip(lines, events[1:], strict=False):
        assert event["prev"] == line_hash(before)
    assert all(canonical(e) == line for e, line in zip(events, lines, strict=True))
    assert events[0]["actor"] == {"kind": "key", "key_id": "a", "tenant": "A"}
    result = verify(lines)
    assert result.ok and result.lines == 4 and result.head == Head(4, line_hash(lines[-1]))
    assert AuditLog(tmp_path / "audit.jsonl").head() == result.head


@pytest.mark.unit
@pytest.mark.parametrize(
    "damage, broken_at, says",
    [
        (
            lambda lines: [*lines[:2], lines[2].replace("voice-2", "voice-9"), *lines[3:]],
            4,
            "edited",
        ),
        (lambda lines: lines[:2] + lines[3:], 3, "removed"),
        (lambda lines: [*lines[:1], lines[1][:-1], *lines[2:]], 2, "not an event"),
        (lambda lines: [lines[1], lines[0], *lines[2:]], 1, "the first line"),
    ],
    ids=["edited", "removed", "cut", "swapped"],
)
def test_an_edited_removed_or_reordered_line_breaks_the_chain_where_it_is(
    tmp_path, damage, broken_at, says
):
    result = verify(damage(write_log(tmp_path / "audit.jsonl")))
    assert not result.ok and result.broken_at == broken_at and says in result.reason
    assert result.lines == broken_at - 1  # the whole chain before it


@pytest.mark.unit
def test_the_last_line_is_checked_against_the_writers_head(tmp_path):
    lines = write_log(tmp_path / "audit.jsonl", 3)
    head = verify(lines).head
    assert verify(lines[:-1], head).broken_at == 3  # the last line removed
    edited = [*lines[:-1], lines[-1].replace("voice-2", "voice-7")]
    assert verify(edited, head).broken_at == 3 and "head" in verify(edited, head).reason
    events = [json.loads(line) for line in lines]
    assert verify_events(events, head).ok  # read back as JSON, they are their lines again


@pytest.mark.unit
def test_two_writers_of_one_file_keep_one_chain(tmp_path):
    """The server and the CLI may both append: each append reads the file's last line under
    the file lock."""
    path = tmp_path / "audit.jsonl"
    server, cli = AuditLog(path), AuditLog(path)
    for i in range(5):
        (server if i % 2 else cli).append([Change("voice.deleted", OPERATOR, voice=f"v{i}")])
    result = verify(path.read_text().splitlines())
    assert result.ok and result.head.seq == 5


@pytest.mark.unit
def test_a_mirror_takes_only_the_lines_that_continue_its_chain(tmp_path):
    source = write_log(tmp_path / "redis.jsonl", 5)
    mirror = AuditLog(tmp_path / "mirror.jsonl")
    assert mirror.extend(source[:2]) == verify(source[:2]).head
    assert mirror.extend(source[1:3]).seq == 3  # seq 2 again is skipped
    assert mirror.extend(source[4:]).seq == 3  # a gap: waits for seq 4
    assert mirror.extend(source).seq == 5
    assert mirror.path.read_text().splitlines() == source


@pytest.mark.unit
def test_a_tenant_reads_only_its_own_voices_events(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append([*changes(3, "A"), *changes(2, "B"), *changes(1, None)])
    mine = log.read(AuditQuery(tenant="A", all_tenants=False))
    assert [e["tenant"] for e in mine.events] == ["A"] * 3
    assert len(log.read(AuditQuery()).events) == 6  # an admin: all, shared ones included
    page = log.read(AuditQuery(limit=2, after=1))
    assert [e["seq"] for e in page.events] == [2, 3] and page.more
    assert [e["seq"] for e in log.read(AuditQuery(voice="voice-1")).events] == [2, 5]


@pytest.mark.unit
async def test_a_trail_that_cannot_write_keeps_its_events_and_writes_them_later(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the log's folder should be")
    trail = FileAuditTrail(blocked / "audit.jsonl")
    await trail.record(changes(1)[0])
    blocked.unlink()
    await trail.record(changes(2)[1])
    events = (await trail.read(AuditQuery())).events
    assert [e["voice"] for e in events] == ["voice-0", "voice-1"]


@pytest.mark.unit
def test_audit_verify_says_where_a_copy_of_the_log_was_edited(tmp_path, capsys):
    path = tmp_path / "audit.jsonl"
    lines = write_log(path, 5)
    assert main(["audit", "verify", "--path", str(path)]) == 0
    assert "5 events, chain whole" in capsys.readouterr().out
    damaged = tmp_path / "damaged.jsonl"
    shutil.copy(path, damaged)
    damaged.write_text("\n".join([*lines[:1], *lines[2:]]) + "\n")
    assert main(["audit", "verify", "--path", str(damaged)]) == 1
    out = capsys.readouterr().out
    assert f"{damaged}: BROKEN at line 2" in out and "removed" in out
    assert main(["audit", "verify", "--path", str(tmp_path / "none.jsonl")]) == 2


# --- the usage ledger --------------------------------------------------------------------------


@pytest.mark.unit
async def test_usage_counts_what_was_sent_per_key_tenant_and_voice(tmp_path):
    store = FileUsageStore(tmp_path / "usage.jsonl")
    ledger = UsageLedger(store, None)
    tally = ledger.tally(A, "anna")
    tally.segment("Hello there.")
    tally.sent(SAMPLE_RATE // 2)
    tally.sent(SAMPLE_RATE // 4)  # the segment's characters count once, with its first audio
    tally.segment("Unsent.")  # started, but no audio of it went out: not counted
    ledger.tally(B, "anna").sent(SAMPLE_RATE)
    ledger.tally(None, "tara").sent(SAMPLE_RATE * 2)
    totals = await ledger.totals(0, None)
    assert totals[UsageKey("a", "A", "anna")].characters == len("Hello there.")
    assert totals[UsageKey("a", "A", "anna")].audio_seconds == pytest.approx(0.75)
    assert totals[UsageKey("", "", "tara")].audio_seconds == pytest.approx(2.0)
    assert set(await ledger.totals(0, "B")) == {UsageKey("b", "B", "anna")}
    tally.sent(SAMPLE_RATE)
    await asyncio.gather(ledger.flush(), ledger.flush())
    again = await FileUsageStore(store.path).totals(0, "A")  # read back from the file
    assert again[UsageKey("a", "A", "anna")].audio_seconds == pytest.approx(1.75)
    assert again[UsageKey("a", "A", "anna")].characters == len("Hello there.Unsent.")


# --- every voice route of the shared server writes its event -----------------------------------

HELD = {"status": "held", "held_reason": "speaker similarity 0.41 is below 0.75", "eval": {}}


def make_voice(root, source, voice_id, tenant, **manifest):
    """A copy of a dev adapter dropped in as ``root/voice_id``, its voice.json updated."""
    folder = root / voice_id
    shutil.copytree(source, folder)
    data = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**data, **manifest}))
    assign_tenant(folder, tenant)
    return folder


async def events_of(http, url, voice):
    async with http.get(f"{url}/v1/audit", params={"voice": voice}) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["events"]


async def test_every_route_that_changes_a_voice_or_job_writes_its_event(server, dev_model):
    """Register, publish (a held voice an operator dropped in) and delete voices; cancel and
    delete a job: each writes one event, chained, with the caller and the request's id."""
    url, root = server.url, server.adapters.parent
    make_voice(server.adapters, dev_model.adapters / "dev-a", "audited-held", None, **HELD)
    jobs = CloneJobs(root / "jobs", on_voice_ready=no_directory)  # the server's jobs folder
    job_id, _ = jobs.new_job_dir()
    await jobs.submit(job_id, job_spec(root / "jobs", job_id, dev_model), tenant=None)
    async with aiohttp.ClientSession(headers={"X-Request-Id": "req-audit-1"}) as http:
        async with http.post(url + "/v1/voices", data=adapter_form(dev_model, "audited")) as r:
            assert r.status == 201, await r.text()
            assert r.headers["X-Request-Id"] == "req-audit-1"
        publish = {"reason": "heard it"}
        async with http.post(url + "/v1/voices/audited-held/publish", json=publish) as r:
            assert r.status == 200, await r.text()
        for voice in ("audited", "audited-held"):
            async with http.delete(f"{url}/v1/voices/{voice}") as r:
                assert r.status == 204
        async with http.delete(f"{url}/v1/jobs/{job_id}") as r:  # cancel it
            assert r.status == 200, await r.text()
        for _ in range(100):  # then delete it: the runner may have started it (it polls the
            async with http.delete(f"{url}/v1/jobs/{job_id}") as r:  # folder), 409 while its
                if r.status != 409:  # worker stops, as the answer says: try again
                    break
            await asyncio.sleep(0.1)
        assert r.status == 204, await r.text()
        created, deleted = await events_of(http, url, "audited")
        published, held_deleted = await events_of(http, url, "audited-held")
        async with http.get(url + "/v1/audit", params={"limit": 1000}) as r:
            page = await r.json()
    assert (created["action"], deleted["action"]) == ("voice.created", "voice.deleted")
    assert created["actor"] == {"kind": "open"} and created["request_id"] == "req-audit-1"
    assert created["details"]["source"] == "adapter"
    assert published["action"] == "voice.published"
    assert published["details"]["reason"] == "heard it" and held_deleted["action"] == (
        "voice.deleted"
    )
    job_events = [(e["action"], e["job"]) for e in page["events"] if e["job"] == job_id]
    assert job_events == [("job.cancelled", job_id), ("job.deleted", job_id)]
    mine = [e for e in page["events"] if e["request_id"] == "req-audit-1"]
    assert len(mine) == 6  # the job's two, and the voices' four
    log = root / "audit.jsonl"  # in the data folder, beside the voices
    written = log.read_text().splitlines()
    assert verify(written).ok and verify(written).head == Head(**page["head"])
    assert [json.loads(line) for line in written][-len(mine) :] == mine  # each event, as written


# --- a cluster's chain, on a Redis of its own --------------------------------------------------


async def test_processes_sharing_redis_keep_one_chain_through_a_flush_and_an_outage(
    redis_server, tmp_path
):
    """Three processes' trails (gateways, workers) appending at once make one chain, in the
    shared store's mirror as in the stream; after FLUSHALL the chain goes on from the mirror;
    while Redis is down an event waits, and is appended once it is back. Its own Redis (cheap,
    no engine): the cluster module's tests run in an order this cannot wait for."""
    settings = Settings(redis_url=redis_server.url, redis_retries=0, redis_timeout_seconds=0.2)
    mirror = tmp_path / "shared" / "audit" / "audit.jsonl"
    clients = [connect(settings) for _ in range(3)]
    trails = [RedisAuditTrail(client, mirror) for client in clients]
    try:
        await asyncio.gather(
            *(trail.record(change) for trail, change in zip(trails * 4, changes(12), strict=True))
        )
        lines = mirror.read_text().splitlines()
        assert verify(lines).ok and verify(lines).head.seq == 12
        stream = redis_server.client().xrange("vh:audit")
        assert [fields["line"] for _, fields in stream] == lines
        assert sorted(json.loads(line)["voice"] for line in lines) == sorted(
            f"voice-{i}" for i in range(12)
        )
        redis_server.client().flushall()
        await trails[1].record(changes(13)[12])
        lines = mirror.read_text().splitlines()
        assert verify(lines).ok and verify(lines).head.seq == 13
        assert redis_server.client().xrange("vh:audit")[0][0] == "13-0"  # resumed from the mirror
        redis_server.stop()
        await trails[2].record(Change("job.failed", OPERATOR, job="job-x"))  # does not raise
        assert len(mirror.read_text().splitlines()) == 13
        redis_server.start()
        await trails[2].record(Change("job.done", OPERATOR, job="job-y"))
        events = [json.loads(line) for line in mirror.read_text().splitlines()]
        assert [e["job"] for e in events[-2:]] == ["job-x", "job-y"] and verify(
            mirror.read_text().splitlines()
        ).ok
        page = await trails[0].read(AuditQuery(after=12))
        assert [e["seq"] for e in page.events] == [13, 14, 15]
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00+00:00"),
        ("2026-12-01T10:00:00", "2026-12-01T10:00:00+00:00"),  # no zone: UTC
        ("2026-12-01T11:30:00+01:30", "2026-12-01T10:00:00+00:00"),
        ("2026-12-01", "2026-12-01T00:00:00+00:00"),
        ("1796119200", "2026-12-01T10:00:00+00:00"),  # Unix seconds
        ("1796119200.5", "2026-12-01T10:00:00.500000+00:00"),
    ],
)
def test_since_is_an_iso_8601_time_or_unix_seconds(value, expected):
    """What ``since`` of ``/v1/audit`` and ``/v1/usage`` takes (the schemathesis run cannot
    make valid ISO dates from the document: test_openapi says so by name)."""
    from datetime import UTC

    assert parse_time(value).astimezone(UTC).isoformat() == expected


@pytest.mark.unit
@pytest.mark.parametrize("value", ["2026-02-30", "yesterday", "-5", "1e12", "nan", "2026-13-01"])
def test_a_since_that_is_no_time_is_400(value):
    with pytest.raises(ApiError) as refused:
        parse_time(value)
    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
