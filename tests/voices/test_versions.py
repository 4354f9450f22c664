"""Voice versions and consent records: the version model on disk (unit tests over a real
adapter folder), and through the shared dev server over real HTTP: two adapter versions of one
voice, pins, the version header, promotion and rollback, deleting versions, and the consent
record and recording of a clone (espeak-ng speakers stand in for people)."""

import json
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from helpers import adapter_parts, audio_form, read_socket, same_audio

from voicehost.ids import split_voice_ref, voice_ref
from voicehost.tools.devcorpus import build_corpus, speak
from voicehost.voices.folders import LIVE, FolderVoiceDirectory
from voicehost.voices.validation import (
    ADAPTER_WEIGHTS,
    MANIFEST,
    AdapterRules,
    weights_checksum,
)
from voicehost.voices.versioning import (
    first_promotion,
    new_version_manifest,
    newest_version,
    next_version,
    refuse_duplicate,
    removable,
    version_status,
)
from voicehost.voices.voice import DuplicateVersion, HeldVersion, LiveVersion, NoSuchVersion

RULES = AdapterRules(base_model="voicehost-dev", max_rank=16)
OTHER_VOICE = "en-us+f3"  # a woman's voice; build_corpus speaks espeak-ng's default man's
CONSENT = {
    "speaker_name": "Dev Speaker",
    "statement": "I agree that my voice is cloned for the voicehost tests.",
    "collected_by": "test suite",
    "collected_at": "2026-12-01T10:00:00+00:00",
    "purpose": "testing the consent check",
}


def stage(dev_model, source: str, folder, **manifest):
    """A copy of the dev adapter ``source`` at ``folder``, its manifest updated."""
    shutil.copytree(dev_model.adapters / source, folder)
    data = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**data, **manifest}))
    return folder


# --- the model: refs, statuses, folders ---------------------------------------------------------


@pytest.mark.unit
def test_a_voice_ref_names_the_live_version_or_pins_one():
    assert split_voice_ref("anna") == ("anna", None)
    assert split_voice_ref("anna@3") == ("anna", 3)
    assert split_voice_ref("anna@0") == ("anna@0", None)  # not a version: the id is refused
    assert split_voice_ref("anna@x") == ("anna@x", None)
    assert split_voice_ref("a@b@2") == ("a@b", 2)
    assert voice_ref("anna", 3) == "anna@3" and voice_ref("anna", None) == "anna"
    assert split_voice_ref(voice_ref("anna", 12)) == ("anna", 12)


@pytest.mark.unit
def test_a_version_is_listed_by_its_gate_and_whether_it_is_or_was_live():
    assert version_status("held", True, True) == "held"
    assert version_status("ready", True, False) == "ready"
    assert version_status("ready", False, True) == "retired"
    assert version_status("ready", False, False) == "candidate"


@pytest.mark.unit
def test_the_versioning_rules_both_directories_decide_with():
    """Numbers are never reused, a duplicate adapter and the live version are refused, a new
    version is its voice's tenant's, only a ready one goes live, and a first promotion is dated
    once."""
    assert newest_version(2, None) == 2 and newest_version(2, 5) == 5
    assert next_version(newest_version(1, 3)) == 4  # version 3 deleted: 4 still comes next
    with pytest.raises(DuplicateVersion, match="'anna' has a version with this adapter"):
        refuse_duplicate("anna", "c2", ["c1", None, "c2"])
    refuse_duplicate("anna", "c3", ["c1", None, "c2"])
    with pytest.raises(LiveVersion, match="version 2 is the live version of 'anna'"):
        removable("anna", 2, 2, exists=True)
    assert removable("anna", 1, 2, exists=True) and not removable("anna", 3, 2, exists=False)

    staged = {"name": "Anna", "tenant": "evil", "version": 1}
    manifest, live = new_version_manifest(staged, 3, "acme", promote=True)
    assert live and manifest["tenant"] == "acme" and manifest["version"] == 3
    assert "promoted_at" in manifest and first_promotion(manifest) is None
    held, live = new_version_manifest({**staged, "status": "held"}, 4, None, promote=True)
    assert not live and "tenant" not in held and "promoted_at" not in held
    assert set(first_promotion(held)) == {*held, "promoted_at"}


@pytest.mark.unit
async def test_a_one_adapter_folder_is_version_1_and_becomes_versioned_on_its_second(
    tmp_path, dev_model
):
    """A voice folder as they were before versions (adapter files at its top) is read as
    version 1; adding a version moves it under versions/1 and switches the live pointer in one
    rename; promotion switches it back; the live one cannot be deleted."""
    root = tmp_path / "adapters"
    legacy = stage(dev_model, "dev-a", root / "anna", tenant="acme")
    directory = FolderVoiceDirectory([root], [], RULES)
    directory.scan()
    first = await directory.find("anna")
    assert first.version == 1 and first.adapter_path == legacy
    assert [(v.version, v.status, v.live) for v in await directory.versions("anna")] == [
        (1, "ready", True)
    ]
    assert await directory.find("anna", 1) == first and await directory.find("anna", 2) is None

    second = await directory.add_version(
        "anna", stage(dev_model, "dev-c", tmp_path / "up", tenant="evil"), promote=True
    )
    assert second.version == 2 and second.tenant == "acme"  # the voice's tenant, always
    assert json.loads((legacy / LIVE).read_text()) == {"live": 2, "newest": 2}
    assert not (legacy / ADAPTER_WEIGHTS).exists()  # moved under versions/1
    assert (await directory.find("anna")).checksum == weights_checksum(dev_model.adapters / "dev-c")
    assert (await directory.find("anna", 1)).checksum == first.checksum  # still servable
    listed = [(v.version, v.status, v.live) for v in await directory.versions("anna")]
    assert listed == [(1, "retired", False), (2, "ready", True)]

    with pytest.raises(LiveVersion):
        await directory.remove_version("anna", 2)
    rolled_back = await directory.promote("anna", 1)
    assert rolled_back.checksum == first.checksum
    assert (await directory.find("anna")).version == 1
    # a fresh directory (a restart) reads the same
    again = FolderVoiceDirectory([root], [], RULES)
    again.scan()
    assert (await again.find("anna")).version == 1 and (await again.find("anna", 2)) is not None

    third = await directory.add_version(
        "anna", stage(dev_model, "dev-b", tmp_path / "up3"), promote=False
    )
    assert third.version == 3 and (await directory.find("anna")).version == 1
    assert (await directory.versions("anna"))[2].status == "candidate"
    assert await directory.remove_version("anna", 2)
    assert await directory.find("anna", 2) is None
    assert [v.version for v in await directory.versions("anna")] == [1, 3]
    with pytest.raises(NoSuchVersion):
        await directory.promote("anna", 2)
    held = await directory.add_version(
        "anna", stage(dev_model, "dev-c", tmp_path / "up4", status="held"), promote=True
    )
    assert held.version == 4 and (await directory.find("anna")).version == 1  # held: not live
    with pytest.raises(HeldVersion):
        await directory.promote("anna", 4)
    assert await directory.remove("anna") and not legacy.exists()


# --- through the dev server -----------------------------------------------------------------


async def spoken(http, server, voice: str) -> tuple[int, str | None, bytes]:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "seed": 1}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        audio = await response.read()
        return response.status, response.headers.get("X-Voicehost-Voice-Version"), audio


async def test_two_versions_of_one_voice_pins_promotion_and_deletion(server, dev_model):
    """A voice folder dropped in (version 1: dev-a's weights), then version 2 (dev-c's) added
    over HTTP: unpinned speech follows the live version, ``@n`` pins, every response names the
    version it spoke; a rollback is at once; the live version cannot be deleted (409)."""
    shutil.copytree(dev_model.adapters / "dev-a", server.adapters / "two-step")
    base = server.url + "/v1/voices/two-step"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/versions") as r:
            assert r.status == 200
            listed = await r.json()
        assert listed["live"] == 1 and [v["status"] for v in listed["versions"]] == ["ready"]
        form = adapter_parts(dev_model, "dev-c")
        async with http.post(base + "/versions", data=form) as r:
            assert r.status == 201, await r.text()
            added = (await r.json())["version"]
            assert r.headers["Location"] == "/v1/voices/two-step/versions/2"
        assert added["version"] == 2 and added["live"] and added["status"] == "ready"
        assert added["checksum"] == weights_checksum(dev_model.adapters / "dev-c")

        refs = ("two-step", "two-step@1", "two-step@2")
        answers = [await spoken(http, server, ref) for ref in refs]
        assert [(s, h) for s, h, _ in answers] == [(200, "2"), (200, "1"), (200, "2")]
        audio = [audio for _, _, audio in answers]  # seeded: each adapter's own audio
        assert not same_audio(audio[1], audio[2]), "precondition: the two adapters speak apart"
        assert same_audio(audio[0], audio[2])
        body = {"input": "Hi.", "voice": "tara"}
        async with http.post(server.url + "/v1/audio/speech", json=body) as r:
            assert r.headers["X-Voicehost-Voice-Version"] == "1"  # a built-in voice: version 1
        async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
            await ws.send_json({"type": "config", "voice": "two-step@1"})
            ready = json.loads((await ws.receive(timeout=30)).data)
            assert (ready["type"], ready["voice"], ready["version"]) == ("ready", "two-step", 1)
            await ws.send_json({"type": "end"})
            await read_socket(ws)

        async with http.delete(base + "/versions/2") as r:
            assert r.status == 409 and (await r.json())["error"]["code"] == "version_live"
        async with http.post(base + "/versions/1/promote") as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["version"]["live"] is True
        status, header, rolled_back = await spoken(http, server, "two-step")
        assert (status, header) == (200, "1") and same_audio(rolled_back, audio[1])
        async with http.get(base + "/versions") as r:
            listed = await r.json()
        assert [(v["version"], v["status"]) for v in listed["versions"]] == [
            (1, "ready"),
            (2, "retired"),
        ]
        for bad, code in (("/versions/0/promote", 400), ("/versions/9/promote", 404)):
            async with http.post(base + bad) as r:
                assert r.status == code, bad
        async with http.delete(base + "/versions/2") as r:
            assert r.status == 204
        status, _, _ = await spoken(http, server, "two-step@2")
        assert status == 404
        async with http.delete(base) as r:  # the voice: every version
            assert r.status == 204
        assert not (server.adapters / "two-step").exists()
        status, _, _ = await spoken(http, server, "two-step@1")
        assert status == 404
        async with http.get(server.url + "/v1/audit", params={"voice": "two-step"}) as r:
            events = [(e["action"], e["version"]) for e in (await r.json())["events"]]
        assert events == [  # each change once; the refused ones never
            ("voice.version_added", 2),
            ("voice.promoted", 2),
            ("voice.promoted", 1),
            ("voice.version_deleted", 2),
            ("voice.deleted", None),
        ]


@pytest.fixture(scope="module")
def consent_clips(tmp_path_factory):
    """Four clips of espeak-ng's default voice (the training audio), and the consent statement
    read by that voice and by another."""
    folder = tmp_path_factory.mktemp("consent")
    corpus = build_corpus(folder / "corpus", count=4)
    same, other = folder / "same.wav", folder / "other.wav"
    speak(CONSENT["statement"], same, 0.2, "wav")
    speak(CONSENT["statement"], other, 0.2, "wav", voice=OTHER_VOICE)
    return corpus, same, other


def over_the_phone(recording: Path) -> Path:
    """``recording`` as a telephone line carries it: 8 kHz mu-law, 300-3400 Hz."""
    phoned = recording.with_name(f"{recording.stem}-phone.wav")
    line = ["sox", str(recording), "-r", "8000", "-e", "u-law", str(phoned), "sinc", "300-3400"]
    subprocess.run(line, check=True)
    return phoned


def consent_form(corpus, recording=None, consent=CONSENT, **fields):
    form = audio_form(corpus.good, corpus.folder / "metadata.csv", **fields)
    if consent is not None:
        form.add_field("consent", json.dumps(consent))
    if recording is not None:
        form.add_field("consent_recording", recording.read_bytes(), filename=recording.name)
    return form


async def test_a_consent_recording_must_be_the_training_audios_speaker(server, consent_clips):
    """The statement read in another espeak-ng voice than the training audio is refused (422
    ``consent_speaker_mismatch``); the same voice passes the check (and then the upload goes on:
    here it has too little speech, 400, so that no job trains on the shared server)."""
    corpus, same, other = consent_clips
    async with aiohttp.ClientSession() as http:
        url = server.url + "/v1/voices"
        async with http.post(url, data=consent_form(corpus, other, name="Consent A")) as r:
            assert r.status == 422, await r.text()
            error = (await r.json())["error"]
        assert error["code"] == "consent_speaker_mismatch" and "similarity" in error["message"]
        async with http.post(url, data=consent_form(corpus, same, name="Consent B")) as r:
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["code"] == "not_enough_speech"  # past the check
        broken = {**CONSENT, "collected_at": "yesterday"}
        async with http.post(url, data=consent_form(corpus, consent=broken)) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_consent"
        async with http.post(url, data=consent_form(corpus, same, consent=None)) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "consent_required"
    assert not list(server.adapters.glob("consent-*"))


async def test_a_consent_read_into_a_phone_matches_its_speakers_clean_training_audio(
    server, consent_clips
):
    """The statement read over a telephone line (8 kHz, 300-3400 Hz) by the training audio's
    speaker passes the check: the clean clips are heard in the phone's band too (compared raw,
    its similarity is under the threshold). Read over the phone by another speaker, it is
    still refused."""
    corpus, same, other = consent_clips
    async with aiohttp.ClientSession() as http:
        url = server.url + "/v1/voices"
        form = consent_form(corpus, over_the_phone(same), name="Consent phone")
        async with http.post(url, data=form) as r:
            assert r.status == 400, await r.text()
            assert (await r.json())["error"]["code"] == "not_enough_speech"  # past the check
        form = consent_form(corpus, over_the_phone(other), name="Consent phone other")
        async with http.post(url, data=form) as r:
            assert r.status == 422, await r.text()
            assert (await r.json())["error"]["code"] == "consent_speaker_mismatch"
    assert not list(server.adapters.glob("consent-*"))
