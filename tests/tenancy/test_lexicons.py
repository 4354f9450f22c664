"""Pronunciation lexicons: the matching rules, the offset map behind the realtime spans, PLS
uploads (hostile ones refused unexpanded) and the limits, as unit tests; then, on the shared dev
server, that a lexicon changes what is said over HTTP, by a voice's manifest and over the
realtime socket, with the spans still in the client's text. (Through a gateway:
tests/test_cluster.py.)

What is said is heard: the dev model is deterministic for a seed and codec noise is off, so the
same prompt gives the same audio and another prompt other audio. A lexicon's request is
compared with one of the rewritten text, and with one of the text as sent.
"""

import asyncio
import json
import random
import time
import tracemalloc

import aiohttp
import numpy as np
import pytest
from helpers import adapter_form

from voicehost.ids import now_iso
from voicehost.model.languages import same_language
from voicehost.tenancy.lexicons import (
    MAX_PLS_DEPTH,
    EntryTooLong,
    FolderLexicons,
    LexiconError,
    LexiconLimits,
    LexiconTooLarge,
    TooManyLexicons,
    UnsafeLexicon,
    checked_entries,
    checked_language,
    parse_pls,
    pls_language,
)
from voicehost.text.lexicon import Lexicon, LexiconEntry, Rewriter, SpokenSegmenter
from voicehost.text.segment import Segment

E = LexiconEntry
LIMITS = LexiconLimits(max_entries=5, max_entry_chars=30, per_tenant=2)
PLS_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" '
    'alphabet="ipa" xml:lang="en-US">'
)

TECH = Lexicon(
    [
        E("Kubernetes", "koo ber net ees"),
        E("New York", "the big apple"),
        E("New York City", "gotham"),
        E("SQL", "sequel", case_sensitive=True),
        E("sql", "ess queue ell"),
        E("laugh", "laff"),
        E("C++", "see plus plus"),
        E("k8s", "kates"),
    ]
)


# --- the matching rules ----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("I run Kubernetes.", "I run koo ber net ees."),
        ("KUBERNETES, kubernetes", "koo ber net ees, koo ber net ees"),  # any case
        ("Kubernetess and xKubernetes and Kubernetes_x", None),  # whole words only
        ("New York City and New York", "gotham and the big apple"),  # longest first
        ("New York Citys", "the big apple Citys"),  # ... where the longer one is a whole word
        ("New\nYork", "the big apple"),  # a space matches any whitespace character
        ("MySQL, SQLite, SQL, sql, Sql", "MySQL, SQLite, sequel, ess queue ell, ess queue ell"),
        ("<laugh> laugh <laugh>", "<laugh> laff <laugh>"),  # tags are never looked into
        ("ha<laugh>ha", None),
        ("C++ and C++11", "see plus plus and C++11"),
        ("(k8s)", "(kates)"),
        ("", None),
    ],
)
def test_entries_replace_whole_words_longest_first_in_their_case_leaving_tags(text, said):
    assert TECH.apply(text) == (text if said is None else said)


@pytest.mark.unit
def test_the_first_lexicon_wins_for_a_word_and_an_alias_is_never_rewritten_again():
    first = [E("GIF", "jif"), E("jif", "peanut butter")]
    second = [E("gif", "gift"), E("PNG", "ping")]
    merged = Lexicon.merged([first, second])
    assert len(merged) == 3
    assert merged.apply("a GIF, a gif, a PNG, jif") == "a jif, a jif, a ping, peanut butter"
    assert Lexicon.merged([second, first]).apply("a GIF") == "a gift"


@pytest.mark.unit
def test_text_in_any_pieces_is_rewritten_alike_and_only_a_possible_match_is_held_back():
    text = "I run Kubernetes in New York City, not New York. SQL <laugh> and k8s, C++ laugh"
    for seed in range(100):
        rng = random.Random(seed)
        rewriter, said, at = Rewriter(TECH), "", 0
        while at < len(text):
            n = rng.randint(1, 7)
            said += rewriter.push(text[at : at + n])
            at += n
        assert said + rewriter.flush() == TECH.apply(text), seed
    rewriter = Rewriter(TECH)
    assert rewriter.push("Hello there, Kube") == "Hello there, "  # "Kube..." may match
    assert rewriter.push("rnete") == ""
    assert rewriter.push("s is") == "koo ber net ees is"
    assert rewriter.push(" <lau") == " "  # a tag may be coming
    assert rewriter.push("gh> New York") == "<laugh> "  # "New York" may go on: " City"
    assert rewriter.flush() == "the big apple"


@pytest.mark.unit
def test_spoken_segments_keep_the_clients_spans_and_say_the_rewrite():
    text = "I deploy Kubernetes daily. Then k8s runs in New York City. " + "Kubernetes " * 12
    segmenter = SpokenSegmenter(TECH, max_chars=80)
    segments = [s for char in text for s in segmenter.push(char)] + segmenter.flush()
    assert "".join(s.text for s in segments) == text  # the spans tile what was sent
    assert "".join(s.speech for s in segments) == TECH.apply(text)
    for segment in segments:
        assert text[segment.start : segment.end] == segment.text
        assert len(segment.speech) <= 80  # cut in what is said
    assert [(s.start, s.end) for s in segments[:2]] == [(0, 26), (26, 58)]
    assert segments[1].speech == " Then kates runs in gotham."
    assert segmenter.flush() == []
    assert segmenter.push("k8s ") == []
    assert segmenter.flush() == [Segment("k8s ", 0, 4, spoken="kates ")]  # from 0 again


@pytest.mark.unit
def test_an_offset_inside_an_alias_maps_to_the_end_of_the_words_it_replaced():
    rewriter = Rewriter(Lexicon([E("W3C", "World Wide Web Consortium")]))
    said = rewriter.push("The W3C rules.") + rewriter.flush()
    assert said == "The World Wide Web Consortium rules."
    assert [rewriter.source_offset(p) for p in (0, 4, 5, 28, 29, 30, 36)] == [0, 4, 7, 7, 7, 8, 14]


@pytest.mark.unit
def test_a_long_text_is_rewritten_in_linear_time():
    lexicon = Lexicon(E(f"word{i}", f"alias {i}") for i in range(1000))
    text = " ".join(f"word{i % 2000}" for i in range(5000))  # 37k characters
    started = time.perf_counter()
    said = lexicon.apply(text)
    assert time.perf_counter() - started < 5.0  # 0.1 s here; a scan per match would take minutes
    assert said.startswith("alias 0 alias 1") and "word1999" in said


# --- uploads, hostile ones and the limits ----------------------------------------------------


@pytest.mark.unit
def test_a_pls_document_gives_its_aliases_as_written_and_skips_phoneme_only_lexemes():
    document = (
        PLS_HEAD + "<lexeme><grapheme>W3C</grapheme><grapheme>W3c</grapheme>"
        "<alias>World Wide Web Consortium</alias><alias>unused</alias></lexeme>"
        "<lexeme><grapheme>tomato</grapheme><phoneme>t@mA:toU</phoneme></lexeme>"
        "<lexeme><grapheme> New\n  York </grapheme><alias>the big apple</alias></lexeme>"
        "</lexicon>"
    )
    entries, skipped = parse_pls(document.encode(), LIMITS)
    assert skipped == 1
    assert entries == [
        E("W3C", "World Wide Web Consortium", case_sensitive=True),
        E("W3c", "World Wide Web Consortium", case_sensitive=True),
        E("New York", "the big apple", case_sensitive=True),
    ]
    assert Lexicon(entries).apply("w3c, W3C") == "w3c, World Wide Web Consortium"


BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY a "ha">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(9))
    + ']><lexicon xmlns="http://www.w3.org/2005/01/pronunciation-lexicon">'
    "<lexeme><grapheme>x</grapheme><alias>&j;</alias></lexeme></lexicon>"
)
EXTERNAL_ENTITY = (
    '<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY secret SYSTEM "file:///etc/passwd">]>'
    '<lexicon xmlns="http://www.w3.org/2005/01/pronunciation-lexicon">'
    "<lexeme><grapheme>x</grapheme><alias>&secret;</alias></lexeme></lexicon>"
)
EXTERNAL_DTD = (
    '<?xml version="1.0"?><!DOCTYPE lexicon SYSTEM "http://127.0.0.1:9/pls.dtd">'
    '<lexicon xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"/>'
)
DEEP = PLS_HEAD + "<lexeme>" + "<x>" * 200_000 + "</x>" * 200_000 + "</lexeme></lexicon>"


@pytest.mark.unit
@pytest.mark.parametrize(
    "document",
    [BILLION_LAUGHS, EXTERNAL_ENTITY, EXTERNAL_DTD, DEEP],
    ids=["entity-expansion", "external-entity", "external-dtd", "deep-nesting"],
)
def test_a_hostile_pls_document_is_refused_without_being_expanded(document):
    """Refused as it is read: at most a few MiB traced (the 1.4 MB deep one included, whose
    whole tree takes about 55 MB; the entities expanded would take gigabytes)."""
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeLexicon):
            parse_pls(document.encode(), LexiconLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.unit
def test_pls_and_entry_limits_have_their_own_errors():
    lexeme = "<lexeme><grapheme>w{}</grapheme><alias>say {}</alias></lexeme>"
    many = PLS_HEAD + "".join(lexeme.format(i, i) for i in range(6)) + "</lexicon>"
    with pytest.raises(LexiconTooLarge):
        parse_pls(many.encode(), LIMITS)
    with pytest.raises(EntryTooLong):
        checked_entries([E("w", "x" * 31)], LIMITS)
    nested = "<x>" * (MAX_PLS_DEPTH - 1) + "</x>" * (MAX_PLS_DEPTH - 1)
    assert parse_pls(f"{PLS_HEAD}{nested}</lexicon>".encode(), LIMITS) == ([], 0)
    deeper = f"{PLS_HEAD}<x>{nested}</x></lexicon>"
    with pytest.raises(UnsafeLexicon):
        parse_pls(deeper.encode(), LIMITS)
    with pytest.raises(LexiconError):
        parse_pls(b"<lexicon><lexeme>", LIMITS)  # not well-formed
    with pytest.raises(LexiconError):
        parse_pls(b"<speak/>", LIMITS)
    for bad in (E(" ", "x"), E("<laugh>", "x"), E("w", "..."), E("w\x00", "x")):
        with pytest.raises(LexiconError):
            checked_entries([bad], LIMITS)


@pytest.mark.unit
async def test_a_tenant_keeps_its_own_lexicons_up_to_its_limit(tmp_path):
    store = FolderLexicons(tmp_path, LIMITS)
    assert await store.put("acme", "one", [E("a", "b")])
    assert await store.put("acme", "two", [E("c", "d")])
    assert not await store.put("acme", "two", [E("e", "f")])  # replaced: no new one
    with pytest.raises(TooManyLexicons):
        await store.put("acme", "three", [E("g", "h")])
    assert await store.put("other", "one", [E("x", "y")])
    assert await store.put(None, "one", [E("z", "w")])  # open mode's shared folder
    assert [x.name for x in await store.list("acme")] == ["one", "two"]
    assert (await store.get("acme", "two")).entries == (E("e", "f"),)
    assert (await store.get("other", "one")).entries == (E("x", "y"),)
    assert await store.get("other", "two") is None
    assert await store.delete("acme", "one") and not await store.delete("acme", "one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_shared", "acme", "other"]


@pytest.mark.unit
async def test_a_lexicon_is_stored_with_an_iso_time_and_one_stored_in_unix_seconds_reads_as_iso(
    tmp_path,
):
    store = FolderLexicons(tmp_path, LIMITS)
    await store.put("acme", "new", [E("a", "b")])
    stored = json.loads(store.path("acme", "new").read_text())["updated"]
    assert stored.endswith("+00:00") and stored <= now_iso()
    assert (await store.get("acme", "new")).updated == stored
    entries = [{"grapheme": "a", "alias": "b", "case_sensitive": False}]
    for name, updated in [("old", 1733061791.5), ("older", "1733061791.5")]:  # before ISO
        store.path("acme", name).write_text(
            json.dumps({"name": name, "updated": updated, "entries": entries})
        )
        assert (await store.get("acme", name)).updated == "2024-12-01T14:03:11.500000+00:00"


@pytest.mark.unit
async def test_a_lexicon_has_a_language_from_its_upload_and_an_old_one_is_english(tmp_path):
    store = FolderLexicons(tmp_path, LIMITS)
    await store.put("acme", "fr", [E("SNCF", "esse enne cé effe")], "fr")
    assert (await store.get("acme", "fr")).language == "fr"
    await store.put("acme", "plain", [E("a", "b")])
    assert (await store.get("acme", "plain")).language == "en"
    entries = [{"grapheme": "a", "alias": "b", "case_sensitive": False}]
    old = {"name": "old", "updated": now_iso(), "entries": entries}  # before languages
    store.path("acme", "old").write_text(json.dumps(old))
    assert (await store.get("acme", "old")).language == "en"
    assert pls_language((PLS_HEAD + "</lexicon>").encode()) == "en-US"
    french = PLS_HEAD.replace('xml:lang="en-US"', 'xml:lang="fr"') + "</lexicon>"
    assert pls_language(french.encode()) == "fr"
    assert pls_language(b"<lexicon/>") is None and pls_language(b"not xml") is None
    assert checked_language("pt-BR") == "pt-BR"
    with pytest.raises(LexiconError):
        checked_language("French")
    assert same_language("en-US", "en") and not same_language("fr", "en")


# --- against the shared dev server -----------------------------------------------------------


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def same_audio(a: bytes, b: bytes) -> bool:
    """Equal up to the float rounding of different decode windows (noise is off)."""
    x, y = pcm(a), pcm(b)
    return x.size == y.size and x.size > 0 and np.abs(x - y).max() <= 64


async def speak(http, server, text: str, voice: str = "dev-a", **options) -> bytes:
    body = {"input": text, "voice": voice, "response_format": "pcm", "seed": 5, **options}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def put(http, server, name: str, body: str | dict, content_type: str | None = None):
    data = json.dumps(body) if isinstance(body, dict) else body
    headers = {"Content-Type": content_type or "application/json"}
    async with http.put(f"{server.url}/v1/lexicons/{name}", data=data, headers=headers) as r:
        return r.status, await r.json()


async def test_a_lexicon_changes_what_is_said_over_http_and_by_a_voices_manifest(
    http, server, dev_model
):
    async def listing() -> dict[str, int]:
        async with http.get(server.url + "/v1/lexicons") as response:
            return {x["name"]: x["entries"] for x in (await response.json())["lexicons"]}

    before = await listing()  # the shared server's: the OpenAPI fuzzer's lexicons among them
    entries = {"entries": [{"grapheme": "Kubernetes", "alias": "kubes"}]}
    assert (await put(http, server, "tech", entries))[0] == 201
    pls = PLS_HEAD + "<lexeme><grapheme>nginx</grapheme><alias>engine x</alias></lexeme></lexicon>"
    status, saved = await put(http, server, "web", pls, "application/pls+xml")
    assert status == 201 and saved["lexicon"]["entries"] == 1
    status, refused = await put(http, server, "bomb", BILLION_LAUGHS, "application/pls+xml")
    assert (status, refused["error"]["code"]) == (400, "unsafe_lexicon")
    form = adapter_form(dev_model, "lexical")  # a voice whose manifest names a default lexicon
    form.add_field("voice", json.dumps({"lexicon": "web"}).encode(), filename="voice.json")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 201, await response.text()
    async with http.post(
        server.url + "/v1/audio/speech",
        json={"input": "Hi.", "voice": "dev-a", "lexicons": ["nobody"]},
    ) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "lexicon_not_found"

    # short texts: the dev model says about twice as long as a text takes to say (a cost)
    sent = "Kubernetes, nginx."
    # tech from the request, web from the voice's manifest; then what they say; then web alone
    both, rewritten, default_only = await asyncio.gather(
        speak(http, server, sent, voice="lexical", lexicons=["tech"]),
        speak(http, server, "kubes, engine x.", voice="lexical"),
        speak(http, server, sent, voice="lexical"),
    )
    assert same_audio(both, rewritten)
    assert not same_audio(both, default_only)

    listed = await listing()
    assert {name: n for name, n in listed.items() if name not in before} == {"tech": 1, "web": 1}
    assert {name: n for name, n in listed.items() if name in before} == before
    entries["entries"].append({"grapheme": "k8s", "alias": "kates", "case_sensitive": True})
    assert (await put(http, server, "tech", entries))[0] == 200  # replaced
    async with http.get(server.url + "/v1/lexicons/tech") as response:
        assert (await response.json())["lexicon"]["entries"][1]["alias"] == "kates"
    async with http.delete(server.url + "/v1/lexicons/web") as response:
        assert response.status == 204
    async with http.get(server.url + "/v1/lexicons/web") as response:
        assert response.status == 404
    async with http.delete(server.url + "/v1/voices/lexical") as response:
        assert response.status == 204


async def test_a_lexicon_applies_to_the_voices_of_its_language(http, server, dev_model):
    """A French lexicon named for an English voice is 400 ``lexicon_language_mismatch`` and
    applies to the shared server's French voice; as an English voice's default it is left
    out, and the voice speaks."""
    french = {"language": "fr", "entries": [{"grapheme": "Kubernetes", "alias": "kubes"}]}
    status, saved = await put(http, server, "fr-tech", french)
    assert status == 201 and saved["lexicon"]["language"] == "fr"
    async with http.get(server.url + "/v1/lexicons/fr-tech") as response:
        assert (await response.json())["lexicon"]["language"] == "fr"
    body = {"input": "Kubernetes.", "voice": "dev-a", "lexicons": ["fr-tech"]}
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["code"] == "lexicon_language_mismatch" and "speaks en" in error["message"]
    body["voice"] = "pierre"  # the shared server's French voice: its language's lexicon applies
    async with http.post(server.url + "/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
    status, refused = await put(http, server, "bad", {"language": "French", "entries": []})
    assert (status, refused["error"]["code"]) == (400, "invalid_lexicon")
    form = adapter_form(dev_model, "franglais")  # its default lexicon is French: left out
    form.add_field("voice", json.dumps({"lexicon": "fr-tech"}).encode(), filename="voice.json")
    async with http.post(server.url + "/v1/voices", data=form) as response:
        assert response.status == 201, await response.text()
    said, rewritten = await asyncio.gather(
        speak(http, server, "Kubernetes.", voice="franglais"),
        speak(http, server, "kubes.", voice="franglais"),  # what the lexicon would have said
    )
    assert not same_audio(said, rewritten)
    for path in ("/v1/voices/franglais", "/v1/lexicons/fr-tech"):
        async with http.delete(server.url + path) as response:
            assert response.status == 204


async def test_a_lexicon_on_the_realtime_socket_is_said_with_spans_in_the_clients_text(
    http, server
):
    lexicon = {"entries": [{"grapheme": "Kubernetes", "alias": "kubes"}]}
    lexicon["entries"].append({"grapheme": "k8s", "alias": "kates"})
    assert (await put(http, server, "realtime", lexicon))[0] in (200, 201)
    sent = ["Kube", "rnetes rocks. Then", " k8s."]  # a word cut between two messages
    said = "kubes rocks. Then kates."

    async def session(pieces: list[str], **config) -> tuple[list[dict], bytes]:
        events, audio = [], b""
        async with http.ws_connect(server.url + "/v1/audio/speech/ws") as ws:
            # without continuity both segments are generated at once
            options = {"response_format": "pcm", "seed": 3, "continuity": False}
            await ws.send_json({"type": "config", "voice": "dev-a", **options, **config})
            for piece in pieces:
                await ws.send_json({"type": "text", "text": piece})
            await ws.send_json({"type": "end"})
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    audio += message.data
                else:
                    events.append(json.loads(message.data))
        return events, audio

    (events, audio), (_, reference), (refused, _) = await asyncio.gather(
        session(sent, lexicons=["realtime"], timestamps="word"),
        session([said]),
        session(sent, lexicons=["nope"]),
    )
    text = "".join(sent)
    # word timing points into the text sent too, whatever the lexicon said instead
    words = [e for e in events if e["type"] == "word"]
    assert [text[w["start"] : w["end"]] for w in words] == text.split()
    started = [e for e in events if e["type"] == "segment.started"]
    assert [(e["text"], e["start"], e["end"]) for e in started] == [
        ("Kubernetes rocks.", 0, 17),
        (" Then k8s.", 17, len(text)),
    ]
    assert events[-1]["type"] == "done"
    assert same_audio(audio, reference)  # said as the rewritten text is
    assert refused[0]["error"]["code"] == "lexicon_not_found"
