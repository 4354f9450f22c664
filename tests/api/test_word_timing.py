"""Word timing over HTTP, on the shared dev server (no settings of its own): ``speech.word``
events in ``POST /v1/audio/speech``'s SSE, and ``POST /v1/audio/speech/captioned``'s JSON. The
spans point into the client's text, through a lexicon's rewrites and a normalised number; a
streamed word comes after the audio that ends it. The realtime socket's words are tested in
``test_realtime.py``, the gateway's relay in ``tests/cluster``, a forced aligner in
``test_frontends.py``."""

import base64
import json

from voicehost.api.edge import VERSION_HEADER
from voicehost.api.speech import CaptionedSpeech

SPEECH = "/v1/audio/speech"
CAPTIONED = "/v1/audio/speech/captioned"
# a lexicon rewrites two words (one to fewer letters, one to more), and $42.50 is said in words
TEXT = "Our Kubernetes bill was $42.50, Dr. Smith said. Then k8s ran the shop for us."
LEXICON = {
    "entries": [
        {"grapheme": "Kubernetes", "alias": "kubes"},
        {"grapheme": "k8s", "alias": "kates the cluster"},
    ]
}


async def with_lexicon(http, server) -> None:
    async with http.put(server.url + "/v1/lexicons/timing", json=LEXICON) as response:
        assert response.status in (200, 201), await response.text()


# what each word of TEXT was said as: the lexicon's aliases, the money and the title in words
SAID = [
    "Our",
    "kubes",
    "bill",
    "was",
    "forty-two dollars, fifty cents,",
    "Doctor",
    "Smith",
    "said.",
    "Then",
    "kates the cluster",
    "ran",
    "the",
    "shop",
    "for",
    "us.",
]


def assert_words_of(words: list[dict], text: str) -> None:
    """Every word of ``text`` once, in order, its span in ``text``, its times in order."""
    assert [text[w["start"] : w["end"]] for w in words] == text.split()
    assert [w["text"] for w in words] == text.split()
    assert [w["said"] for w in words] == SAID
    starts = [w["audio_start"] for w in words]
    assert starts == sorted(starts)
    assert all(w["audio_end"] >= w["audio_start"] for w in words)


async def test_sse_words_point_into_the_clients_text_and_follow_the_audio_that_ends_them(
    http, server
):
    await with_lexicon(http, server)
    body = {
        "input": TEXT,
        "voice": "dev-a",
        "response_format": "pcm",
        "stream_format": "sse",
        "timestamps": "word",
        "lexicons": ["timing"],
        "speed": 1.25,
    }
    async with http.post(server.url + SPEECH, json=body) as response:
        assert response.status == 200, await response.text()
        text = (await response.read()).decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    samples, words = 0, []
    for event in events[:-1]:
        if event["type"] == "speech.audio.delta":
            samples += len(base64.b64decode(event["audio"])) // 2
        else:
            assert event["type"] == "speech.word"
            # its audio has all been sent (after speed), give or take the millisecond it is
            # floored to
            assert event["audio_end"] * 24000 <= samples + 24, (event, samples)
            assert event["aligner"] == "estimated"
            words.append(event)
    assert samples == events[-1]["samples"]
    assert_words_of(words, TEXT)
    assert words[-1]["audio_end"] * 24000 <= samples + 24


async def test_the_captioned_endpoint_answers_the_audio_and_every_word_at_once(http, server):
    await with_lexicon(http, server)
    body = {"input": TEXT, "voice": "dev-b", "response_format": "wav", "lexicons": ["timing"]}
    body["speed"] = 1.25  # the time stretch's samples are counted as sent, not estimated
    async with http.post(server.url + CAPTIONED, json=body) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.headers[VERSION_HEADER] == "1"
        captioned = CaptionedSpeech.model_validate(await response.json())
    audio = base64.b64decode(captioned.audio)
    assert audio[:4] == b"RIFF" and captioned.content_type == "audio/wav"
    assert (len(audio) - 44) // 2 == captioned.samples > 0
    assert captioned.audio_seconds == round(captioned.samples / 24000, 4)
    assert captioned.aligner == "estimated"
    words = [word.model_dump() for word in captioned.words]
    assert_words_of(words, TEXT)
    assert words[-1]["audio_end"] <= captioned.audio_seconds


async def test_word_timing_where_the_answer_has_no_place_for_it_is_a_400(http, server):
    async def error(path: str, **fields) -> tuple[int, str]:
        body = {"input": "Hello there.", "voice": "dev-a", **fields}
        async with http.post(server.url + path, json=body) as response:
            return response.status, (await response.json())["error"]["code"]

    assert await error(SPEECH, timestamps="word") == (400, "invalid_request")  # raw audio
    assert await error(SPEECH, timestamps="char", stream_format="sse") == (400, "invalid_request")
    assert await error(CAPTIONED, stream_format="sse") == (400, "invalid_request")
    assert await error(CAPTIONED, voice="nobody") == (404, "voice_not_found")
    assert await error(CAPTIONED, input="...") == (400, "empty_input")


async def test_a_voice_reads_its_text_by_its_languages_rules_and_says_so_word_by_word(http, server):
    """The shared server's ``pierre`` speaks French: its text is read by French rules (the
    price in its order, the date's day), each word saying what it was said as; the same text
    for an English voice is read by English rules."""
    text = "Le billet coûte 42,50 € le 3 mars."

    async def said(voice: str) -> dict[str, str]:
        body = {"input": text, "voice": voice, "response_format": "wav", "seed": 3}
        async with http.post(server.url + CAPTIONED, json=body) as response:
            assert response.status == 200, await response.text()
            captioned = CaptionedSpeech.model_validate(await response.json())
        assert {w.text for w in captioned.words} <= set(text.split())  # a sign is no word
        return {w.text: w.said for w in captioned.words}

    french = await said("pierre")
    assert french["42,50"] == "quarante-deux euros cinquante"  # with its sign, in its order
    assert french["3"] == "trois" and french["billet"] == "billet"
    english = await said("tara")
    assert english["3"] == "three" and "quarante" not in " ".join(english.values())
