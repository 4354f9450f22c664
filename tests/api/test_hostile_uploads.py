"""Hostile uploads: whatever is posted to /v1/voices, or named in a route's path, is answered
400, 413 or 415 within 2 s, holds no memory, is never unpickled and writes nothing outside the
adapters and jobs folders."""

import io
import json
import os
import pathlib
import pickle
import secrets
import struct
import threading
import time
import wave
import zipfile
import zlib
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest
from yarl import URL

from lora_training.ingest import (
    AudioTooLong,
    UnreadableAudio,
    UnsupportedAudio,
    check_wav_header,
    decode,
    probe,
    sniff,
)
from voicehost.ids import child, is_job_id, is_voice_id
from voicehost.voices.validation import InvalidAdapter, validate_adapter

ANSWER_SECONDS = 30.0  # a hang guard, not a speed target: a refusal never waits on work
MAX_GROWTH = 300 * 2**20


# --- the corpus -------------------------------------------------------------------------------


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as sink:
        sink.setnchannels(1)
        sink.setsampwidth(2)
        sink.setframerate(rate)
        sink.writeframes((samples * 20000).astype("<i2").tobytes())
    return out.getvalue()


def tone(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.sin(2 * np.pi * 220 * np.arange(int(seconds * rate)) / rate).astype(np.float32)


def wav_header(
    rate=16000, channels=1, bits=16, data=64, byte_rate=None, align=None, tag=1
) -> bytes:
    """A WAV with a hand-made header (any values) and 64 bytes of silence."""
    align = channels * bits // 8 if align is None else align
    byte_rate = rate * align if byte_rate is None else byte_rate
    fmt = struct.pack("<HHIIHH", tag, channels, rate, byte_rate, align, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + body
        + b"data"
        + struct.pack("<I", data)
        + (b"\0" * 64)
    )


def silent_flac(path: Path, seconds: int, rate: int = 8000) -> bytes:
    """``seconds`` of digital silence as FLAC: hours in a few MB (a very low bitrate)."""
    import av

    with av.open(str(path), "w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono")
        block = np.zeros((1, rate * 60), np.int16)
        for _ in range(seconds // 60):
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path.read_bytes()


def without_length(flac: bytes) -> bytes:
    """The FLAC with its STREAMINFO total-samples field zeroed ("unknown"): a lying header."""
    data = bytearray(flac)
    offset = 4 + 4 + 10  # "fLaC", the block header, block and frame sizes
    packed = int.from_bytes(data[offset : offset + 8], "big") & ~((1 << 36) - 1)
    data[offset : offset + 8] = packed.to_bytes(8, "big")
    return bytes(data)


def zipped(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr(name, data)
    return out.getvalue()


class Canary:
    """Unpickling this creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@pytest.fixture(scope="module")
def long_flac(tmp_path_factory) -> bytes:
    return silent_flac(tmp_path_factory.mktemp("flac") / "hours.flac", 2 * 3600)


# --- sniffing and capped decoding, without the server ------------------------------------------


@pytest.mark.unit
def test_containers_are_known_by_their_first_bytes_only(tmp_path, long_flac):
    assert sniff(wav_bytes(tone(0.1))) == "wav"
    assert sniff(long_flac) == "flac"
    assert sniff(b"OggS\x00\x02" + bytes(10)) == "ogg"
    assert sniff(b"ID3\x04\x00" + bytes(10)) == "mp3"
    assert sniff(b"\xff\xfb\x90\x64" + bytes(10)) == "mp3"  # a bare MPEG-1 layer III frame
    assert sniff(b"\xff\xf1\x50\x80" + bytes(10)) == "aac"  # ADTS
    assert sniff(b"\x00\x00\x00\x20ftypM4A " + bytes(8)) == "mp4"
    assert sniff(b"\x1a\x45\xdf\xa3" + bytes(12)) == "matroska"
    for hostile in (
        zipped("a.wav", wav_bytes(tone(0.1))),
        pickle.dumps(Canary(tmp_path / "never")),
        b"#EXTM3U\n#EXTINF:10,\nfile:///etc/passwd\n",
        b"\x89PNG\r\n\x1a\n" + bytes(8),
        b"<html><script>alert(1)</script></html>",
        b"\xff\xff\xff\xff" + bytes(12),  # a frame sync with reserved fields
        b"",
    ):
        assert sniff(hostile) is None, hostile[:16]
    liar = tmp_path / "speech.mp3"  # a WAV whose name lies is still read as the WAV it is
    liar.write_bytes(wav_bytes(tone(0.5)))
    assert probe(liar) == pytest.approx(0.5)
    text = tmp_path / "speech.wav"
    text.write_text("not audio at all\n" * 10)
    with pytest.raises(UnreadableAudio, match="not a recognised audio file"):
        probe(text)


@pytest.mark.parametrize(
    ("header", "error", "message"),
    [
        (wav_header(rate=4_000_000_000, byte_rate=0), UnsupportedAudio, "sample rate"),
        (wav_header(rate=7), UnsupportedAudio, "sample rate"),
        (wav_header(channels=65535, align=0, byte_rate=0), UnsupportedAudio, "channels"),
        (wav_header(channels=0, align=0, byte_rate=0), UnsupportedAudio, "channels"),
        (wav_header(rate=48000, byte_rate=32000), UnsupportedAudio, "does not add up"),
        (wav_header(bits=0), UnsupportedAudio, "does not add up"),
        (wav_header(data=0xFFFFFFF0), UnreadableAudio, "claims 4294967280 bytes"),
        (b"RIFF\x00\x00\x00\x00WAVEdata\x10\x00\x00\x00" + bytes(16), UnreadableAudio, "fmt"),
    ],
)
@pytest.mark.unit
def test_absurd_wav_headers_are_refused_before_decoding(tmp_path, header, error, message):
    with pytest.raises(error, match=message):
        check_wav_header(header, len(header))
    path = tmp_path / "absurd.wav"
    path.write_bytes(header)
    with pytest.raises(error, match=message):
        decode(path, 60)


@pytest.mark.unit
def test_a_header_claiming_too_much_is_refused_before_decoding(tmp_path, long_flac):
    path = tmp_path / "hours.flac"
    path.write_bytes(long_flac[:16384])  # the header and a few frames: 7200 s only if read there
    with pytest.raises(AudioTooLong, match="header claims 7200 s"):
        probe(path, 600)


@pytest.mark.unit
def test_decoding_stops_at_the_cap_when_the_header_does_not_say(tmp_path, long_flac):
    path = tmp_path / "unknown-length.flac"
    path.write_bytes(without_length(long_flac))
    with pytest.raises(AudioTooLong, match="longer than the 30 s limit"):
        decode(path, 30)
    with pytest.raises(AudioTooLong, match="longer than the 30 s limit"):
        probe(path, 30)
    assert probe(path) == pytest.approx(7200, abs=1)  # only a cap stops it


@pytest.mark.unit
def test_ids_are_checked_whole_and_children_stay_under_their_root(tmp_path):
    assert is_voice_id("dev-a") and is_job_id("job-0123456789abcdef")
    for bad in (
        "dev-a\n",
        "../x",
        "/abs",
        "..",
        "%2e%2e",
        "\uff56\uff4f\uff49\uff43\uff45",  # fullwidth
        "\u202ex",
        "a\0b",
        "a" * 65,
    ):
        assert not is_voice_id(bad), bad
    assert not is_job_id("job-0123456789abcdef\n") and not is_job_id("../job-0123456789abcdef")
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    assert child(root, "x") == root / "x"
    (root / "out").symlink_to(outside)
    for bad in ("..", ".", "a/b", "/abs", "a\0b", "", "out"):
        with pytest.raises(ValueError):
            child(root, bad)


@pytest.mark.unit
def test_a_pickle_named_safetensors_is_refused_unread(dev_model, tmp_path, rules):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "adapter_config.json").write_bytes(
        (dev_model.adapters / "dev-b" / "adapter_config.json").read_bytes()
    )
    canary = tmp_path / "canary"
    for payload in (pickle.dumps(Canary(canary)), zipped("archive/data.pkl", b"\x80\x02.")):
        (folder / "adapter_model.safetensors").write_bytes(payload)
        with pytest.raises(InvalidAdapter, match="pickle or torch archive"):
            validate_adapter(folder, rules)
    huge_header = (2**62).to_bytes(8, "little") + b"{}"
    (folder / "adapter_model.safetensors").write_bytes(huge_header)
    with pytest.raises(InvalidAdapter, match="bad header"):
        validate_adapter(folder, rules)
    assert not canary.exists()


# --- over HTTP ----------------------------------------------------------------------------------


HTTP_TIMEOUT = 60  # conftest's `http` session


class PeakMemory:
    """The server process's largest RSS, sampled every 5 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.peak = self.process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


async def post_timed(http, server, form) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with http.post(server.url + "/v1/voices", data=form) as response:
        body = await response.json(content_type=None)
        return response.status, body, time.monotonic() - started


def audio_form(filename: str, data: bytes, **fields: str) -> aiohttp.FormData:
    form = aiohttp.FormData()
    for key, value in {"voice_id": f"hostile-{secrets.token_hex(3)}", **fields}.items():
        form.add_field(key, value)
    form.add_field("audio", data, filename=filename)
    return form


def tree(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


async def test_hostile_audio_is_refused_fast_without_memory_growth(http, server, long_flac):
    speech = wav_bytes(tone(1.0))
    forged = bytearray(speech)
    struct.pack_into("<I", forged, 24, 48000)  # the rate says 48 kHz, the byte rate 16 kHz
    corpus = {
        "tiny wav, absurd header": (
            "tiny.wav",
            wav_header(rate=4_000_000_000, channels=65535, align=0, byte_rate=0, data=2**32 - 1),
            415,
            "unsupported_audio",
        ),
        "forged sample rate": ("forged.wav", bytes(forged), 415, "unsupported_audio"),
        "hours at a low bitrate": ("hours.flac", long_flac, 413, "audio_too_long"),
        "hours, length not in the header": (
            "hours.flac",
            without_length(long_flac),
            413,
            "audio_too_long",
        ),
        "text named .wav": ("speech.wav", b"<html>not audio</html>" * 50, 415, "not_audio"),
        "zip": ("speech.wav", zipped("speech.wav", speech), 415, "not_audio"),
        "pickle named .wav": (
            "speech.wav",
            pickle.dumps(Canary(server.adapters / "canary")),
            415,
            "not_audio",
        ),
        "playlist named .mp3": ("a.mp3", b"#EXTM3U\n#EXTINF:9,\n/etc/passwd\n", 415, "not_audio"),
        "file name of 5000 characters": ("a" * 5000 + ".wav", b"junk" * 10, 415, "not_audio"),
        "file name leaving the folder": (
            "../../../escaped.wav",
            zipped("x", b""),
            415,
            "not_audio",
        ),
        "oversized upload": ("big.wav", os.urandom(21_000_000), 413, "upload_too_large"),
    }
    jobs = server.adapters.parent / "jobs"
    before = tree(server.adapters.parent)
    with PeakMemory(server.process.pid) as memory:
        for name, (filename, data, status, code) in corpus.items():
            answer, body, seconds = await post_timed(http, server, audio_form(filename, data))
            assert (answer, body["error"]["code"]) == (status, code), (name, body)
            assert seconds < ANSWER_SECONDS, (name, seconds)
        form = audio_form("a.wav", speech, name="x" * 5_000_000)  # a form field is no file
        answer, body, seconds = await post_timed(http, server, form)
        assert (answer, body["error"]["code"]) == (413, "upload_too_large")
    assert memory.peak - memory.before < MAX_GROWTH, (memory.before, memory.peak)
    assert not (server.adapters / "canary").exists()
    assert {p for p in tree(server.adapters.parent) - before if jobs not in p.parents} == set()
    assert not any(p.name == "escaped.wav" for p in tree(server.adapters.parent.parent))


BOUNDARY = "hostile-boundary"


def gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (a two-hundredth of that on the wire)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(inflated >> 20)) + packer.flush()


async def post_raw(http, server, body: bytes) -> tuple[int, dict, float]:
    started = time.monotonic()
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    async with http.post(server.url + "/v1/voices", data=body, headers=headers) as response:
        answer = await response.json(content_type=None)
        return response.status, answer, time.monotonic() - started


async def test_malformed_multipart_is_400_and_no_part_is_inflated(http, server):
    start = f"--{BOUNDARY}\r\n".encode()
    end = f"\r\n--{BOUNDARY}--\r\n".encode()
    field = b'Content-Disposition: form-data; name="name"\r\n'
    malformed = {
        "empty": b"",
        "never ends": start + field + b"\r\nvalue",
        "bad header": start + b"Bad\x00Header: \xff\r\n\r\nx" + end,
        "header line of 200 KB": start + b"X-Long: " + b"a" * 200_000 + b"\r\n\r\nx" + end,
        "nested multipart": start
        + field
        + b"Content-Type: multipart/mixed; boundary=inner\r\n\r\n--inner\r\n\r\nx\r\n--inner--"
        + end,
    }
    for name, body in malformed.items():
        status, answer, seconds = await post_raw(http, server, body)
        assert (status, answer["error"]["code"]) == (400, "invalid_multipart"), (name, answer)
        assert seconds < ANSWER_SECONDS, (name, seconds)
    bomb = start + field + b"Content-Encoding: gzip\r\n\r\n" + gzip_bomb(400 << 20) + end
    with PeakMemory(server.process.pid) as memory:
        status, answer, seconds = await post_raw(http, server, bomb)
    assert (status, answer["error"]["code"]) == (413, "upload_too_large"), answer
    assert seconds < ANSWER_SECONDS
    assert memory.peak - memory.before < MAX_GROWTH, (memory.before, memory.peak)


def adapter_form(dev_model, voice_id, config=None, weights=None, filename=None, config_raw=None):
    folder = dev_model.adapters / "dev-b"
    form = aiohttp.FormData()
    form.add_field("voice_id", voice_id)
    config = config or json.loads((folder / "adapter_config.json").read_text())
    raw = config_raw if config_raw is not None else json.dumps(config).encode()
    form.add_field("adapter_config", raw, filename="adapter_config.json")
    weights = weights or (folder / "adapter_model.safetensors").read_bytes()
    form.add_field("adapter_model", weights, filename=filename or "adapter_model.safetensors")
    return form


async def test_a_pickle_adapter_is_refused_and_never_unpickled(http, server, dev_model, tmp_path):
    canary = tmp_path / "canary"
    payload = pickle.dumps(Canary(canary))
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(Canary(proof)))  # the payload is live: loading it makes the file
    assert proof.exists()
    for filename in ("adapter_model.safetensors", "adapter_model.bin"):
        form = adapter_form(dev_model, "pickled", weights=payload, filename=filename)
        status, body, seconds = await post_timed(http, server, form)
        assert (status, body["error"]["code"]) == (400, "invalid_adapter"), body
        assert "pickle" in body["error"]["message"] and seconds < ANSWER_SECONDS
    assert not canary.exists()
    assert not (server.adapters / "pickled").exists()


def changed(dev_model, **changes):
    config = json.loads((dev_model.adapters / "dev-b" / "adapter_config.json").read_text())
    return json.dumps({**config, **changes}).encode()


async def test_each_bad_adapter_config_is_refused(http, server, dev_model):
    bad = {
        "rank too high": (changed(dev_model, r=64), "exceeds max_lora_rank"),
        "rank not a number": (changed(dev_model, r=True), "rank"),
        "modules_to_save": (changed(dev_model, modules_to_save=["lm_head"]), "modules_to_save"),
        "bias": (changed(dev_model, bias="lora_only"), "bias"),
        "unknown target": (changed(dev_model, target_modules=["q_proj", "lm_head"]), "target"),
        "target regex": (changed(dev_model, target_modules=".*"), "target_modules"),
        "wrong base model": (
            changed(dev_model, base_model_name_or_path="meta-llama/Llama-3.2-3B"),
            "base model",
        ),
        "dora": (changed(dev_model, use_dora=True), "use_dora"),
        "not JSON": (b"{r: 16,", "not valid JSON"),
        "not an object": (b"[16]", "must be a JSON object"),
        "nested too deep": (b"[" * 50_000 + b"]" * 50_000, "adapter_config.json is over"),
        "deep but small": (b"[" * 30_000 + b"]" * 30_000, "not valid JSON"),
    }
    before = tree(server.adapters)
    for name, (config, message) in bad.items():
        form = adapter_form(dev_model, "bad-config", config_raw=config)
        status, body, seconds = await post_timed(http, server, form)
        assert (status, body["error"]["code"]) == (400, "invalid_adapter"), (name, body)
        assert message in body["error"]["message"], (name, body)
        assert seconds < ANSWER_SECONDS, (name, seconds)
    assert tree(server.adapters) == before


HOSTILE_IDS = [
    "../escape",
    "../../escape",
    "/tmp/escape",
    "%2e%2e%2fescape",
    "..%2fescape",
    "..",
    "\uff45\uff53\uff43\uff41\uff50\uff45",  # fullwidth
    "\u202eepacse",  # right-to-left override
    "esc\x00ape",
    "Escape",
    "e" * 65,
]


PATH_IDS = [  # as sent on the wire: aiohttp percent-decodes them before routing
    "dev-a%0A",
    "%2e%2e",
    "..%2F..%2Fescape",
    "%2e%2e%2fescape",
    "%EF%BD%85scape",  # fullwidth e
    "%E2%80%AEx",
    "a%00b",
    "e" * 65,
    "DEV-A",
]


def escaped(root: Path) -> list[Path]:
    """Anything named like the hostile ids near ``root`` or at the absolute path tried."""
    near = [p for p in root.parent.rglob("*") if "escape" in p.name or "epacse" in p.name]
    return near + [p for p in (Path("/tmp/escape"),) if p.exists()]


async def test_hostile_ids_are_refused_and_nothing_is_written_outside(http, server, dev_model):
    async def answer(method: str, path: str) -> tuple[int, str | None]:
        url = URL(server.url + path, encoded=True)
        async with http.request(method, url) as response:
            body = await response.json(content_type=None) if response.status != 404 else {}
            return response.status, (body or {}).get("error", {}).get("code")

    root = server.adapters.parent
    before = tree(root)
    for voice_id in HOSTILE_IDS:  # in a form: the upload would make the folder
        status, body, _ = await post_timed(http, server, adapter_form(dev_model, voice_id))
        assert (status, body["error"]["code"]) == (400, "invalid_voice_id"), (voice_id, body)
    for raw in PATH_IDS:
        for method in ("GET", "DELETE"):
            assert await answer(method, f"/v1/voices/{raw}") == (400, "invalid_voice_id"), raw
            job = f"job-0123456789abcdef{raw}"
            assert await answer(method, f"/v1/jobs/{job}") == (400, "invalid_job_id"), raw
        status, _ = await answer("POST", f"/v1/jobs/{raw}/retry")
        assert status == 400, raw
    for raw in ("../dev-a", "../../healthz"):  # dot segments never reach a handler
        status, _ = await answer("DELETE", f"/v1/voices/{raw}")
        assert status in (400, 404), raw
    jobs = root / "jobs"
    assert {p for p in tree(root) - before if jobs not in p.parents} == set()
    assert escaped(root) == []
    async with http.get(server.url + "/v1/voices/dev-a") as response:
        assert response.status == 200  # nothing was deleted
