"""``voicehost.client`` against the dev server: the sync client saves files in the format their
suffix names and streams chunks, the async client's realtime session cancels on barge-in, and
``voicehost say`` (run in this process: no interpreter start) speaks through it."""

from __future__ import annotations

import wave

import pytest

from voicehost import cli
from voicehost.client import ApiError, AsyncClient, Client, format_for

TEXT = "Hi."  # the dev model speaks at most 1.4 s of it


@pytest.mark.unit
def test_a_files_suffix_names_its_format():
    assert [format_for(n) for n in ("a.mp3", "b.WAV", "c.pcm", "d.ogg", "e.ulaw")] == [
        "mp3",
        "wav",
        "pcm",
        "opus",
        "mulaw",
    ]
    with pytest.raises(ValueError, match="cannot tell the audio format"):
        format_for("speech.txt")


def test_the_sync_client_streams_chunks_captions_and_raises_the_servers_refusal(server):
    """(``speak_to_file`` is ``voicehost say``'s: the test below.)"""
    with Client(server.url) as client:
        chunks = list(client.stream(TEXT, "tara", seed=1))
        with pytest.raises(ApiError) as refused:
            client.speak(TEXT, "nobody")
        assert "tts-1" in client.models()
        captioned = client.captioned("Hello there, friend.", "tara", response_format="pcm")
    assert captioned.aligner == "estimated" and captioned.sample_rate == 24000
    assert [w["text"] for w in captioned.words] == ["Hello", "there,", "friend."]
    assert captioned.words[-1]["audio_end"] <= len(captioned.audio) / 2 / 24000
    pcm = b"".join(chunks)
    assert len(chunks) >= 1 and len(pcm) % 2 == 0 and len(pcm) > 4800  # 24 kHz s16le
    assert (refused.value.status, refused.value.code) == (404, "voice_not_found")


async def test_a_realtime_session_cancels_on_barge_in_and_goes_on(server):
    """After ``cancel`` the session yields no audio until the server's ``cancelled``; the same
    socket then speaks new text to its end."""
    async with AsyncClient(server.url) as client, client.realtime("tara", seed=2) as session:
        assert session.ready["voice"] == "tara"
        await session.send_text("Hello there, my friend, how are you today?")
        await session.flush()
        items = aiter(session)
        while not isinstance(await anext(items), bytes):  # the first audio: cut in
            pass
        await session.cancel()
        after_cancel = []
        while (item := await anext(items)) != {"type": "cancelled"}:
            after_cancel.append(item)
        assert not any(isinstance(i, bytes) for i in after_cancel), "audio after cancel"
        await session.send_text(TEXT)
        await session.end()
        rest = [item async for item in items]
    audio = b"".join(i for i in rest if isinstance(i, bytes))
    kinds = [i["type"] for i in rest if isinstance(i, dict)]
    assert kinds[0] == "segment.started" and kinds[-1] == "done" and len(audio) > 4800


def test_say_names_the_format_from_the_suffix(server, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    assert cli.main(["say", TEXT, "--voice", "dev-a", "-o", str(out), "--url", server.url]) == 0
    with wave.open(str(out)) as wav:  # the real sizes in the header, for players that check
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert wav.getnframes() == (out.stat().st_size - 44) // 2 > 0
    said = capsys.readouterr().out
    assert "bytes of wav" in said and " ms" in said
    bad = ["say", "Hi.", "--voice", "nobody", "-o", str(tmp_path / "x.mp3"), "--url", server.url]
    assert cli.main(bad) == 1
    assert "404" in capsys.readouterr().err
