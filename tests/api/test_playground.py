"""The web playground: its files as served (types, the CSP, no inline script, no remote URL) and
the page in a real headless Chromium against the shared dev server: it loads under its CSP with
no console error and no failed request, lists the voices, plays a spoken sentence as it streams
(every sample counted in the page's audio path), and speaks text as it is typed until the stop
button barges in, over the realtime socket and over WebRTC (the track's energy measured by the
page's analyser, the time to first audio of each). The key and the recorded clone are in
test_auth.py, on the keyed server.

The screenshots in docs/playground/ are scripts/playground_screenshots.py's."""

import re
import time
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from helpers import adapter_form, adapter_parts, metric, open_playground
from playwright.async_api import expect

from voicehost.api import playground
from voicehost.api.auth import AUTH, PUBLIC, ROUTE_ACCESS, Authenticator
from voicehost.api.edge import auth_middleware
from voicehost.api.routes import PUBLIC_ROUTES, add_route, route_access
from voicehost.model.orpheus import SAMPLE_RATE
from voicehost.tenancy.keys import ApiKey, hash_key

SENTENCE = "Hello there."  # short: the dev model says about 2 s
ENERGY = 0.003  # the RMS the page's analyser counts as audio (speak.js' ENERGY_THRESHOLD)
LIVE_TEXT = (
    "Glue the sheet to the dark blue background, then tell the depth of the well. "
    "These days a chicken leg is a rare dish, and rice is served in round bowls. "
)


# --- the files as served -------------------------------------------------------------------------


class Page(HTMLParser):
    """What an HTML page loads, and anything inline in it."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.inline: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for name, value in attrs:
            if name.startswith("on") or name == "style" or "javascript:" in (value or ""):
                self.inline.append(f"<{tag} {name}={value!r}>")
        if tag == "script":
            self.in_script = True
            if not found.get("src"):
                self.inline.append("<script> without src")
            else:
                self.loads.append(found["src"])
        if tag == "link" and found.get("href"):
            self.loads.append(found["href"])
        if tag == "style":
            self.inline.append("<style>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip():
            self.inline.append(f"inline script: {data.strip()[:40]}")


def modules_loaded(source: str) -> list[str]:
    """The files a script loads: its imports and its worklet modules."""
    found = re.findall(r"""from\s+"\./([^"]+)";""", source)
    found += re.findall(r"""addModule\("/playground/([^"]+)"\)""", source)
    return found


PAGE_ROUTES = [r for r in PUBLIC_ROUTES if r.handler in (playground.page, playground.page_file)]


def add_page_routes(app: web.Application) -> None:
    for route in PAGE_ROUTES:
        add_route(app, route, route.handler)


@pytest.fixture
async def page_client():
    app = web.Application()
    add_page_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.mark.unit
async def test_the_page_and_every_file_it_loads_are_served_with_their_type_and_the_csp(
    page_client,
):
    html = await (await page_client.get("/")).text()
    parser = Page()
    parser.feed(html)
    pending = [src.removeprefix("/playground/") for src in parser.loads]
    assert "app.js" in pending and "style.css" in pending and "icon.svg" in pending
    seen = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        response = await page_client.get(f"/playground/{name}")
        assert response.status == 200, name
        suffix = Path(name).suffix
        assert response.headers["Content-Type"] == playground.CONTENT_TYPES[suffix], name
        assert response.headers["Content-Security-Policy"] == playground.CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        if suffix == ".js":
            pending += modules_loaded(await response.text())
    # every script of the page is loaded by it, and nothing else is served
    assert seen == set(playground.FILES) - {"index.html"}
    for path in ("/", "/playground", "/playground/index.html"):
        response = await page_client.get(path)
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert await response.text() == html
    policy = dict(d.split(" ", 1) for d in playground.CONTENT_SECURITY_POLICY.split("; "))
    for directive in ("script-src", "style-src", "connect-src", "img-src", "worker-src"):
        assert policy[directive] == "'self'", directive
    assert policy["default-src"] == "'none'" and policy["media-src"] == "'self' blob:"


@pytest.mark.unit
@pytest.mark.parametrize(
    "name", ["missing.js", "..%2Fplayground.py", "..%2F..%2Fconfig.py", ".hidden", "app.js.bak"]
)
async def test_a_file_the_playground_does_not_have_is_404_in_the_error_shape(page_client, name):
    response = await page_client.get(f"/playground/{name}")
    assert response.status == 404
    if "%2F" not in name:  # one with a slash is no file name: the router's own 404
        assert (await response.json())["error"]["code"] == "not_found"


@pytest.mark.unit
def test_the_page_has_no_inline_script_or_style_and_names_no_other_host():
    parser = Page()
    parser.feed((playground.STATIC / "index.html").read_text())
    assert parser.inline == []
    for path in playground.STATIC.iterdir():
        text = path.read_text()
        urls = set(re.findall(r"[a-z]+://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}
        assert urls == set(), path.name  # no CDN, no other host: many installs are offline
        if path.suffix == ".js":
            for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "Function("):
                assert unsafe not in text, (path.name, unsafe)
    # the key goes into one URL only: the realtime socket's documented api_key parameter
    for path in playground.STATIC.glob("*.js"):
        uses = re.findall(r"[\"']api_key[\"']", path.read_text())  # as a string
        assert len(uses) == (1 if path.name == "api.js" else 0), path.name


@pytest.mark.unit
async def test_with_keys_configured_the_page_is_open_and_the_api_is_not():
    assert {r.path for r in PAGE_ROUTES} == {"/", "/playground", "/playground/{file}"}
    assert {r.access for r in PAGE_ROUTES} == {PUBLIC}
    key = ApiKey(id="k", tenant="t", scopes=["synthesize"], sha256=hash_key("secret-key"))

    async def voices(request):
        return web.json_response({"voices": []})

    listing = next(r for r in PUBLIC_ROUTES if r.path == "/v1/audio/voices")
    app = web.Application(middlewares=[auth_middleware])
    app[AUTH] = Authenticator([key], None)
    app[ROUTE_ACCESS] = route_access([*PAGE_ROUTES, listing])
    add_route(app, listing, voices)
    add_page_routes(app)
    async with TestClient(TestServer(app)) as client:
        for path in ("/", "/playground", "/playground/app.js"):
            assert (await client.get(path)).status == 200, path
        assert (await client.get("/v1/audio/voices")).status == 401
        headers = {"Authorization": "Bearer secret-key"}
        assert (await client.get("/v1/audio/voices", headers=headers)).status == 200


# --- the page in a browser -------------------------------------------------------------------


@pytest.fixture(scope="module")
async def browser_page(chromium, server):
    """One page of the playground on the shared server, for the module's tests in order."""
    async with open_playground(chromium, server.url) as opened:
        yield opened


async def test_the_page_loads_under_its_csp_with_no_console_error_and_lists_the_voices(
    browser_page, server
):
    page, watch, response = browser_page
    assert response.headers["content-security-policy"] == playground.CONTENT_SECURITY_POLICY
    assert watch.problems() == []
    voices = await page.locator("#speak-voice option").evaluate_all("os => os.map(o => o.value)")
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/v1/audio/voices") as listing:
            listing = (await listing.json())["voices"]
    # a voice whose adapter is broken (another module may leave one) is listed, not spoken
    listed = [v["id"] for v in listing if v["status"] != "error"]
    assert sorted(voices) == sorted(listed) and "dev-a" in voices
    # each voice with its language; the sample text follows the picked voice's language
    labels = await page.locator("#speak-voice option").all_text_contents()
    languages = {v["id"]: v["language"] for v in listing if v["status"] != "error"}
    assert all(f"({v}: {languages[v]}, " in label for v, label in zip(voices, labels, strict=True))
    assert languages["pierre"] == "fr" and languages["dev-a"] == "en"
    english = await page.locator("#speak-text").input_value()
    await page.locator("#speak-voice").select_option("pierre")  # the shared server's French voice
    await page.locator("#speak-voice").dispatch_event("change")
    assert (await page.locator("#speak-text").input_value()).startswith("Bonjour.")
    await page.locator("#speak-voice").select_option("dev-a")
    await page.locator("#speak-voice").dispatch_event("change")
    assert await page.locator("#speak-text").input_value() == english
    await page.locator("#speak-text").fill("My own words.")  # the user's text is kept
    await page.locator("#speak-voice").select_option("pierre")
    await page.locator("#speak-voice").dispatch_event("change")
    assert await page.locator("#speak-text").input_value() == "My own words."
    # the Clone view offers the model's languages, its prompts in the one picked
    await page.locator("#tab-clone").click()
    await expect(page.locator("#clone-language option")).to_have_count(2)  # en, fr
    assert await page.locator("#clone-language").input_value() == "en"
    assert await page.locator("#clone-prompt").text_content() == playground.clone_prompts()[0]
    await page.locator("#clone-language").select_option("fr")
    await page.locator("#clone-language").dispatch_event("change")
    assert await page.locator("#clone-prompt").text_content() == (
        "Le petit chat dort sur le canapé bleu."
    )
    await page.locator("#clone-language").select_option("en")
    await page.locator("#clone-language").dispatch_event("change")
    await page.locator("#tab-speak").click()
    assert await page.locator("#tab-key").is_hidden()  # auth is off: no key to ask for
    await page.locator("#tab-voices").click()
    rows = page.locator("#voices-list tr")
    await expect(rows).to_have_count(len(listing))
    assert await page.locator("#voices-list tr[data-voice=dev-a] td").first.text_content() == (
        "adapter"
    )
    # the policy holds: a script the page did not load from its origin does not run
    await page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'document.body.dataset.injected = 1'; document.body.append(s); }"
    )
    assert await page.locator("body").get_attribute("data-injected") is None
    assert any("Content Security Policy" in line for line in watch.console)
    watch.clear()
    # keyboard: the tabs move with the arrow keys
    await page.locator("#tab-voices").focus()
    await page.keyboard.press("ArrowLeft")
    assert await page.locator("#tab-clone").get_attribute("aria-selected") == "true"
    await page.keyboard.press("ArrowLeft")
    await expect(page.locator("#view-speak")).to_be_visible()


async def test_speaking_a_sentence_plays_every_sample_as_it_streams(browser_page, server):
    page, watch, _ = browser_page
    async with aiohttp.ClientSession() as http:
        before = await metric(http, server, "voicehost_audio_seconds_total")
        await page.locator("#speak-voice").select_option("dev-a")
        await page.locator("#speak-text").fill(SENTENCE)
        started = time.monotonic()
        await page.locator("#speak-play").click()
        await expect(page.locator("#speak-status")).to_have_attribute(
            "data-kind", "ok", timeout=60_000
        )
        took = time.monotonic() - started
        after = await metric(http, server, "voicehost_audio_seconds_total")
    samples = int(await page.locator("#speak-samples").text_content())
    ttfa = await page.locator("#speak-ttfa").text_content()
    print(f"the page's player received {samples} samples in {took:.1f} s; first audio {ttfa}")
    # the worklet received every sample the server made for this request
    assert samples > 0 and samples == round((after - before) * SAMPLE_RATE)
    assert re.fullmatch(r"\d+ ms", ttfa) and int(ttfa.split()[0]) < took * 1000
    assert re.fullmatch(r"\d+\.\d\d", await page.locator("#speak-rtf").text_content())
    # and played them: the AudioContext runs (headless too)
    await expect(page.locator("#speak-samples")).not_to_have_attribute("data-played", "0")
    assert watch.problems() == []


async def test_type_as_you_go_speaks_and_stop_barges_in_until_no_engine_request_is_left(
    browser_page, server
):
    page, watch, _ = browser_page
    unfinished = "voicehost_engine_unfinished_requests"
    await page.locator("#live-text").click()
    await page.keyboard.type(LIVE_TEXT)
    await expect(page.locator("#live-samples")).not_to_have_text("0", timeout=60_000)
    async with aiohttp.ClientSession() as http:
        generating = await metric(http, server, unfinished)
        await page.locator("#live-stop").click()
        stopped = time.monotonic()
        await expect(page.locator("#live-status")).to_have_text(re.compile("^Stopped"))
        while (left := await metric(http, server, unfinished)) > 0:
            assert time.monotonic() - stopped < 10, f"{left} engine requests still running"
        drained = time.monotonic() - stopped
    print(f"{generating:.0f} engine requests when stopped; none {drained:.2f} s later")
    assert generating >= 1, "the speech ended before the stop: nothing to barge in on"
    heard = await page.locator("#live-samples").text_content()
    assert re.fullmatch(r"\d+ ms", await page.locator("#live-ttfa").text_content())
    await page.wait_for_timeout(300)
    assert await page.locator("#live-samples").text_content() == heard  # no audio after stop
    assert watch.problems() == []


async def test_type_as_you_go_over_webrtc_plays_the_track_and_times_its_first_audio(
    browser_page, server
):
    """WebRTC selected: the page offers, the server answers, the data channel carries the
    realtime messages and the Opus track the audio, which the page's analyser hears (energy
    measured in the browser's audio path: nothing heard, no pass); the time to first audio is
    shown; stop barges in, and switching back to the socket ends the session (DELETE)."""
    page, watch, _ = browser_page
    sessions = "voicehost_webrtc_sessions"
    body = page.locator("body")
    websocket_ttfa = await body.get_attribute("data-ttfa")  # the socket's, by the test before
    async with aiohttp.ClientSession() as http:
        assert await metric(http, server, sessions) == 0
        await page.locator("#transport").select_option("webrtc")
        await page.locator("#live-text").fill("")  # what the socket said stays said
        await page.locator("#live-text").click()
        typed = time.monotonic()
        await page.keyboard.type(LIVE_TEXT)
        await expect(page.locator("#live-status")).to_have_text(
            re.compile("over WebRTC"), timeout=30_000
        )
        heard = f"() => Number(document.body.dataset.audioEnergy || 0) > {ENERGY}"
        await page.wait_for_function(heard, timeout=60_000)
        took = time.monotonic() - typed
        during = await metric(http, server, sessions)
        await page.locator("#live-stop").click()
        await expect(page.locator("#live-status")).to_have_text(re.compile("^Stopped"))
        await page.wait_for_function(  # the server stopped the track: silence, at once
            f"() => Number(document.body.dataset.audioLevel) < {ENERGY}", timeout=2_000
        )
        await page.locator("#transport").select_option("websocket")
        ended = time.monotonic()
        while (left := await metric(http, server, sessions)) > 0:
            assert time.monotonic() - ended < 10, f"{left} WebRTC sessions still open"
            await page.wait_for_timeout(100)
    ttfa = float(await body.get_attribute("data-ttfa"))
    energy = float(await body.get_attribute("data-audio-energy"))
    shown = await page.locator("#ttfa").text_content()
    connect = await body.get_attribute("data-connect")
    print(
        f"WebRTC: first audio {ttfa:.3f} s after the first key (ready in {float(connect):.3f} s),"
        f" peak RMS {energy:.3f}, heard {took:.1f} s after typing began;"
        f" the socket's first audio before: {websocket_ttfa} s; the page says {shown!r}"
    )
    assert during == 1
    assert await body.get_attribute("data-ttfa-transport") == "webrtc"
    assert 0 < ttfa < 30 and energy > ENERGY
    assert shown.startswith("first audio ") and "(WebRTC)" in shown
    assert re.fullmatch(r"\d+ ms", await page.locator("#live-ttfa").text_content())
    deleted = [what for status, what in watch.responses if what.startswith("DELETE ")]
    assert len(deleted) == 1 and "/v1/audio/speech/webrtc/" in deleted[0]
    assert (204, deleted[0]) in watch.responses
    assert watch.problems() == []


async def test_the_voices_view_lists_a_voices_versions_and_rolls_back(
    browser_page, server, dev_model
):
    """A voice of two versions (dev-a's weights, then dev-c's, live): the page lists both with
    the live one marked, Promote on version 1 rolls back (the API then says 1 is live), and the
    live version offers no Delete."""
    page, watch, _ = browser_page
    async with aiohttp.ClientSession() as http:
        async with http.post(
            server.url + "/v1/voices", data=adapter_form(dev_model, "page-voice", source="dev-a")
        ) as r:
            assert r.status == 201, await r.text()
        base = server.url + "/v1/voices/page-voice"
        async with http.post(base + "/versions", data=adapter_parts(dev_model, "dev-c")) as r:
            assert r.status == 201, await r.text()
        await page.locator("#tab-voices").click()
        await page.locator("#voices-refresh").click()
        row = page.locator("#voices-list tr[data-voice=page-voice]")
        await row.locator("button", has_text="Versions").click()
        title = page.locator("#versions-title")
        await expect(page.locator("#versions-list tr")).to_have_count(2)
        await expect(title).to_have_text("Versions of page-voice (live: 2)")
        live = page.locator("#versions-list tr[data-version='2']")
        assert "(live)" in await live.locator("td").first.text_content()
        assert await live.locator("button").count() == 0  # live: no promote, no delete
        first = page.locator("#versions-list tr[data-version='1']")
        await first.locator("button", has_text="Promote").click()
        await expect(title).to_have_text("Versions of page-voice (live: 1)")
        async with http.get(base + "/versions") as r:
            assert (await r.json())["live"] == 1
        async with http.delete(base) as r:
            assert r.status == 204
    assert watch.problems() == []
