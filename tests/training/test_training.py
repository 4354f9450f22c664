"""Cloning a voice from real (espeak-ng) speech: ingest, trim, dataset, training, export."""

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from lora_training import split
from lora_training.export import read_references
from lora_training.ingest import decode, ingest
from lora_training.recipe import NotEnoughSpeech, VoiceJob, precheck, prepare
from lora_training.tokenise import build_dataset, drop_repeated_frames
from lora_training.train import TrainSettings
from lora_training.transcripts import MissingTranscripts, find_transcripts
from lora_training.trim import TrimSettings, trim
from voicehost.audio.speech_start import leading_silence_ms, relative_threshold_db
from voicehost.model import orpheus
from voicehost.model.codec import SnacCodec
from voicehost.tools.devcorpus import build_corpus, speak
from voicehost.voices.validation import validate_adapter


@pytest.fixture(scope="module")
def full_corpus(tmp_path_factory):
    """One clip of each of the 36 sentences (the shared ``corpus`` is the first 16 of them)."""
    return build_corpus(tmp_path_factory.mktemp("full-corpus"))


def training_lead_ms(samples: np.ndarray) -> float:
    """A clip's leading silence as the training trim measures it (against the clip's level)."""
    return leading_silence_ms(samples, relative_threshold_db(samples))


def job(corpus, dev_model, tmp_path, **changes):
    settings = {
        "audio": [corpus.folder],
        "voice_id": "espeak",
        "base_model": str(dev_model.model),
        "base_model_name": "voicehost-dev",
        "codec": str(dev_model.codec),
        "adapters_dir": tmp_path / "adapters",
        "work_dir": tmp_path / "work",
        "train": TrainSettings(epochs=2, batch_size=4, grad_accumulation=1, learning_rate=2e-3),
    }
    return VoiceJob(**{**settings, **changes})


@pytest.mark.unit
def test_ingest_decodes_by_content_and_reports_bad_files(full_corpus, tmp_path):
    disguised = tmp_path / "really_a_wav.ogg"
    shutil.copy(full_corpus.good[0], disguised)
    recordings, rejected = ingest([full_corpus.folder, disguised])
    assert {r.source for r in recordings} == {*full_corpus.good, disguised}
    assert {r.source for r in rejected} == {full_corpus.corrupt, full_corpus.not_audio}
    assert all(r.reason for r in rejected)
    for recording in recordings:
        assert recording.samples.dtype == np.float32 and recording.samples.ndim == 1
        assert 1.0 < recording.seconds < 10.0  # 24 kHz: espeak's 22.05 kHz was resampled


@pytest.mark.unit
def test_decode_refuses_audio_over_the_duration_cap(full_corpus):
    with pytest.raises(ValueError, match="limit"):
        decode(full_corpus.good[0], max_seconds=0.5)


@pytest.mark.unit
def test_trim_cuts_leading_silence_to_the_pad(full_corpus):
    recordings, _ = ingest(full_corpus.good)
    settings = TrimSettings(lead_pad_ms=40)
    before, after = [], []
    for recording in recordings:
        clip = trim(recording.samples, settings)
        before.append(clip.leading_before_ms)
        after.append(training_lead_ms(clip.samples))
        assert clip.leading_after_ms == after[-1]
    assert np.percentile(after, 95) <= 40 + 20
    # the detector against the truth: the silence sox added, to its 10 ms windows (espeak adds
    # up to tens of ms of its own)
    added = [full_corpus.lead_silence_s[r.source.stem] * 1000 for r in recordings]
    assert all(-10 <= b - a <= 80 for a, b in zip(added, before, strict=True)), (added, before)


@pytest.mark.unit
def test_trim_finds_no_speech_in_silence():
    assert trim(np.zeros(24000, dtype=np.float32)) is None


@pytest.mark.unit
def test_transcripts_come_from_metadata_or_sidecars(full_corpus, tmp_path):
    texts = find_transcripts(full_corpus.good)
    assert len(texts) == len(full_corpus.good)
    lone = tmp_path / "lone.wav"
    shutil.copy(full_corpus.good[0], lone)
    (tmp_path / "lone.lab").write_text("Hello sidecar.")
    assert find_transcripts([lone]) == {lone: "Hello sidecar."}


@pytest.mark.unit
def test_missing_transcripts_say_what_to_provide(full_corpus, dev_model, tmp_path):
    folder = tmp_path / "untranscribed"
    folder.mkdir()
    for path in full_corpus.good[:3]:
        shutil.copy(path, folder / path.name)
    with pytest.raises(MissingTranscripts, match=r"metadata\.csv"):
        prepare(job(full_corpus, dev_model, tmp_path, audio=[folder]))


@pytest.mark.unit
def test_too_little_speech_says_how_much_was_found(full_corpus, dev_model, tmp_path):
    with pytest.raises(NotEnoughSpeech, match=r"found \d+\.\d s"):
        prepare(job(full_corpus, dev_model, tmp_path, min_speech_seconds=10_000))


@pytest.mark.unit
def test_a_long_recording_without_asr_is_refused_not_guessed():
    with pytest.raises(split.NeedsRecognizer, match="ASR"):
        split.split_recording(np.zeros(24000 * 20, dtype=np.float32), None)


@pytest.mark.unit
def test_speech_regions_group_into_two_to_fifteen_second_utterances():
    rate = orpheus.SAMPLE_RATE
    regions = [
        (0, 4 * rate),
        (5 * rate, 9 * rate),
        (10 * rate, 14 * rate),
        (15 * rate, 15 * rate + 100),
    ]
    regions.append((20 * rate, 52 * rate))  # 32 s of unbroken speech
    groups = split.group_regions(regions)
    assert all(2 * rate <= e - s <= 15 * rate for s, e in groups)
    assert groups[0] == (0, 14 * rate)


@pytest.mark.unit
def test_dataset_holds_orpheus_sequences_and_is_reused(full_corpus, dev_model, codec, tmp_path):
    prepared = prepare(job(full_corpus, dev_model, tmp_path))
    tokenize = lambda text: [ord(c) % 256 for c in text]  # noqa: E731
    dataset, path = build_dataset(prepared.utterances[:4], codec, tokenize, tmp_path / "cache")
    row = dataset[0]
    prompt = orpheus.build_prompt(tokenize(prepared.utterances[0].text))
    assert row["input_ids"][: len(prompt)] == prompt
    assert row["input_ids"][-2:] == [orpheus.END_OF_SPEECH, orpheus.END_OF_AI]
    audio = row["input_ids"][len(prompt) : -2]
    assert len(audio) % 7 == 0 and orpheus.FrameAssembler().push(audio)
    assert row["labels"][: len(prompt)] == [-100] * len(prompt)
    again, again_path = build_dataset(prepared.utterances[:4], codec, tokenize, tmp_path / "cache")
    assert again_path == path and again["input_ids"] == dataset["input_ids"]


@pytest.mark.unit
def test_repeated_frames_are_dropped_by_their_layer_zero_code():
    a, b = orpheus.Frame((1,), (2, 3), (4, 5, 6, 7)), orpheus.Frame((1,), (9, 9), (9, 9, 9, 9))
    c = orpheus.Frame((2,), (2, 3), (4, 5, 6, 7))
    assert drop_repeated_frames([a, b, c, c]) == [a, c]


@dataclass(frozen=True)
class TrainedVoice:
    """What ``voicehost train`` wrote and said."""

    folder: Path
    out: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def trained_voice(corpus, dev_model, tmp_path_factory) -> TrainedVoice:
    """A voice trained by ``voicehost train`` (2 epochs) on the shared corpus: 16 clips, 3 held
    out. The suite's one training of the pipeline outside a clone job (the command is its
    recipe); the tests below read what it wrote and what it said."""
    tmp_path = tmp_path_factory.mktemp("trained")
    out = tmp_path / "voices"
    command = [sys.executable, "-m", "voicehost", "train", "--dev", "--audio", str(corpus.folder)]
    command += ["--voice", "espeak", "--out", str(out), "--epochs", "2"]
    command += ["--work-dir", str(tmp_path / "work"), "--name", "CLI voice"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return TrainedVoice(out / "espeak", out, result)


def test_training_lowers_eval_loss_and_exports_a_valid_voice(trained_voice, rules):
    trained_voice = trained_voice.folder
    manifest = json.loads((trained_voice / "voice.json").read_text())
    losses = manifest["train"]["eval_loss"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert manifest["voice_id"] == "espeak" and manifest["base_model"] == "voicehost-dev"
    data = manifest["data"]
    # 16 clips, 3 of them held out as the speaker's references (at least 3, about 10%)
    assert data["clips"] == 13 and 0.3 < data["minutes"] < 1.0
    assert data["leading_silence_ms"]["before"]["p50"] >= 300
    assert data["leading_silence_ms"]["after"]["p95"] <= 60
    assert {"created", "version", "prompt_style", "name"} <= set(manifest)
    assert (trained_voice / "loss.png").stat().st_size > 1000
    assert validate_adapter(trained_voice, rules).voice_id == "espeak"


def test_the_exported_voice_holds_its_references_and_data_report(trained_voice, corpus):
    trained_voice = trained_voice.folder
    data = json.loads((trained_voice / "voice.json").read_text())["data"]
    references = data["references"]
    assert len(references) == 3
    for entry in references:
        assert (trained_voice / entry["file"]).is_file()
        assert entry["text"] == corpus.texts[Path(entry["source"]).stem]
    clips = read_references(trained_voice)
    assert [round(c.size / orpheus.SAMPLE_RATE, 3) for c in clips] == [
        e["seconds"] for e in references
    ]
    report = data["quality"]
    assert report["encoder"] == "resemblyzer-ge2e" and report["excluded"] == []
    assert len(report["clips"]) == 16 and {r["file"] for r in report["rejected"]} == {
        "broken.wav",
        "notes.mp3",
    }


def test_train_command_writes_a_voice(trained_voice):
    result = trained_voice.result
    assert f"voice espeak written to {trained_voice.folder}" in result.stdout
    assert json.loads((trained_voice.folder / "voice.json").read_text())["name"] == "CLI voice"
    assert "broken.wav" in result.stderr  # the skipped file is reported
    log = trained_voice.out.parent / "audit.jsonl"  # the operator's voice, on the log beside --out
    made = [json.loads(line) for line in log.read_text().splitlines()]
    assert {
        "action": "voice.created",
        "actor": {"kind": "operator"},
        "voice": "espeak",
    }.items() <= made[-1].items()


def test_train_command_reports_too_little_speech(full_corpus, tmp_path):
    command = [
        sys.executable,
        "-m",
        "voicehost",
        "train",
        "--dev",
        "--audio",
        str(full_corpus.good[0]),
    ]
    command += ["--voice", "tiny", "--out", str(tmp_path), "--work-dir", str(tmp_path / "w")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "usable speech" in result.stderr and "at least 30 s" in result.stderr


async def test_a_trained_voice_streams_from_the_running_server(trained_voice, server):
    shutil.copytree(trained_voice.folder, server.adapters / "trained-espeak")
    body = {"input": "Hello there.", "voice": "trained-espeak", "response_format": "pcm"}
    async with aiohttp.ClientSession() as http:
        async with http.post(server.url + "/v1/audio/speech", json=body) as response:
            assert response.status == 200, await response.text()
            audio = await response.read()
    assert len(audio) > 0 and len(audio) % (2 * 2048) == 0


@pytest.mark.unit
def test_any_rate_and_channel_count_becomes_24k_mono(full_corpus, tmp_path):
    stereo = tmp_path / "stereo.flac"
    subprocess.run(
        ["sox", str(full_corpus.good[0]), "-r", "44100", "-c", "2", str(stereo)], check=True
    )
    (original,), _ = ingest([full_corpus.good[0]])
    (converted,), _ = ingest([stereo])
    assert converted.samples.ndim == 1
    assert abs(converted.seconds - original.seconds) < 0.01


def transcode(source: Path, out: Path, codec: str) -> None:
    """Re-encode ``source`` with PyAV's ``codec`` at 44.1 kHz stereo, the container by ``out``'s
    suffix (sox here has no mp3 encoder)."""
    import av

    with av.open(str(source)) as src, av.open(str(out), "w") as dst:
        stream = dst.add_stream(codec, rate=44100, layout="stereo")
        for frame in src.decode(audio=0):
            frame.pts = None
            for packet in stream.encode(frame):
                dst.mux(packet)
        for packet in stream.encode(None):
            dst.mux(packet)


@pytest.mark.unit
def test_ingest_reads_mp3_and_aac_by_content(tmp_path: Path) -> None:
    import av

    source = tmp_path / "source.wav"
    speak("Please call me back when you have a moment.", source, 0.3, "wav")
    transcode(source, tmp_path / "clip.mp3", "libmp3lame")
    transcode(source, tmp_path / "clip.m4a", "aac")
    disguised = tmp_path / "aac_named_like.wav"
    shutil.copy(tmp_path / "clip.m4a", disguised)
    for name, codec in (("clip.mp3", "mp3"), ("clip.m4a", "aac"), (disguised.name, "aac")):
        with av.open(str(tmp_path / name)) as container:  # the test files are what they claim
            assert container.streams.audio[0].codec_context.name.startswith(codec)  # mp3float
            assert container.streams.audio[0].codec_context.sample_rate == 44100
    recordings, rejected = ingest([tmp_path])
    assert rejected == []
    by_name = {r.source.name: r for r in recordings}
    assert set(by_name) == {"source.wav", "clip.mp3", "clip.m4a", disguised.name}
    original = by_name["source.wav"]
    for name in ("clip.mp3", "clip.m4a", disguised.name):
        decoded = by_name[name]
        assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
        # 24 kHz: at 44.1 kHz the clip would decode 1.8 times as long; codecs pad a few ms
        assert abs(decoded.seconds - original.seconds) < 0.1, (name, decoded.seconds)
        lead = training_lead_ms(decoded.samples) - training_lead_ms(original.samples)
        assert abs(lead) < 50, (name, lead)  # the speech, not codec priming, is where it was


class FixedTextRecognizer:
    """Stands in for an ASR model (none can be downloaded here); segmentation is what is tested."""

    def __init__(self):
        self.calls = 0

    def transcribe(self, samples):
        self.calls += 1
        return f"utterance {self.calls}"


@pytest.mark.unit
def test_a_long_recording_is_split_at_pauses_with_silero_vad(full_corpus):
    recordings, _ = ingest(full_corpus.good[:12])
    pause = np.zeros(orpheus.SAMPLE_RATE // 2, dtype=np.float32)
    long = np.concatenate([piece for r in recordings for piece in (r.samples, pause)])
    assert long.size / orpheus.SAMPLE_RATE > 30
    recognizer = FixedTextRecognizer()
    utterances = split.split_recording(long, recognizer)
    durations = [samples.size / orpheus.SAMPLE_RATE for _, samples in utterances]
    assert len(utterances) >= 2 and recognizer.calls == len(utterances)
    assert all(2.0 <= d <= 15.2 + 0.2 for d in durations)  # 15 s plus the 0.1 s margins
    assert sum(durations) > 0.7 * long.size / orpheus.SAMPLE_RATE


@pytest.mark.unit
def test_training_resumes_from_its_checkpoint(dev_model, tmp_path):
    from lora_training.train import train

    rows = [
        {"input_ids": [1, 2, 3, 128266 + i], "labels": [-100, 2, 3, 128266 + i]} for i in range(8)
    ]
    settings = TrainSettings(epochs=1, batch_size=2, grad_accumulation=1)
    _, first = train(dev_model.model, rows, settings, tmp_path, orpheus.PAD, progress=False)
    more = TrainSettings(epochs=2, batch_size=2, grad_accumulation=1)
    _, resumed = train(dev_model.model, rows, more, tmp_path, orpheus.PAD, progress=False)
    assert resumed.epochs_done == 2 and resumed.steps == 2 * first.steps
    assert resumed.eval_loss[:2] == first.eval_loss
    assert resumed.train_loss[: first.steps] == first.train_loss


@pytest.mark.unit
def test_the_loss_is_the_models_own_over_labelled_positions_only(dev_model):
    import torch

    from lora_training.train import batches, cpu_autocast, lora_model, token_loss

    rows = [
        {
            "input_ids": [1, 2, 3, 128266, 128300, 128400],
            "labels": [-100] * 3 + [128266, 128300, 128400],
        },
        {"input_ids": [4, 5, 128270, 128280], "labels": [-100, -100, 128270, 128280]},  # padded
    ]
    [batch] = batches(rows, [0, 1], 2, orpheus.PAD)
    model = lora_model(dev_model.model, TrainSettings(), torch.device("cpu"))
    with torch.no_grad():
        total, count = token_loss(model, batch)
        assert count == 5  # the labels after the first token; no prompt, no padding
        reference = model(**batch).loss  # transformers' mean over the shifted labels
        torch.testing.assert_close(total / count, reference, rtol=1e-5, atol=1e-5)
        if cpu_autocast(torch.device("cpu")):  # bf16 products: the same loss to bf16 precision
            fast, _ = token_loss(model, batch, bf16=True)
            torch.testing.assert_close(fast / count, reference, rtol=2e-2, atol=0.0)


@pytest.mark.unit
def test_training_uses_every_core_whatever_the_codec_left(dev_model, tmp_path):
    import os

    import torch

    from lora_training.train import train

    rows = [{"input_ids": [1, 2, 128266 + i], "labels": [-100, 2, 128266 + i]} for i in range(4)]
    SnacCodec.load(dev_model.codec, device="cpu")  # sets torch to half the cores, for serving
    train(dev_model.model, rows, TrainSettings(epochs=1), tmp_path, orpheus.PAD, progress=False)
    assert torch.get_num_threads() == len(os.sched_getaffinity(0))


@pytest.mark.unit
def test_the_precheck_judges_transcripts_and_the_least_audio_from_lengths_alone(tmp_path):
    """What an upload is told at once, before anything is decoded (the files need not even
    exist): short clips need text, and a recording too long to be one clip counts only where
    an ASR model can split it."""
    table = tmp_path / "metadata.csv"
    table.write_text("a|One.\nb|Two.\n")
    clips = {tmp_path / "a.wav": 10.0, tmp_path / "b.wav": 12.0, tmp_path / "long.wav": 60.0}
    with pytest.raises(NotEnoughSpeech, match=r"found 22\.0 s of audio in 2 clips.*at least 30 s"):
        precheck(clips, table, 30)
    precheck(clips, table, 30, recognizer=True)  # the long one is split by the recognizer
    with pytest.raises(MissingTranscripts, match=r"1 of 3 files have no transcript \(c\.wav\)"):
        precheck({**clips, tmp_path / "c.wav": 9.0}, table, 30)
    precheck({**clips, tmp_path / "c.wav": 9.0}, table, 30, recognizer=True)
