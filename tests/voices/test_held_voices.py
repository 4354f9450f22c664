"""Held voices: a clone whose evaluation fell short exists only for its tenant and admins (listed
as held, spoken to listen), everyone else gets 404; its tenant or an admin publishes it, the
reason recorded in its voice.json, once. Real adapter folders on disk, and the shared server."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import aiohttp
import pytest

from voicehost.api.edge import find_voice
from voicehost.api.errors import kind_of
from voicehost.api.voices import voice_infos
from voicehost.tenancy.keys import Principal, can_see
from voicehost.voices.folders import FolderVoiceDirectory
from voicehost.voices.validation import (
    MANIFEST,
    AdapterRules,
    InvalidAdapter,
    assign_tenant,
    validate_adapter,
    weights_checksum,
)
from voicehost.voices.voice import NotHeld, VoiceNotFound

A = Principal("key-a", "A", frozenset({"synthesize", "voices"}))
B = Principal("key-b", "B", frozenset({"synthesize", "voices"}))
ADMIN = Principal("ops", "ops", frozenset({"admin"}))
HELD = {"status": "held", "held_reason": "speaker similarity 0.41 is below 0.75", "eval": {}}


def make_voice(root: Path, source: Path, voice_id: str, tenant: str | None, **manifest) -> Path:
    """A copy of a dev adapter as ``root/voice_id`` of ``tenant``, its voice.json updated."""
    folder = root / voice_id
    shutil.copytree(source, folder)
    data = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**data, **manifest}))
    assign_tenant(folder, tenant)
    return folder


@pytest.fixture
def folder_directory(dev_model, rules, tmp_path):
    """A folder voice directory of A's held voice, a held shared voice, A's ready voice, and the
    built-in ``tara``."""
    source = dev_model.adapters / "dev-a"
    make_voice(tmp_path, source, "a-held", "A", **HELD)
    make_voice(tmp_path, source, "shared-held", None, **HELD)
    make_voice(tmp_path, source, "a-ready", "A")
    found = FolderVoiceDirectory([tmp_path], ["tara"], rules)
    found.scan()
    return found


async def usable(directory, principal, voice_id) -> bool:
    try:
        await find_voice(directory, voice_id, principal)
    except VoiceNotFound as exc:
        assert (kind_of(exc).status, exc.code) == (404, "voice_not_found")
        return False
    return True


@pytest.mark.unit
def test_a_held_voice_is_seen_only_by_those_who_may_manage_it():
    assert can_see(A, "A", held=True) and can_see(ADMIN, "A", held=True)
    assert can_see(None, "A", held=True) and can_see(None, None, held=True)  # open mode
    assert not can_see(B, "A", held=True)
    assert not can_see(A, None, held=True) and can_see(ADMIN, None, held=True)  # shared: admins
    assert can_see(B, None) and not can_see(B, "A")  # ready voices: as before


@pytest.mark.unit
async def test_a_held_voice_is_listed_and_spoken_for_its_tenant_and_admins_only(folder_directory):
    assert folder_directory.get("a-held").status == "held"
    assert folder_directory.get("a-ready").status == "ready"
    listed = {}
    for name, principal in (("A", A), ("B", B), ("admin", ADMIN), ("open", None)):
        listed[name] = {v.id: v.status for v in await voice_infos(folder_directory, principal)}
    assert listed["A"] == {"a-held": "held", "a-ready": "ready", "tara": "ready"}
    assert listed["B"] == {"tara": "ready"}
    everything = {"a-held": "held", "shared-held": "held", "a-ready": "ready", "tara": "ready"}
    assert listed["admin"] == listed["open"] == everything
    for voice_id, who in (
        ("a-held", {"A", "admin", "open"}),
        ("shared-held", {"admin", "open"}),
        ("a-ready", {"A", "admin", "open"}),
    ):
        for name, principal in (("A", A), ("B", B), ("admin", ADMIN), ("open", None)):
            assert await usable(folder_directory, principal, voice_id) == (name in who), (
                voice_id,
                name,
            )


@pytest.mark.unit
async def test_publishing_makes_a_held_voice_ready_once_and_keeps_its_adapter(folder_directory):
    folder = folder_directory.get("a-held").adapter_path
    checksum, files = weights_checksum(folder), sorted(p.name for p in folder.iterdir())
    published = {"reason": "It sounds like her.", "by": "key-a", "at": "2026-12-01T10:00:00+00:00"}
    voice = await folder_directory.publish("a-held", published)
    assert voice.status == "ready" and voice.checksum == checksum == weights_checksum(folder)
    assert folder_directory.get("a-held").status == "ready"  # at once, not at the next scan
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "ready" and manifest["published"] == published
    assert manifest["held_reason"] == HELD["held_reason"] and manifest["tenant"] == "A"
    assert sorted(p.name for p in folder.iterdir()) == files  # replaced whole: no temp file left
    assert await usable(folder_directory, B, "a-held") is False  # A's still; ready now for A only
    with pytest.raises(NotHeld):
        await folder_directory.publish("a-held", published)
    with pytest.raises(NotHeld):
        await folder_directory.publish("a-ready", published)
    with pytest.raises(NotHeld):
        await folder_directory.publish("tara", published)
    assert await folder_directory.publish("nobody", published) is None


@pytest.mark.unit
def test_a_status_other_than_ready_or_held_makes_the_adapter_unusable(dev_model, tmp_path):
    folder = make_voice(tmp_path, dev_model.adapters / "dev-a", "typo", None, status="hold")
    with pytest.raises(InvalidAdapter, match="status must be one of ready, held"):
        validate_adapter(folder, AdapterRules("voicehost-dev", 16))


# --- over HTTP, on the shared (open) server ------------------------------------------------------


async def test_publish_over_http_makes_a_held_voice_ready_and_records_why(server, dev_model):
    voice_id = f"held-{uuid.uuid4().hex[:8]}"
    folder = make_voice(server.adapters, dev_model.adapters / "dev-c", voice_id, None, **HELD)
    url = f"{server.url}/v1/voices/{voice_id}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as response:  # found at once: the folder is new
            assert response.status == 200
            assert (await response.json())["voice"]["manifest"]["status"] == "held"
        async with http.get(server.url + "/v1/audio/voices") as response:
            voices = {v["id"]: v for v in (await response.json())["voices"]}
        assert voices[voice_id]["status"] == "held"
        for body in ({}, {"reason": ""}, {"reason": "   "}, {"reason": 1}, {"why": "x"}):
            async with http.post(url + "/publish", json=body) as response:
                assert response.status == 400, body
                assert (await response.json())["error"]["code"] == "invalid_request"
        reason = "Listened to it: it is her."
        async with http.post(url + "/publish", json={"reason": reason}) as response:
            assert response.status == 200
            manifest = (await response.json())["voice"]["manifest"]
        assert manifest["status"] == "ready" and manifest["published"]["reason"] == reason
        async with http.get(server.url + "/v1/audio/voices") as response:
            voices = {v["id"]: v for v in (await response.json())["voices"]}
        assert voices[voice_id]["status"] == "ready"
        for voice in (voice_id, "dev-a", "tara"):
            async with http.post(
                f"{server.url}/v1/voices/{voice}/publish", json={"reason": reason}
            ) as response:
                assert response.status == 409, voice
                assert (await response.json())["error"]["code"] == "voice_not_held"
        async with http.post(
            f"{server.url}/v1/voices/nobody-{voice_id}/publish", json={"reason": reason}
        ) as response:
            assert response.status == 404
    on_disk = json.loads((folder / MANIFEST).read_text())
    assert on_disk["status"] == "ready"
    assert on_disk["published"]["reason"] == reason and on_disk["published"]["by"] is None
    assert on_disk["published"]["at"].endswith("+00:00")
