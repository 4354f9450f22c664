"""Several base models in one cluster, over a real Redis of the test's own and a shared store on
disk (no engine: what a gateway learns from its workers' records, and what it does with it).
Each worker's record carries its model's adapter rules: a gateway checks an adapter by the
rules of the model it declares and records the voice as that model's; a model no worker has
said is refused with the served ones named; a clone job goes to its model's stream and is run
only by a runner of that model, on that runner's own weights."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from voicehost.cloning.jobs import CloneJobs, TrainingModel
from voicehost.cloning.spec import training_spec
from voicehost.cluster.adapters import SharedDirStore
from voicehost.cluster.jobs import RedisJobQueue, jobs_stream
from voicehost.cluster.state import Membership, WorkerPresence, voice_key
from voicehost.cluster.voices import RedisVoiceDirectory
from voicehost.config import Settings
from voicehost.speech.admission import WorkerLoad
from voicehost.voices.validation import AdapterRules, InvalidAdapter, ModelShape

SHAPE = ModelShape(hidden=64, intermediate=128, q_out=64, kv_out=32)
ENGLISH = AdapterRules("voicehost-dev", 16, languages=("en",))
FRENCH = AdapterRules("voicehost-dev-fr", 16, aliases=("/models/fr",), languages=("fr",))


def adapter(dev_model, tmp_path: Path, voice_id: str, model: str, language: str) -> Path:
    """The dev adapter ``dev-a``, declaring ``model`` and ``language``."""
    staged = tmp_path / "staging" / voice_id
    shutil.copytree(dev_model.adapters / "dev-a", staged)
    config = json.loads((staged / "adapter_config.json").read_text())
    (staged / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": model})
    )
    manifest = json.loads((staged / "voice.json").read_text())
    manifest |= {"base_model": model, "language": language}
    (staged / "voice.json").write_text(json.dumps(manifest))
    return staged


async def test_a_workers_record_carries_its_models_adapter_rules(redis_client, redis_server):
    settings = Settings(redis_url=redis_server.url, worker_ttl_seconds=60)
    shaped = AdapterRules("voicehost-dev-fr", 8, SHAPE, ("/m/fr",), ("fr", "fr-CA"))
    assert AdapterRules.from_json(shaped.to_json()) == shaped
    for bad in (
        "",
        "[]",
        '{"base_model": "x"}',
        json.dumps({**json.loads(shaped.to_json()), "languages": []}),
    ):
        with pytest.raises(ValueError):
            AdapterRules.from_json(bad)
    load = lambda: WorkerLoad(0, 0, 8, 8)  # noqa: E731
    presence = WorkerPresence(
        redis_client, settings, "fr1", "http://fr1", load, lambda: shaped, {"pierre": "fr"}
    )
    await presence.heartbeat()
    # a worker whose record says no rules (from before they were said), or rules that are not
    # its own model's, is a member with no rules
    old = WorkerPresence(redis_client, settings, "old", "http://old", load)
    await old.heartbeat()
    await redis_client.hset("vh:member:odd", mapping={"url": "http://odd", "base_model": "m"})
    await redis_client.hset("vh:member:odd", "rules", ENGLISH.to_json())
    await redis_client.zadd("vh:members", {"odd": 1})
    membership = Membership(redis_client, 0.1)
    await membership.refresh()
    assert membership.workers["fr1"].rules == shaped
    assert membership.workers["fr1"].base_model == "voicehost-dev-fr"
    assert membership.workers["old"].rules is None
    assert membership.workers["odd"].rules is None


async def test_a_gateway_takes_an_adapter_of_each_model_its_workers_serve(
    redis_client, dev_model, tmp_path
):
    store = SharedDirStore(tmp_path / "shared")
    gateway = RedisVoiceDirectory(redis_client, store, ["tara"], ENGLISH, owner="gateway")
    await gateway.reconcile()
    french = adapter(dev_model, tmp_path, "amelie", "voicehost-dev-fr", "fr")
    with pytest.raises(InvalidAdapter) as refused:  # no worker has said that model yet
        await gateway.add("amelie", french)
    assert "'voicehost-dev-fr'" in str(refused.value) and "'voicehost-dev'" in str(refused.value)
    assert await redis_client.exists(voice_key("amelie")) == 0
    assert gateway.models.learn(FRENCH) and not gateway.models.learn(FRENCH)
    voice = await gateway.add("amelie", french)
    assert (voice.base_model, voice.language) == ("voicehost-dev-fr", "fr")
    record = await redis_client.hgetall(voice_key("amelie"))
    assert record["base_model"] == "voicehost-dev-fr"  # the ring it is placed on
    english = adapter(dev_model, tmp_path, "jo", "voicehost-dev", "en")
    assert (await gateway.add("jo", english)).base_model == "voicehost-dev"
    # a model neither the gateway nor its workers serve: refused, the served ones named
    other = adapter(dev_model, tmp_path, "hans", "3b-de-ft", "de")
    with pytest.raises(InvalidAdapter) as refused:
        await gateway.add("hans", other)
    message = str(refused.value)
    assert "'3b-de-ft'" in message and "'voicehost-dev-fr'" in message, message
    # an adapter of the French model that says it speaks English: the model's languages hold
    wrong = adapter(dev_model, tmp_path, "mixed", "voicehost-dev-fr", "en")
    with pytest.raises(InvalidAdapter, match="speaks fr"):
        await gateway.add("mixed", wrong)
    assert gateway.models.languages() == ("en", "fr")
    assert gateway.models.for_language("fr") == FRENCH

    # Redis loses its data: an English worker, which cannot speak the French voice, does not
    # count it missing (a process of its model restores it); the gateway, which knows both
    # models, restores both
    await redis_client.flushall()
    worker = RedisVoiceDirectory(redis_client, store, ["tara"], ENGLISH, owner="w1")
    assert await worker.reconcile() == 0
    assert await redis_client.exists(voice_key("jo")) == 1
    assert await redis_client.exists(voice_key("amelie")) == 0
    assert await gateway.reconcile() == 0
    assert (await redis_client.hgetall(voice_key("amelie")))["base_model"] == "voicehost-dev-fr"


async def test_a_clone_job_is_run_only_by_a_runner_of_its_model_on_its_own_weights(
    redis_client, tmp_path
):
    async def never(job, folder):  # these runners train nothing: the jobs are only taken
        raise AssertionError("no voice is registered here")

    root = tmp_path / "jobs"
    gateway = CloneJobs(root, never, RedisJobQueue(redis_client, "gateway"), "gateway")
    runners = {}
    for name, weights in (("voicehost-dev", "/models/en"), ("voicehost-dev-fr", "/models/fr")):
        model = TrainingModel(name, weights, f"{weights}-codec")
        queue = RedisJobQueue(redis_client, name, name, poll_seconds=0.05, sweep_seconds=3600)
        runners[name] = CloneJobs(root, never, queue, name, model=model)

    async def queued(voice_id: str, model: str) -> str:
        job_id, inputs = gateway.new_job_dir()
        spec = training_spec(
            Settings(dev=True, dev_dir=tmp_path / "dev"),
            [inputs],
            voice_id,
            gateway.output_dir(job_id),
            inputs.parent / "work",
            base_model_name=model,
        )
        await gateway.submit(job_id, spec)
        return job_id

    french_job = await queued("amelie", "voicehost-dev-fr")
    english_job = await queued("jo", "voicehost-dev")
    assert await redis_client.xlen(jobs_stream("voicehost-dev-fr")) == 1
    assert await redis_client.xlen(jobs_stream("voicehost-dev")) == 1
    french, english = runners["voicehost-dev-fr"], runners["voicehost-dev"]
    taken, _ = await asyncio.wait_for(french.queue.take(french), 10)
    assert taken == french_job
    taken, _ = await asyncio.wait_for(english.queue.take(english), 10)
    assert taken == english_job
    # the jobs folder, swept when the stream lost an entry: each runner finds its model's only
    assert english.orphans() == [english_job] and french.orphans() == [french_job]
    assert english._claim(french_job) is None  # never another model's, whoever offers it
    assert french._claim(french_job) is not None
    french._train_on_own_model(root / french_job)
    spec = json.loads((root / french_job / "spec.json").read_text())
    assert (spec["base_model"], spec["codec"]) == ("/models/fr", "/models/fr-codec")
    with pytest.raises(ValueError, match="voicehost-dev-fr"):
        english._train_on_own_model(root / french_job)
