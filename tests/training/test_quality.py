"""The speaker embedder and the data report, on real (espeak-ng) speech: each clip's figures, the
clips of another speaker left out, the warnings, and ``voicehost check-data``."""

import asyncio
import json
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from lora_training.ingest import ingest
from lora_training.quality import MAX_RATE, MIN_RATE, check_data, other_speakers, voice_pitch
from lora_training.recipe import VoiceJob, prepare
from lora_training.trim import trim
from voicehost.audio.speaker import (
    EmbeddingCache,
    centroid,
    embed_off_loop,
    load_embedder,
    shared_embedder,
    similarity,
)
from voicehost.cli import main
from voicehost.tools.devcorpus import SENTENCES, speak

pytestmark = pytest.mark.unit

OTHER_VOICE = "en-us+f3"  # a woman's voice; the corpus speaks espeak-ng's default man's


@pytest.fixture(scope="module")
def embedder():
    return shared_embedder()  # the one the data report and training use in this process


@pytest.fixture(scope="module")
def mixed_corpus(corpus, tmp_path_factory):
    """A copy of the shared corpus (16 clips of one speaker, about 40 s) with three clips of
    another speaker mixed in, saying other things."""
    folder = tmp_path_factory.mktemp("mixed") / "corpus"
    shutil.copytree(corpus.folder, folder)
    mixed = replace(
        corpus,
        folder=folder,
        good=[folder / path.name for path in corpus.good],
        corrupt=folder / corpus.corrupt.name,
        not_audio=folder / corpus.not_audio.name,
    )
    mixed.others = []
    for index, text in enumerate(SENTENCES[20:23]):
        path = folder / f"visitor{index}.wav"
        speak(text, path, 0.4, "wav", voice=OTHER_VOICE)
        mixed.others.append(path)
    lines = [f"{p.stem}|{t}" for p, t in zip(mixed.others, SENTENCES[20:23], strict=True)]
    with (folder / "metadata.csv").open("a") as table:
        table.write("\n".join(lines) + "\n")
    return mixed


@pytest.fixture(scope="module")
def clips(mixed_corpus):
    recordings, _ = ingest(mixed_corpus.good + mixed_corpus.others)
    return {r.source.name: r.samples for r in recordings}


def test_embeddings_are_unit_vectors_closer_within_a_speaker(embedder, clips):
    embeddings = {name: embedder.embed(samples) for name, samples in clips.items()}
    one = embeddings["clip00.wav"]
    assert one.dtype == np.float32 and one.ndim == 1 and abs(np.linalg.norm(one) - 1) < 1e-5
    same = similarity(one, embeddings["clip01.flac"])
    other = similarity(one, embeddings["visitor0.wav"])
    assert same > other + 0.1, (same, other)
    speaker = centroid([e for name, e in embeddings.items() if name.startswith("clip")])
    assert abs(np.linalg.norm(speaker) - 1) < 1e-5
    assert similarity(speaker, one) > similarity(speaker, embeddings["visitor1.wav"])
    # 16 kHz in: resampled, so the same speech embeds the same at any rate
    import soxr

    at_16k = soxr.resample(clips["clip00.wav"], 24000, 16000)
    assert similarity(embedder.embed(at_16k, 16000), one) > 0.98


def test_the_cache_embeds_each_clip_once_in_memory_and_on_disk(embedder, clips, tmp_path):
    samples = clips["clip02.ogg"]
    cache = EmbeddingCache(embedder, tmp_path)
    first = cache.embed(samples)
    assert cache.embed(samples) is first and cache.hits == 1
    assert cache.name == embedder.name and len(list(tmp_path.glob("*.npy"))) == 1
    again = EmbeddingCache(embedder, tmp_path)  # a new process: from disk
    np.testing.assert_array_equal(again.embed(samples), first)
    assert again.hits == 1
    assert cache.key(samples) != cache.key(samples, 16000) != cache.key(samples[1:])
    off_loop = asyncio.run(embed_off_loop(EmbeddingCache(embedder), samples, 24000))
    np.testing.assert_allclose(off_loop, first, atol=1e-6)


def test_an_operator_plugs_in_an_embedder_by_module_or_by_folder(tmp_path):
    plugin = (
        "import numpy as np\n"
        "class Loudness:\n"
        "    name = 'loudness-test'\n"
        "    def embed(self, samples, sample_rate=24000):\n"
        "        return np.array([1.0], dtype=np.float32)\n"
        "def load(folder):\n"
        "    return Loudness()\n"
    )
    folder, before = tmp_path / "my-ecapa", tmp_path / "older"
    folder.mkdir()
    before.mkdir()
    (folder / "speaker_embedder.py").write_text(plugin)
    (before / "speaker_encoder.py").write_text(plugin)  # the file's name before: still read
    assert load_embedder(str(folder)).name == load_embedder(str(before)).name == "loudness-test"
    shared = shared_embedder(str(folder))
    assert shared.name == "loudness-test" and shared_embedder(f" {folder} ") is shared
    assert load_embedder(str(folder)) is not shared  # a new one; the process keeps ``shared``
    assert load_embedder("voicehost.audio.speaker:Resemblyzer").name == "resemblyzer-ge2e"
    for spec in ("no.such.module:Factory", str(tmp_path), "voicehost.audio.speaker:centroid", "x"):
        with pytest.raises(ValueError):
            load_embedder(spec)


def data_only_job(folder, voice_id: str, tmp_path, **chosen) -> VoiceJob:
    """A job over ``folder`` that is only prepared here (no model: its data report)."""
    return VoiceJob(
        audio=[folder],
        voice_id=voice_id,
        base_model="unused",
        base_model_name="unused",
        codec="unused",
        adapters_dir=tmp_path / "adapters",
        work_dir=tmp_path / "work",
        **chosen,
    )


def test_clips_of_another_speaker_are_left_out_of_training_and_named(mixed_corpus, tmp_path):
    prepared = prepare(data_only_job(mixed_corpus.folder, "mixed", tmp_path))
    report = prepared.report
    visitors = {p.name for p in mixed_corpus.others}
    assert {c.file for c in report.excluded} == visitors
    for clip in report.excluded:
        assert clip.excluded.startswith("another speaker") and clip.similarity < 0.9
    assert all(c.similarity is not None for c in report.clips)
    [mixed] = [w for w in report.warnings if w.startswith("Mixed speakers")]
    assert all(name in mixed for name in visitors)
    trained = {u.text for u in prepared.utterances} | {r.text for r in prepared.references}
    # every genuine clip, no other
    assert trained == {mixed_corpus.texts[p.stem] for p in mixed_corpus.good}
    assert len(prepared.references) == 3 and len(prepared.utterances) == 13
    assert report.embedder == "resemblyzer-ge2e"
    assert report.to_json()["excluded"] == [
        {"file": c.file, "reason": c.excluded} for c in report.excluded
    ]


def test_voice_pitch_is_the_median_f0_of_the_voiced_frames():
    seconds = np.arange(24000) / 24000
    for f0 in (80.0, 120.0, 220.0, 350.0):  # a voice's range, with a strong second harmonic
        tone = 0.3 * np.sin(2 * np.pi * f0 * seconds) + 0.2 * np.sin(4 * np.pi * f0 * seconds)
        assert abs(voice_pitch(tone.astype(np.float32)) - f0) < 0.01 * f0
    assert voice_pitch(np.random.default_rng(0).normal(size=24000).astype(np.float32)) is None
    assert voice_pitch(np.zeros(24000, dtype=np.float32)) is None


@pytest.fixture(scope="module")
def confusable(tmp_path_factory):
    """12 clips of ``en-gb-scotland+m3`` and 3 of ``en+m1`` saying other sentences: two voices
    of one sex the embedder hears as one (a clip-pair EER of 33 % in the benchmark), whose
    pitch lies about 2 semitones apart; speech as prepare trims it."""
    folder = tmp_path_factory.mktemp("confusable")
    paths = []
    for index, text in enumerate(SENTENCES[:15]):
        voice = "en-gb-scotland+m3" if index < 12 else "en+m1"
        paths.append(folder / f"{'speaker' if index < 12 else 'visitor'}{index:02d}.wav")
        speak(text, paths[-1], 0.3, "wav", voice=voice)
    recordings, _ = ingest(paths)
    return [trim(r.samples).samples for r in recordings]


def test_a_voice_the_embedder_confuses_is_caught_by_its_pitch(embedder, confusable):
    embeddings = [embedder.embed(speech) for speech in confusable]
    pitches = [voice_pitch(speech) for speech in confusable]
    assert other_speakers(embeddings, min_pitch_shift=0).excluded == {}  # the embedder alone
    split = other_speakers(embeddings, pitches=pitches)
    assert sorted(split.excluded) == [12, 13, 14]
    for reason in split.excluded.values():
        assert reason.startswith("another speaker: 3 clips speak") and "semitones lower" in reason
    # one speaker's own pitch, however it varies, never makes a group: the 12 alone stay whole
    assert other_speakers(embeddings[:12], pitches=pitches[:12]).excluded == {}


def test_one_speakers_clips_are_all_kept():
    rng = np.random.default_rng(0)
    speaker = rng.normal(size=64)
    clips = [speaker + rng.normal(scale=0.4, size=64) for _ in range(20)]
    clips = [(c / np.linalg.norm(c)).astype(np.float32) for c in clips]
    assert other_speakers(clips).excluded == {}


def sox(*args: str) -> None:
    subprocess.run(["sox", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def flawed(corpus, tmp_path_factory):
    """Four clips as they are, with white noise mixed in, and 12 dB too loud (clipped)."""
    root = tmp_path_factory.mktemp("flawed")
    folders = {name: root / name for name in ("clean", "noisy", "clipped")}
    for folder in folders.values():
        folder.mkdir()
    for path in corpus.good[:4]:
        wav = f"{path.stem}.wav"
        sox(str(path), str(folders["clean"] / wav))
        sox(str(path), str(root / "noise.wav"), "synth", "whitenoise", "vol", "0.03")
        sox(
            "-m",
            "-v",
            "1",
            str(path),
            "-v",
            "1",
            str(root / "noise.wav"),
            str(folders["noisy"] / wav),
        )
        sox(str(path), str(folders["clipped"] / wav), "gain", "12")
    return folders


def test_the_warnings_say_too_little_speech_noisy_and_clipped(flawed, embedder):
    def warnings(name):
        report = check_data([flawed[name]], embedder=embedder)
        return report, [w.split(":")[0] for w in report.warnings]

    clean, said = warnings("clean")
    assert said == ["Too little speech", "No transcript"], clean.warnings
    assert clean.speech_minutes < 0.3 and all(c.snr_db > 40 for c in clean.clips)
    noisy, said = warnings("noisy")
    assert "Noisy" in said and "Clipped" not in said, noisy.warnings
    assert all(c.snr_db < 20 for c in noisy.clips)
    clipped, said = warnings("clipped")
    assert "Clipped" in said and "Noisy" not in said, clipped.warnings
    assert all(c.clipped_share > 0.001 for c in clipped.clips)
    # loudness as uploaded: 12 dB up, before normalisation evens it out
    for loud, plain in zip(clipped.clips, clean.clips, strict=True):
        assert 8 < loud.loudness_lufs - plain.loudness_lufs < 12.5


def test_check_data_command_writes_its_json(mixed_corpus, tmp_path, capsys):
    out = tmp_path / "report.json"
    command = ["check-data", "--audio", str(mixed_corpus.folder), "--json", str(out)]
    assert main(command) == 0  # the command, run in this process (its embedder is loaded)
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert {c["file"] for c in report["excluded"]} == {p.name for p in mixed_corpus.others}
    assert len(report["clips"]) == len(mixed_corpus.good) + len(mixed_corpus.others)
    assert {r["file"] for r in report["rejected"]} == {"broken.wav", "notes.mp3"}
    assert report["encoder"] == "resemblyzer-ge2e" and "Mixed speakers" in printed


def test_a_long_recording_is_measured_in_pieces_without_transcripts(corpus, tmp_path, embedder):
    recordings, _ = ingest(corpus.good[:8])
    pause = np.zeros(12000, dtype=np.float32)
    long = np.concatenate([piece for r in recordings for piece in (r.samples, pause)])
    import wave

    path = tmp_path / "long.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24000)
        out.writeframes((long * 32767).astype("<i2").tobytes())
    report = check_data([path], embedder=embedder)
    assert len(report.clips) >= 2 and all(c.file.startswith("long.wav#") for c in report.clips)
    assert not report.excluded


def one_speaker_through_two_channels(root, channel: str, options: list[str], chain: list[str]):
    """One man's upload: 12 clips recorded clean and his last 8 through a channel (sox: the
    output file's ``options``, then the effects ``chain``), and 3 clips of a woman through it
    too, named ``speakerNN[-channel].wav`` and ``visitorNN-channel.wav``."""
    upload = root / "upload"
    upload.mkdir()
    for index, text in enumerate(SENTENCES[:23]):
        voice = OTHER_VOICE if index >= 20 else None
        clean = root / f"{index:02d}.wav"
        speak(text, clean, 0.3, "wav", voice=voice)
        name = f"{'visitor' if voice else 'speaker'}{index:02d}"
        if index >= 12:
            sox(str(clean), *options, str(upload / f"{name}-{channel}.wav"), *chain)
        else:
            sox(str(clean), str(upload / f"{name}.wav"))
    return upload


@pytest.fixture(scope="module")
def phoned(tmp_path_factory):
    """Through a phone: 8 kHz mu-law, 300-3400 Hz (sox)."""
    root = tmp_path_factory.mktemp("phoned")
    phone = ["-r", "8000", "-e", "u-law"]
    return one_speaker_through_two_channels(root, "phone", phone, ["sinc", "300-3400"])


def test_an_upload_of_clean_and_phone_clips_keeps_the_speakers_and_leaves_out_another(
    phoned, embedder
):
    """Heard in the band every clip has (the phone's), the speaker's phone clips are his, and
    the woman's are still caught; the report says the band and that the check is weaker there.
    Compared as uploaded (full band against phone band), the phone clips looked like another
    speaker: the split below, on the embeddings as uploaded, leaves most of them out."""
    report = check_data([phoned], embedder=embedder)
    excluded = sorted(c.file for c in report.excluded)
    assert excluded == [f"visitor{i}-phone.wav" for i in (20, 21, 22)], report.excluded
    assert report.band == "300-3400 Hz"
    assert report.clip_bands == {"0-8000 Hz": 12, "300-3400 Hz": 11}
    [narrow] = [w for w in report.warnings if w.startswith("Narrow band")]
    assert "11 of 23 clips" in narrow
    recordings, _ = ingest(sorted(phoned.iterdir()))
    speech = [trim(r.samples).samples for r in recordings]
    as_uploaded = other_speakers([embedder.embed(s) for s in speech])
    names = [r.source.name for r in recordings]
    his = [i for i, n in enumerate(names) if n.startswith("speaker") and "phone" in n]
    assert len(set(as_uploaded.excluded) & set(his)) >= 4, as_uploaded.excluded


@pytest.fixture(scope="module")
def hall(tmp_path_factory):
    """In a hall: sox's reverb 80 50 100."""
    reverb = ["reverb", "80", "50", "100"]
    return one_speaker_through_two_channels(tmp_path_factory.mktemp("hall"), "hall", [], reverb)


def test_clips_from_a_hall_are_judged_among_themselves_not_against_the_dry_ones(hall, embedder):
    """A hall's reverb moves a speaker's embeddings about as far as another speaker's: judged
    against his dry clips (as the filter did before it judged like with like), every one of the
    man's hall clips is left out. Judged among the clips of their channel, none is, and the
    woman's three are still caught; each clip's channel is in the report."""
    report = check_data([hall], embedder=embedder)
    excluded = sorted(c.file for c in report.excluded)
    assert excluded == [f"visitor{i}-hall.wav" for i in (20, 21, 22)], report.excluded
    channels = {c.file: c.channel for c in report.clips}
    assert len({channels[f"speaker{i:02d}-hall.wav"] for i in range(12, 20)}) == 1
    assert channels["speaker12-hall.wav"] != channels["speaker00.wav"]
    assert report.unjudged == [] and "channel" in report.to_json()["clips"][0]
    recordings, _ = ingest(sorted(hall.iterdir()))
    speech = [trim(r.samples).samples for r in recordings]
    pitches = [voice_pitch(s) for s in speech]
    as_one_channel = other_speakers([embedder.embed(s) for s in speech], pitches=pitches)
    names = [r.source.name for r in recordings]
    his = {i for i, n in enumerate(names) if n.startswith("speaker") and "hall" in n}
    assert his <= set(as_one_channel.excluded), as_one_channel.excluded


def test_a_transcript_is_timed_against_its_speech_in_any_language(tmp_path, embedder):
    """Clips of French and Mandarin (espeak-ng) with a metadata.csv in their own languages: each
    transcript's pace is that of speech in its script (a Han character a syllable); one clip
    given another's long transcript, and one a word for a sentence, are named as off."""
    said = {
        "fr1": ("fr", "Le petit chat dort sur le canapé bleu près de la fenêtre."),
        "fr2": ("fr", "Nous avons pris le train de huit heures pour Lyon."),
        "zh1": ("cmn", "小猫在窗户旁边蓝色的沙发上睡觉。"),
        "zh2": ("cmn", "我们明天早上坐八点的火车去上海。"),
        "long": ("fr", "Oui, bien sûr, merci."),
        "short": ("fr", "Il fait beau, alors allons marcher près de la rivière ce soir."),
    }
    folder = tmp_path / "upload"
    folder.mkdir()
    for name, (voice, text) in said.items():
        speak(text, folder / f"{name}.wav", 0.2, "wav", voice=voice)
    written = {name: text for name, (_, text) in said.items()}
    written["long"] = said["fr1"][1] * 4  # another clip's transcript, four times over
    written["short"] = "Oui."  # one word for a sentence
    lines = [f"{name}.wav|{text}" for name, text in written.items()]
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    report = check_data([folder], embedder=embedder)
    rates = {c.file.removesuffix(".wav"): c.letters_per_second for c in report.clips}
    assert all(8 <= rates[n] <= 30 for n in ("fr1", "fr2")), rates
    assert all(4 <= rates[n] <= 15 for n in ("zh1", "zh2")), rates  # syllables, not characters
    assert rates["long"] > 35 and rates["short"] < 4, rates
    [off] = [w for w in report.warnings if w.startswith("Transcripts off")]
    assert "2 clips" in off and "long.wav" in off and "short.wav" in off
    assert "fr1" not in off and "zh1" not in off


# Everyday French, one sentence a clip (10 of the speaker), then three a German visitor says
FRENCH = [
    "Le marché ouvre tous les samedis à huit heures sur la place de l'église.",
    "Nous avons réservé une table pour quatre personnes près de la fenêtre.",
    "Mon frère habite à Lyon depuis bientôt dix ans avec sa famille.",
    "Il faut prendre le deuxième train, le premier est toujours complet.",
    "La boulangerie du coin fait le meilleur pain de tout le quartier.",
    "Pourriez-vous me dire où se trouve la gare routière, s'il vous plaît ?",
    "Cet hiver, la neige est tombée plus tôt que prévu dans les Alpes.",
    "Elle lit un roman policier chaque soir avant de s'endormir.",
    "Les enfants jouent dans le jardin pendant que nous préparons le dîner.",
    "Nous partirons en vacances au bord de la mer au mois d'août.",
]
GERMAN = [
    "Am Wochenende fahren wir mit dem Fahrrad an den See.",
    "Der Zug nach München hat heute leider zwanzig Minuten Verspätung.",
    "Könnten Sie mir bitte sagen, wo die nächste Apotheke ist?",
]


@pytest.fixture(scope="module")
def french_upload(tmp_path_factory):
    """A French upload (espeak-ng's French, one man's voice) with three clips of a German woman
    hidden in it, her transcripts in German: a metadata.csv for all of them."""
    folder = tmp_path_factory.mktemp("french") / "upload"
    folder.mkdir()
    texts = {}
    for index, text in enumerate(FRENCH):
        texts[f"clip{index:02d}"] = (text, "fr+m1")
    for index, text in enumerate(GERMAN):
        texts[f"visitor{index}"] = (text, "de+f2")
    for stem, (text, voice) in texts.items():
        speak(text, folder / f"{stem}.wav", 0.3, "wav", voice=voice)
    lines = [f"{stem}|{text}" for stem, (text, _) in texts.items()]
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    return folder, {stem: text for stem, (text, _) in texts.items()}


def test_a_french_uploads_hidden_german_speaker_is_left_out_and_its_pace_read_as_french(
    french_upload, tmp_path
):
    """A clone's metadata.csv may be in any language: a French one is prepared as French (the
    transcripts' pace read in its letters, no "Transcripts off"), and the speaker filter, which
    hears voices not words, leaves the German speaker's clips out."""
    folder, texts = french_upload
    prepared = prepare(
        data_only_job(folder, "amelie", tmp_path, language="fr", min_speech_seconds=15)
    )
    report = prepared.report
    assert {c.file for c in report.excluded} == {f"visitor{i}.wav" for i in range(3)}
    assert all(c.excluded.startswith("another speaker") for c in report.excluded)
    assert not [w for w in report.warnings if w.startswith("Transcripts off")], report.warnings
    kept = [c for c in report.clips if not c.excluded]
    rates = [c.letters_per_second for c in kept]
    assert all(r is not None and MIN_RATE <= r <= MAX_RATE for r in rates), rates
    trained = {u.text for u in prepared.utterances} | {r.text for r in prepared.references}
    assert trained == {text for stem, text in texts.items() if stem.startswith("clip")}
