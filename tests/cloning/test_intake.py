"""Intake (``voicehost.cloning.intake``): a stored upload's checks, before its job is queued,
here in the process's own intake (espeak-ng speakers stand in for people), and the same checks
asked over a worker's internal route (``voicehost.cluster.intake``) as a gateway asks them, its
answers turned back into the worker's errors. Through a real gateway and workers:
tests/cluster/test_cluster.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from voicehost.api.auth import AUTH, ROUTE_ACCESS, Authenticator
from voicehost.api.edge import SERVICE, auth_middleware, error_middleware
from voicehost.cloning.consent import ConsentMismatch
from voicehost.cloning.intake import (
    TRANSCRIPTS,
    UPLOADED_RECORDING,
    LocalIntake,
    RefusedFile,
    StoredUpload,
)
from voicehost.cloning.jobs import CloneJobs, add_to
from voicehost.cluster.intake import INTAKE_ROUTES, WorkerIntake
from voicehost.config import Settings
from voicehost.errors import ServiceError
from voicehost.metrics import SpeechMetrics
from voicehost.tools.devcorpus import build_corpus, speak
from voicehost.voices.folders import FolderVoiceDirectory
from voicehost.voices.validation import AdapterRules

pytestmark = pytest.mark.unit

STATEMENT = "I agree that my voice is cloned for the voicehost tests."
OTHER_VOICE = "en-us+f3"  # a woman's voice; build_corpus speaks espeak-ng's default man's
TOKEN = "internal-token-for-intake-tests"


@pytest.fixture(scope="module")
def speakers(tmp_path_factory):
    """Four clips of espeak-ng's default voice (the training audio), and the consent statement
    read by that voice and by another."""
    folder = tmp_path_factory.mktemp("speakers")
    corpus = build_corpus(folder / "corpus", count=4)
    same, other = folder / "same.wav", folder / "other.wav"
    speak(STATEMENT, same, 0.2, "wav")
    speak(STATEMENT, other, 0.2, "wav", voice=OTHER_VOICE)
    return corpus, same, other


class Service:
    """What the intake route reads of its app's service: the intake and the metrics."""

    def __init__(self, intake: LocalIntake) -> None:
        self.intake = intake
        self.metrics = intake.metrics


@pytest.fixture
def intake(tmp_path):
    settings = Settings(dev=True, min_speech_seconds=5.0, internal_token=TOKEN)
    rules = AdapterRules(base_model="voicehost-dev", max_rank=16)
    directory = FolderVoiceDirectory([tmp_path / "voices"], (), rules)
    jobs = CloneJobs(tmp_path / "jobs", add_to(directory))
    intake = LocalIntake(settings, jobs, SpeechMetrics())
    yield intake
    intake.close()


def stored(intake: LocalIntake, corpus, recording: Path | None = None) -> StoredUpload:
    """``corpus``'s clips and transcripts saved as an upload is, in a new job's folder."""
    job_id, inputs = intake.jobs.new_job_dir()
    for clip in corpus.good:
        shutil.copy(clip, inputs / clip.name)
    shutil.copy(corpus.folder / "metadata.csv", inputs / TRANSCRIPTS)
    if recording is not None:
        shutil.copy(recording, intake.jobs.job_dir(job_id) / UPLOADED_RECORDING)
    names = tuple(clip.name for clip in corpus.good)
    return StoredUpload(job_id, names, consent_recording=recording is not None)


def checks(intake: LocalIntake) -> dict[str, float]:
    """``voicehost_intake_checks_total`` by outcome."""
    return {
        sample.labels["outcome"]: sample.value
        for metric in intake.metrics.registry.collect()
        if metric.name == "voicehost_intake_checks"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def test_a_consent_recording_of_another_speaker_is_refused_and_the_same_one_measured(
    intake, speakers
):
    corpus, same, other = speakers
    with pytest.raises(ConsentMismatch, match="similarity") as refused:
        await intake.check(stored(intake, corpus, other))
    assert refused.value.code == "consent_speaker_mismatch"
    assert refused.value.measured < intake.settings.consent_min_similarity
    measured = await intake.check(stored(intake, corpus, same))
    assert measured is not None and measured >= intake.settings.consent_min_similarity
    assert await intake.check(stored(intake, corpus)) is None  # no recording: none measured
    assert checks(intake) == {"consent_speaker_mismatch": 1, "passed": 2}


async def test_the_speaker_is_heard_before_the_data_and_a_file_that_is_not_audio_named(
    intake, speakers
):
    corpus, same, other = speakers
    upload = stored(intake, corpus, other)
    inputs = intake.jobs.job_dir(upload.job_id) / "inputs"
    (inputs / "notes.wav").write_text("not a recording")
    with_text = StoredUpload(upload.job_id, (*upload.clips, "notes.wav"), True)
    with pytest.raises(ConsentMismatch):  # the recording first: a decodable clip is enough
        await intake.check(with_text)
    (intake.jobs.job_dir(upload.job_id) / UPLOADED_RECORDING).write_bytes(same.read_bytes())
    with pytest.raises(RefusedFile, match=r"notes\.wav is not audio") as refused:
        await intake.check(with_text)
    assert refused.value.code == "not_audio"
    assert checks(intake) == {"consent_speaker_mismatch": 1, "not_audio": 1}


def worker_app(intake: LocalIntake) -> web.Application:
    """A worker's intake route (``INTAKE_ROUTES``) behind the edge's error and auth
    middleware, over ``intake``."""
    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[AUTH] = Authenticator.from_settings(intake.settings, "worker")
    app[SERVICE] = Service(intake)  # type: ignore[assignment]
    (route,) = INTAKE_ROUTES
    app.router.add_route(route.method, route.path, route.handler)
    app[ROUTE_ACCESS] = {(route.method, route.path): route.access}
    return app


async def test_a_gateways_intake_asked_of_a_worker_answers_as_the_workers_own(intake, speakers):
    """``WorkerIntake`` over the worker's route (``ask`` posts to it, as ``Gateway.ask`` does to
    the worker it picks): the similarity measured there, and its refusals raised again with
    their codes; a worker that refuses the gateway's token is the gateway's 502."""
    corpus, same, other = speakers
    async with TestClient(TestServer(worker_app(intake))) as client:

        async def ask(key, path, body, headers):
            assert key in path  # routed by the job's id
            response = await client.post(path, data=body, headers=dict(headers))
            return response.status, await response.read()

        gateway = WorkerIntake(ask, intake.settings)
        measured = await gateway.check(stored(intake, corpus, same))
        assert measured is not None and measured >= intake.settings.consent_min_similarity
        with pytest.raises(ServiceError) as refused:
            await gateway.check(stored(intake, corpus, other))
        assert refused.value.code == "consent_speaker_mismatch"
        assert "similarity" in refused.value.message
        upload = stored(intake, corpus)
        (intake.jobs.job_dir(upload.job_id) / "inputs" / corpus.good[0].name).write_text("text")
        with pytest.raises(ServiceError) as refused:
            await gateway.check(upload)
        assert refused.value.code == "not_audio"
        gateway.headers = {}  # not the cluster's gateway: the worker answers 403
        with pytest.raises(ServiceError) as refused:
            await gateway.check(stored(intake, corpus))
        assert refused.value.code == "upstream_failed" and "HTTP 403" in refused.value.message
    assert checks(intake) == {"passed": 1, "consent_speaker_mismatch": 1, "not_audio": 1}
