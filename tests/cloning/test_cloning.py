"""Cloning over the API: upload audio -> job -> voice; adapters; bad uploads; job persistence."""

import asyncio
import json
import os
import threading
import time

import aiohttp
import helpers
import pytest
from helpers import adapter_form, audio_form, early_server, start_early

from lora_training.recipe import VoiceJob
from voicehost.cloning.jobs import CloneJobs
from voicehost.tools.devcorpus import build_corpus


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


async def clone(server, corpus) -> tuple[aiohttp.ClientResponse, dict, list[dict]]:
    """Upload ``corpus`` as "Clone Test" and follow its job to its end: the upload's answer,
    its job then, and every state of the job seen on the way."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        form = audio_form(corpus.good, corpus.folder / "metadata.csv", name="Clone Test")
        async with http.post(server.url + "/v1/voices", data=form) as response:
            assert response.status == 202, await response.text()
            queued = (await response.json())["job"]
        _, seen = await wait_for_job(http, server, queued["id"], {"done", "held", "failed"})
        return response, queued, seen


class EarlyClone:
    """The REST clone, uploaded to the shared server with test_auth's first test: its job
    trains and is evaluated (30 s) while test_auth's tests use the keyed host (its
    shared-server tests would see the job's engine requests), and this module's test checks
    it. Without a shared server then (this module alone), the test clones itself."""

    engines = 0

    def __init__(self, tmp_path_factory) -> None:
        self.shared = helpers.started("server")
        self.corpus = build_corpus(tmp_path_factory.mktemp("early-clone-corpus"), count=16)
        self.outcome: tuple | BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.shared is not None:
                self.shared.watch.join()  # ready (or failed: the test then clones itself)
                if self.shared.failure is None:
                    self.outcome = asyncio.run(clone(self.shared.server, self.corpus))
        except BaseException as exc:  # raised in the test that takes it
            self.outcome = exc

    def running(self) -> bool:
        return False  # it boots no engine core: it speaks through the shared server's

    def ready(self) -> "EarlyClone":
        self.thread.join()
        return self

    def stop(self) -> None:
        self.thread.join()


@start_early("early_clone", engines=0, with_module="test_auth")
def start_early_clone(tmp_path_factory) -> EarlyClone:
    return EarlyClone(tmp_path_factory)


@pytest.fixture(scope="module")
def early_clone(server, tmp_path_factory):
    with early_server("early_clone", tmp_path_factory) as early:
        yield early


async def test_cloning_from_audio_makes_a_voice_that_speaks(http, server, early_clone):
    corpus = early_clone.corpus
    outcome = early_clone.outcome
    if isinstance(outcome, BaseException):
        raise outcome
    response, job, seen = outcome or await clone(server, corpus)
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["voice_id"] == "clone-test" and job["status"] == "queued"
    job = seen[-1]
    assert job["status"] == "done", job  # the dev model's gate only reports
    assert any(s["status"] == "training" for s in seen)
    # the data report is in the job from the end of prepare on, before training starts
    training = next(s for s in seen if s["status"] == "training")
    assert len(training["data"]["clips"]) == len(corpus.good) and training["data"]["warnings"]
    assert job["data"] == training["data"]
    assert len(job["eval_loss"]) == 2
    async with http.get(f"{server.url}/v1/voices/clone-test") as response:
        voice = (await response.json())["voice"]
    assert voice["name"] == "Clone Test"
    assert voice["manifest"]["data"]["clips"] == len(corpus.good) - 3  # 3 held-out references
    # measured through the server's engine against those references before it went live
    evaluation = job["eval"]
    assert evaluation == voice["manifest"]["eval"] and voice["manifest"]["status"] == "ready"
    assert evaluation["report_only"] is True and job["held_reason"] is None
    assert evaluation["encoder"] == "resemblyzer-ge2e" and evaluation["references"] == 3
    assert len(evaluation["similarity"]["values"]) == 2  # VOICEHOST_EVAL_SENTENCES in the tests
    assert evaluation["baseline_voice"] == "tara"  # the first built-in (VOICEHOST_EVAL_BASELINES=1)
    assert evaluation["ceiling"]["mean"] > 0.8  # espeak's clips of one voice are alike
    assert evaluation["intelligibility"]["measured"] is False
    below = evaluation["similarity"]["mean"] < 0.75  # VOICEHOST_EVAL_MIN_SIMILARITY's default
    assert any("speaker similarity" in f for f in evaluation["findings"]) == below
    assert len(evaluation["samples"]) == 2
    for sample in evaluation["samples"]:
        assert (server.adapters / "clone-test" / sample).stat().st_size > 1000
    body = {"input": "Hello there.", "voice": "clone-test", "response_format": "pcm"}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200
        audio = await response.read()
    assert len(audio) > 0 and len(audio) % 4096 == 0
    # on the audit trail: the request made the job, the runner its voice and its end
    events = await job_events(http, server, job["id"], until="job.done")
    assert events[0]["action"] == "job.created" and events[0]["actor"] == {"kind": "open"}
    by_runner = {e["action"]: e for e in events if e["actor"].get("runner") == "local"}
    assert {"voice.created", "job.done"} <= set(by_runner)  # the runner's, kind "service"
    made = by_runner["voice.created"]
    assert made["details"]["source"] == "clone" and made["voice"] == "clone-test"


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


async def no_registry(voice_id, folder):
    return None


@pytest.mark.unit
async def test_job_state_survives_a_restart(tmp_path, dev_model):
    jobs = CloneJobs(tmp_path / "jobs", on_voice_ready=no_registry)
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
    restarted = CloneJobs(tmp_path / "jobs", on_voice_ready=no_registry)
    restarted.recover()
    assert restarted.get(job_id).status == "queued"
    assert (tmp_path / "jobs" / job_id / "spec.json").exists()
