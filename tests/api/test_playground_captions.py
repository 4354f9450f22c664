"""The playground's captions, in a real headless Chromium against the shared dev server: the Speak
view shows the text with the word heard now highlighted, from the stream's word events (SSE's
``speech.word``, the realtime socket's and WebRTC's ``word``) timed by the player's audio clock,
and after a barge-in marks the words heard, a prefix of the text, and no later one; a level
meter shows what plays.

Each test watches the captions' ``data-current`` (the index of the highlighted word) with a
MutationObserver in the page, noting beside each change the word's start in the stream and
the samples the page's AudioWorklet had played by then."""

import re

import pytest
from helpers import open_playground
from playwright.async_api import Page, expect

from voicehost.model.orpheus import SAMPLE_RATE

SENTENCE = "Glue the sheet to the dark blue background, then tell the depth of the well."
LONG_TEXT = (
    "Glue the sheet to the dark blue background, then tell the depth of the well. "
    "These days a chicken leg is a rare dish, and rice is served in round bowls."
)
AHEAD = 0.2  # s: how far the highlight may lead the worklet's last report of what it played

# Each change of the highlighted word: its index, its start (s), the samples played by then,
# and the level meter's value (dBFS).
WATCH = """([captions, samples]) => {
  const element = document.getElementById(captions);
  const counter = document.getElementById(samples);
  const meter = document.getElementById(captions.replace("captions", "meter"));
  window.captionLog = [];
  window.loudest = -60;
  const listen = () => { window.loudest = Math.max(window.loudest, meter.value);
    window.listening = requestAnimationFrame(listen); };
  listen();
  new MutationObserver(() => {
    const index = Number(element.dataset.current);
    if (index < 0) return;
    const span = element.querySelector(`[data-index="${index}"]`);
    window.captionLog.push({index, from: Number(span.dataset.from),
      played: Number(counter.dataset.played || 0)});
  }).observe(element, {attributes: true, attributeFilter: ["data-current"]});
}"""

STATE = """(captions) => {
  const element = document.getElementById(captions);
  const spans = [...element.querySelectorAll(".word")];
  const counter = document.getElementById(captions.replace("captions", "samples"));
  return {text: element.textContent, current: Number(element.dataset.current),
    heard: element.dataset.heard === undefined ? null : Number(element.dataset.heard),
    stoppedAt: Number(element.dataset.stoppedAt), played: Number(counter.dataset.played || 0),
    classes: spans.map((s) => s.className), ends: spans.map((s) => Number(s.dataset.to)),
    log: window.captionLog, loudest: window.loudest};
}"""


@pytest.fixture
async def playground(chromium, server):
    async with open_playground(chromium, server.url) as (page, watch, _):
        await page.locator("#speak-voice").select_option("dev-a")
        yield page
        stopped = "/v1/audio/speech: net::ERR_ABORTED"  # the request a barge-in aborted
        assert [p for p in watch.problems() if not p.endswith(stopped)] == []


async def watch(page: Page, captions: str, samples: str) -> None:
    await page.evaluate(WATCH, [captions, samples])


async def state(page: Page, captions: str) -> dict:
    return await page.evaluate(STATE, captions)


def assert_moves_in_order(log: list[dict], at_least: int) -> list[int]:
    """The highlight went from word to word in the text's order, never ahead of the audio the
    worklet had played: the player's clock, not the words' arrival, moved it."""
    indices = [entry["index"] for entry in log]
    assert indices == sorted(indices), indices
    assert len(set(indices)) >= at_least, indices
    for entry in log:
        assert entry["from"] <= entry["played"] / SAMPLE_RATE + AHEAD, entry
    return indices


def assert_stopped_after(found: dict, log: list[dict], clock: bool = True) -> None:
    """After a barge-in while the last word of ``log`` was highlighted: the words heard are a
    prefix of the text, those that had ended by the player's clock at the barge-in (which had
    passed the highlighted word's start), from the words before the highlighted one to the one
    after it at most (a word may come only after it was heard), and none is highlighted."""
    heard, stopped_at, last = found["heard"], found["stoppedAt"], log[-1]
    assert heard is not None and last["index"] <= heard <= last["index"] + 2, (heard, last)
    assert stopped_at >= last["from"]
    if clock:  # the worklet's: what it had played by the barge-in, and not beyond
        assert stopped_at <= found["played"] / SAMPLE_RATE + AHEAD, (stopped_at, found)
    ends = found["ends"]
    assert all(end <= stopped_at + 1e-3 for end in ends[:heard]), (stopped_at, ends)
    assert all(end > stopped_at for end in ends[heard:]), (stopped_at, ends)
    assert found["current"] == -1
    classes = found["classes"]
    assert not any("speaking" in c or "spoken" in c for c in classes), classes
    assert all("heard" in c.split() for c in classes[:heard]), classes
    assert all("unheard" in c.split() for c in classes[heard:]), classes


async def test_sse_captions_follow_the_audio_word_by_word_through_the_text(playground):
    page = playground
    await page.locator("#speak-text").fill(SENTENCE)
    await watch(page, "speak-captions", "speak-samples")
    await page.locator("#speak-play").click()
    await expect(page.locator("#speak-status")).to_have_attribute("data-kind", "ok", timeout=60_000)
    # played out: every word spoken, none highlighted
    await page.wait_for_function(
        """() => { const spans = [...document.querySelectorAll("#speak-captions .word")];
          return spans.length > 0 && spans.every((s) => s.classList.contains("spoken"))
            && document.getElementById("speak-captions").dataset.current === "-1"; }""",
        timeout=60_000,
    )
    found = await state(page, "speak-captions")
    indices = assert_moves_in_order(found["log"], at_least=4)
    words = len(SENTENCE.split())
    print(f"SSE: {words} words, highlighted in turn: {indices}; loudest {found['loudest']} dBFS")
    # the words are spans over the text as typed: its punctuation and spaces kept
    assert found["text"] == SENTENCE and len(found["classes"]) == words
    assert found["heard"] is None  # no barge-in, nothing marked heard
    assert found["loudest"] > -60  # the meter moved with what played


async def test_sse_captions_stop_at_a_barge_in_and_mark_the_words_heard(playground):
    page = playground
    await page.locator("#speak-text").fill(LONG_TEXT)
    await watch(page, "speak-captions", "speak-samples")
    await page.locator("#speak-play").click()
    await page.wait_for_function(
        "() => Number(document.getElementById('speak-captions').dataset.current) >= 3",
        timeout=60_000,
    )
    await page.locator("#speak-stop").click()
    await expect(page.locator("#speak-status")).to_have_text("Stopped.")
    found = await state(page, "speak-captions")
    indices = assert_moves_in_order(found["log"], at_least=3)
    assert_stopped_after(found, found["log"])
    assert found["heard"] < len(LONG_TEXT.split())  # mid-sentence: not all of it was heard
    await page.wait_for_timeout(600)
    later = await state(page, "speak-captions")  # nothing moves after the barge-in
    assert later["log"] == found["log"] and later["heard"] == found["heard"]
    assert_stopped_after(later, found["log"])
    print(f"SSE barge-in at word {indices[-1]}: {found['heard']} words heard, then nothing")


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
async def test_live_captions_follow_the_audio_and_stop_at_a_barge_in(playground, transport):
    """Type as you go, over the realtime socket (PCM into the worklet) or WebRTC (the track's
    own clock): the text sent is captioned as it is spoken, and Stop marks what was heard."""
    page = playground
    await page.locator("#transport").select_option(transport)
    await page.locator("#transport").dispatch_event("change")
    await watch(page, "live-captions", "live-samples")
    await page.locator("#live-text").click()
    await page.keyboard.type(LONG_TEXT)
    await page.wait_for_function(
        "() => Number(document.getElementById('live-captions').dataset.current) >= 3",
        timeout=90_000,
    )
    await page.locator("#live-stop").click()
    await expect(page.locator("#live-status")).to_have_text(re.compile("^Stopped"))
    found = await state(page, "live-captions")
    indices = [entry["index"] for entry in found["log"]]
    socket = transport == "websocket"
    if socket:
        assert_moves_in_order(found["log"], at_least=3)
    else:  # the worklet plays nothing over WebRTC: the order, and the track's meter
        assert indices == sorted(indices) and len(set(indices)) >= 3, indices
    assert_stopped_after(found, found["log"], clock=socket)
    assert found["heard"] < len(LONG_TEXT.split())
    assert found["text"] == LONG_TEXT  # what was typed, all sent, the words spans over it
    assert found["loudest"] > -60
    await page.wait_for_timeout(600)
    later = await state(page, "live-captions")
    assert later["log"] == found["log"] and later["heard"] == found["heard"]
    print(f"{transport} barge-in at word {indices[-1]}: {found['heard']} words heard")
