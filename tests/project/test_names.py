"""One name per thing, one thing per name (issue 43): the words that once meant several things
each mean one now, the published names that changed still work, and records store ``now_iso``
timestamps, not ``time.time()``."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from lora_training.quality import DataReport
from lora_training.recipe import VoiceJob, job_from_json, job_to_json
from voicehost.config import Settings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OUR_CODE = ("voicehost", "lora_training", "scripts", "tests")

# "encoder" is third parties' word only: PyAV's encoder (formats' ``_PyAVFormat.encoder``),
# Resemblyzer's model class, SNAC's encoder half, and a base commit's class that
# scripts/bench_formats.py reads (``FormatEncoder``, ``FormatWriter``'s name before).
ENCODER_ALLOWED = {
    ("voicehost/audio/formats.py", "encoder"),
    ("voicehost/audio/speaker.py", "VoiceEncoder"),
    ("voicehost/model/devmodel.py", "encoder"),
    ("scripts/bench_formats.py", "FormatEncoder"),
}
# "registry" outside the cluster: its Redis registry's errors and setting, its gauge, and
# Prometheus's CollectorRegistry (a metrics object's ``registry``)
REGISTRY_ALLOWED = {
    "RegistryRebuilding",
    "RegistryIncomplete",
    "registry_reconcile_seconds",
    "registry_missing",
    "watch_registry",
    "registry",
    "CollectorRegistry",
}
# classes of one name on the two sides of the wire: the client's view of the server's thing
SAME_THING_BOTH_SIDES = {"ApiError", "RealtimeSession", "AuditPage"}
# where records are written: a timestamp stored there is ``ids.now_iso``'s; ``time.time()``
# only measures (a deadline, a duration: arithmetic or a comparison) or picks usage's bucket
# (``minute_of``: the minute since the epoch, the usage lines' published key)
RECORD_MODULES = ("voicehost/cloning", "voicehost/cluster", "voicehost/tenancy", "voicehost/voices")


def python_files(*tops: str) -> Iterator[tuple[str, ast.Module]]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path != Path(__file__).resolve():  # this file names the words it looks for
                yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def identifiers(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Every name the code gives or uses: variables, attributes, definitions, arguments,
    keywords and imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id, node
        elif isinstance(node, ast.Attribute):
            yield node.attr, node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node
        elif isinstance(node, ast.arg):
            yield node.arg, node
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg, node
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.rpartition(".")[2], node


def test_encoder_names_only_third_parties_encoders():
    """The speaker's model is an embedder, a response format's bytes come from a FormatWriter
    (streamed by a FormatStream, from an EncodingPool), SNAC is the codec."""
    found = {
        (path, name)
        for path, tree in python_files(*OUR_CODE)
        for name, _ in identifiers(tree)
        if "encoder" in name.lower()
    }
    assert found <= ENCODER_ALLOWED, sorted(found - ENCODER_ALLOWED)


def test_slot_is_left_to_vllms_lora_slots():
    """The engine client is a CoreClient, the route table's named handlers RoleHandler, and
    admission counts streams; only vLLM's LoRA slots (model/engine.py) are slots."""
    found = {
        (path, name)
        for path, tree in python_files(*OUR_CODE)
        for name, node in identifiers(tree)
        if "slot" in name.lower()
        and "lora" not in name.lower()
        and not (name == "slots" and isinstance(node, ast.keyword))  # dataclass(slots=True)
        and name != "__slots__"
        and path != "voicehost/model/engine.py"
    }
    assert not found, sorted(found)


def test_registry_is_the_clusters_not_the_voice_directory():
    found = {
        (path, name)
        for path, tree in python_files(*OUR_CODE)
        if not path.startswith(("voicehost/cluster/", "tests/cluster/"))
        and path != "tests/project/test_deploy.py"  # the deployment's Redis, holding it
        for name, _ in identifiers(tree)
        if ("registry" in name.lower() or "registrar" in name.lower())
        and name not in REGISTRY_ALLOWED
    }
    assert not found, sorted(found)


def test_each_class_name_is_one_class():
    """``ServingProcess`` is the serving process's class (the evaluation's protocol is
    ``SpeakingProcess``); ``NotReady`` and ``UnsupportedAudio`` are one error each."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in python_files("voicehost", "lora_training"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(path)
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert set(twice) <= SAME_THING_BOTH_SIDES, twice
    assert where["ServingProcess"] == ["voicehost/serving.py"]
    assert len(where["NotReady"]) == len(where["UnsupportedAudio"]) == 1


def test_records_store_no_unix_time():
    """``time.time()`` in the modules that write records is a deadline or a duration (a sum or
    a comparison, perhaps through ``now if ... else time.time()``) or a usage bucket, never a
    value stored as it is."""
    stored = []
    for path, tree in python_files(*RECORD_MODULES):
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "time"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "time"
            ):
                continue
            used_in = parents[node]
            while isinstance(used_in, ast.IfExp):
                used_in = parents[used_in]
            bucket = (
                isinstance(used_in, ast.Call) and getattr(used_in.func, "id", "") == "minute_of"
            )
            if not (isinstance(used_in, ast.BinOp | ast.Compare) or bucket):
                stored.append(f"{path}:{node.lineno}")
    assert not stored, stored


def test_the_speaker_embedder_setting_reads_its_name_before(monkeypatch):
    for name in ("VOICEHOST_SPEAKER_EMBEDDER", "VOICEHOST_SPEAKER_ENCODER", "SPEAKER_EMBEDDER"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().speaker_embedder is None
    monkeypatch.setenv("SPEAKER_EMBEDDER", "unprefixed")  # not ours: never read
    assert Settings().speaker_embedder is None
    monkeypatch.setenv("VOICEHOST_SPEAKER_ENCODER", "x")
    assert Settings().speaker_embedder == "x"
    monkeypatch.setenv("VOICEHOST_SPEAKER_EMBEDDER", "y")  # the new name wins
    assert Settings().speaker_embedder == "y"
    assert Settings(speaker_embedder="z").speaker_embedder == "z"  # a flag's override, by name


def test_a_job_spec_written_before_the_rename_still_loads(tmp_path):
    job = VoiceJob(
        audio=[tmp_path / "a.wav"],
        voice_id="v",
        base_model="m",
        base_model_name="m",
        codec="c",
        adapters_dir=tmp_path,
        work_dir=tmp_path,
        speaker_embedder="pkg.mod:make",
    )
    written = job_to_json(job)
    before = {("speaker_encoder" if k == "speaker_embedder" else k): v for k, v in written.items()}
    assert job_from_json(before) == job_from_json(written) == job


def test_the_reports_keep_their_published_encoder_field():
    report = DataReport(embedder="resemblyzer-ge2e", min_similarity=0.9, clips=[], speech_minutes=0)
    assert report.to_json()["encoder"] == "resemblyzer-ge2e"
