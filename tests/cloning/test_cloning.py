"""Cloning over the API: upload audio -> job -> voice; adapters; bad uploads; job persistence."""

import asyncio
import json
import os
import time

import aiohttp
import pytest
from helpers import adapter_form, audio_form

from lora_training.recipe import VoiceJob
from voicehost.cloning.jobs import CloneJobs


async def error_code(response):
    body = await response.json()
    return body["error"]["code"]


async def wait_for_job(http, server, job_id, until):
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        async with http.get(f"{server.url}/v1/jobs/{job_id}") as response:
            job = (await response.json())["job"]
        seen.append(job)
        if job["status"] in until:
            return job, seen
        await asyncio.sleep(0.5)
    raise AssertionError(f"job stuck: {seen[-1]}")


async def test_an_upload_of_audio_is_queued_and_reports_its_data_before_training(
    http, server, corpus
):
    """The REST clone up to its training: 202 with the job's Location, queued for the voice,
    the data report in the job from the end of prepare on, then cancelled (the suite's one
    clone through the API to its end is the playground's recorded one, on the keyed host:
    test_auth; the training itself, test_training)."""
    form = audio_form(corpus.good, corpus.folder / "metadata.csv", name="Clone Test")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 202, await response.text()
        job = (await response.json())["job"]
        assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["voice_id"] == "clone-test" and job["status"] == "queued"
    training, seen = await wait_for_job(http, server, job["id"], {"training", "done", "failed"})
    assert training["status"] == "training", seen[-1]
    assert {s["status"] for s in seen} <= {"queued", "preparing", "training"}
    assert len(training["data"]["clips"]) == len(corpus.good) and training["data"]["warnings"]
    async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as response:
        assert response.status == 200
    cancelled, _ = await wait_for_job(http, server, job["id"], {"cancelled", "done", "failed"})
    assert cancelled["status"] == "cancelled"
    async with http.get(f"{server.url}/v1/voices/clone-test") as response:
        assert response.status == 404  # no voice from a cancelled job
    events = await job_events(http, server, job["id"], until="job.cancelled")
    assert events[0]["action"] == "job.created" and events[0]["actor"] == {"kind": "open"}


async def job_events(http, server, job_id, until, within=10.0):
    """The audit events of ``job_id`` once the last is ``until`` (a runner records a job's end
    just after its job.json says so)."""
    deadline = time.monotonic() + within
    while True:
        async with http.get(server.url + "/v1/audit", params={"limit": 1000}) as response:
            events = [e for e in (await response.json())["events"] if e["job"] == job_id]
        if events and events[-1]["action"] == until:
            return events
        assert time.monotonic() < deadline, events
        await asyncio.sleep(0.2)


async def test_a_file_posing_as_audio_is_415_and_nothing_is_kept(http, server, corpus):
    before = set(os.listdir(server.adapters.parent / "jobs"))
    form = audio_form([corpus.good[0], corpus.not_audio], name="Fake")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 415
        assert await error_code(response) == "not_audio"
    assert set(os.listdir(server.adapters.parent / "jobs")) == before


async def test_too_little_speech_is_400_with_how_much(http, server, corpus):
    form = audio_form(corpus.good[:2], corpus.folder / "metadata.csv", name="Short")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"]["code"] == "not_enough_speech"
    assert "found" in body["error"]["message"] and "30 s" in body["error"]["message"]


async def test_missing_transcripts_is_400(http, server, corpus):
    form = audio_form(corpus.good[:3], name="Untold")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 400
        assert await error_code(response) == "missing_transcripts"


async def test_an_oversized_upload_is_413(http, server):
    form = aiohttp.FormData()
    form.add_field("audio", os.urandom(21_000_000), filename="huge.wav")
    started = time.monotonic()
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 413
        assert await error_code(response) == "upload_too_large"
    assert time.monotonic() - started < 10


def spaced_form(corpus, **fields):
    """The corpus uploaded under file names with spaces, and a metadata.csv that uses them."""
    form = aiohttp.FormData()
    for key, value in fields.items():
        form.add_field(key, value)
    lines = []
    for path in corpus.good:
        form.add_field("audio", path.read_bytes(), filename=f"my {path.name}")
        lines.append(f"my {path.stem}|" + corpus.texts[path.stem])
    form.add_field("transcripts", "\n".join(lines).encode(), filename="metadata.csv")
    return form


async def test_a_job_can_be_cancelled_and_retried(http, server, corpus):
    form = spaced_form(corpus, voice_id="to-cancel")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        job = (await response.json())["job"]
    async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as response:
        assert response.status == 200
        assert (await response.json())["job"]["status"] == "cancelled"
    await asyncio.sleep(2)
    job, _ = await wait_for_job(http, server, job["id"], {"cancelled", "done", "failed"})
    assert job["status"] == "cancelled"
    pgrep = await asyncio.create_subprocess_exec(
        "pgrep", "-f", job["id"], stdout=asyncio.subprocess.PIPE
    )
    workers, _ = await pgrep.communicate()
    assert workers == b"", "the training process outlived its cancelled job"
    async with http.post(f"{server.url}/v1/jobs/{job['id']}/retry") as response:
        assert response.status == 202
        assert (await response.json())["job"]["status"] == "queued"
    async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as response:
        assert (await response.json())["job"]["status"] == "cancelled"
    async with http.get(server.url + "/v1/jobs/job-0000000000000000") as response:
        assert response.status == 404
    events = await job_events(http, server, job["id"], until="job.cancelled")
    assert [e["action"] for e in events] == [
        "job.created",
        "job.cancelled",
        "job.retried",
        "job.cancelled",
    ]


async def test_deleting_a_finished_job_removes_it_and_its_inputs(http, server, corpus):
    form = spaced_form(corpus, voice_id="to-delete")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        job = (await response.json())["job"]
    folder = server.adapters.parent / "jobs" / job["id"]
    assert (folder / "inputs").is_dir()
    async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as response:
        assert response.status == 200  # the first DELETE cancels
    await wait_for_job(http, server, job["id"], {"cancelled"})
    deadline = time.monotonic() + 30
    while True:  # 409 while the cancelled worker is still stopping
        async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as response:
            if response.status == 204 or time.monotonic() > deadline:
                break
            assert response.status == 409
        await asyncio.sleep(0.5)
    assert response.status == 204
    assert not folder.exists()
    async with http.get(f"{server.url}/v1/jobs/{job['id']}") as response:
        assert response.status == 404


async def test_an_uploaded_adapter_is_validated_served_and_deletable(http, server, dev_model):
    async with http.post(server.url + "/v1/voices", data=adapter_form(dev_model, "up")) as r:
        assert r.status == 201, await r.text()
        assert (await r.json())["voice"]["id"] == "up"
        assert r.headers["Location"] == "/v1/voices/up"
    async with http.post(server.url + "/v1/voices", data=adapter_form(dev_model, "up")) as r:
        assert r.status == 409
    body = {"input": "Hi.", "voice": "up", "response_format": "pcm"}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200
    async with http.delete(server.url + "/v1/voices/up") as response:
        assert response.status == 204
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 404
    async with http.delete(server.url + "/v1/voices/tara") as response:
        assert response.status == 403


def peft_save(dev_model, out):
    """What a new user has: PEFT's ``save_pretrained`` of an ``all-linear`` LoRA made against
    the served model's folder (so its config names that path, and every projection in full)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dev_model.model)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(out)
    return out


async def test_a_plain_peft_save_against_the_served_model_is_accepted_and_speaks(
    http, server, dev_model, tmp_path
):
    folder = peft_save(dev_model, tmp_path / "peft")
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(dev_model.model)  # a path, not a name
    form = aiohttp.FormData()
    form.add_field("voice_id", "peft-user")
    for part, name in (
        ("adapter_config", "adapter_config.json"),
        ("adapter_model", "adapter_model.safetensors"),
    ):
        form.add_field(part, (folder / name).read_bytes(), filename=name)
    async with http.post(server.url + "/v1/voices", data=form) as r:
        assert r.status == 201, await r.text()
    body = {"input": "Hi.", "voice": "peft-user", "response_format": "pcm"}
    async with http.post(server.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200, await r.text()
        assert len(await r.read()) > 0
    async with http.delete(server.url + "/v1/voices/peft-user") as r:
        assert r.status == 204


async def test_audio_and_an_adapter_in_one_upload_is_400_and_keeps_nothing(
    http, server, dev_model, corpus
):
    form = adapter_form(dev_model, "both")
    form.add_field("audio", corpus.good[0].read_bytes(), filename=corpus.good[0].name)
    async with http.post(server.url + "/v1/voices", data=form) as r:
        assert r.status == 400
        assert await error_code(r) == "ambiguous_upload"
    async with http.get(server.url + "/v1/voices/both") as r:
        assert r.status == 404


async def test_a_bad_adapter_upload_is_400(http, server, dev_model):
    config = json.loads((dev_model.adapters / "dev-b" / "adapter_config.json").read_text())
    config["modules_to_save"] = ["lm_head"]
    form = adapter_form(dev_model, "bad-up", config)
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 400
        assert await error_code(response) == "invalid_adapter"
    assert not (server.adapters / "bad-up").exists()


async def no_directory(voice_id, folder):
    return None


@pytest.mark.unit
async def test_job_state_survives_a_restart(tmp_path, dev_model):
    jobs = CloneJobs(tmp_path / "jobs", on_voice_ready=no_directory)
    job_id, inputs = jobs.new_job_dir()
    spec = VoiceJob(
        audio=[inputs],
        voice_id="v",
        base_model=str(dev_model.model),
        base_model_name="x",
        codec=str(dev_model.codec),
        adapters_dir=tmp_path,
        work_dir=tmp_path / "w",
    )
    await jobs.submit(job_id, spec)
    state_file = tmp_path / "jobs" / job_id / "job.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "status": "training"}))  # died mid-training
    restarted = CloneJobs(tmp_path / "jobs", on_voice_ready=no_directory)
    restarted.recover()
    assert restarted.get(job_id).status == "queued"
    assert (tmp_path / "jobs" / job_id / "spec.json").exists()


async def test_a_voice_speaks_a_language_of_the_model_and_says_which(
    http, server, dev_model, corpus
):
    """The shared dev model speaks English and French (its settings say so): every voice is
    listed with its language (Orpheus' English, ``pierre`` French), the models list both; an
    adapter or a clone asked for in German is 400 ``unsupported_language`` and leaves no voice
    and no job; an adapter's language is the model's first unless its upload says another, and
    a French clone's job is trained in French."""
    async with http.get(server.url + "/v1/models") as r:
        models = {m["id"]: m["languages"] for m in (await r.json())["data"]}
    assert models["orpheus"] == ["en", "fr"]
    async with http.get(server.url + "/v1/audio/voices") as r:
        voices = {v["id"]: v for v in (await r.json())["voices"]}
    assert voices["tara"]["language"] == "en" and voices["dev-a"]["language"] == "en"
    assert voices["pierre"]["language"] == "fr" and voices["pierre"]["kind"] == "builtin"
    jobs = server.adapters.parent / "jobs"

    def job_folders() -> set[str]:
        return {job.name for job in jobs.iterdir()} if jobs.exists() else set()

    jobs_before = job_folders()
    form = adapter_form(dev_model, "de-voice")
    form.add_field("language", "de")
    async with http.post(server.url + "/v1/voices", data=form) as r:
        assert r.status == 400 and await error_code(r) == "unsupported_language"
        assert "speaks en, fr" in (await r.json())["error"]["message"]
    form = audio_form(corpus.good, corpus.folder / "metadata.csv", name="Stimme")
    form.add_field("language", "de")
    async with http.post(server.url + "/v1/voices", data=form) as r:
        assert r.status == 400 and await error_code(r) == "unsupported_language"
    assert job_folders() == jobs_before
    async with http.get(server.url + "/v1/voices/de-voice") as r:
        assert r.status == 404
    for language, voice_id in (("en", "en-voice"), ("fr", "fr-voice"), (None, "any-voice")):
        form = adapter_form(dev_model, voice_id)
        if language is not None:
            form.add_field("language", language)
        async with http.post(server.url + "/v1/voices", data=form) as r:
            assert r.status == 201, await r.text()
            voice = (await r.json())["voice"]
        assert voice["language"] == (language or "en")
        async with http.delete(f"{server.url}/v1/voices/{voice_id}") as r:
            assert r.status == 204
    form = audio_form(corpus.good, corpus.folder / "metadata.csv", name="Voix française")
    form.add_field("language", "fr")
    async with http.post(server.url + "/v1/voices", data=form) as r:
        assert r.status == 202, await r.text()
        job = (await r.json())["job"]
    spec = json.loads((jobs / job["id"] / "spec.json").read_text())
    assert spec["language"] == "fr"  # what its manifest will say (export.manifest)
    async with http.delete(f"{server.url}/v1/jobs/{job['id']}") as r:
        assert r.status in (200, 204)
