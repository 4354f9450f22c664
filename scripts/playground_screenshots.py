"""Screenshots of the web playground's views (docs/playground/*.png), in the system's headless
Chromium, against a dev server with one API key: the Key view with a wrong key (its 401 in
words), Speak's captions while a text plays (the word heard now highlighted; above them the
words heard before a barge-in of typed text), Speak once it has all played, Voices, Clone
before recording, and a clone recorded from Chromium's fake microphone (espeak-ng reading the
prompts) followed to its end, with its data report and evaluation.

Usage::

    python scripts/playground_screenshots.py [--url URL --key KEY] [--out docs/playground]
        [--only captions,speak]

Without ``--url`` it starts a dev server of its own with the key ``demo-key`` and cheap clones
(1 s of speech, 1 epoch, one evaluation sentence, no baseline voice), and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from playwright.async_api import async_playwright, expect

from voicehost.api.playground import clone_prompts
from voicehost.tools.devcorpus import speak
from voicehost.tools.devserver import dev_server

CHROMIUM = "/usr/bin/chromium"
DEMO_KEY = "demo-key"
VIEWS = ("key", "captions", "speak", "voices", "clone", "clone-job")
TYPED = "The birch canoe slid on the smooth planks, glued the sheet to the dark blue background."
SPOKEN = (
    "Hello there. This is voicehost, speaking as it streams, each word highlighted as you hear it."
)


@contextlib.contextmanager
def keyed_server(url: str | None, root: Path) -> Iterator[str]:
    if url is not None:
        yield url
        return
    entry = {
        "id": "demo",
        "tenant": "demo",
        "scopes": ["synthesize", "voices"],
        "sha256": hashlib.sha256(DEMO_KEY.encode()).hexdigest(),
    }
    env = {
        "VOICEHOST_API_KEYS": json.dumps([entry]),
        "VOICEHOST_MIN_SPEECH_SECONDS": "1",
        "VOICEHOST_CLONE_EPOCHS": "1",
        "VOICEHOST_EVAL_SENTENCES": "1",
        "VOICEHOST_EVAL_BASELINES": "0",
    }
    with dev_server(root, ready_timeout=1200, **env) as server:
        yield server.url


async def shoot(url: str, key: str, out: Path, microphone: Path, views: set[str]) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone}",
            ],
        )
        page = await browser.new_page(viewport={"width": 1100, "height": 900})
        await page.goto(url + "/")
        await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=30_000)

        async def save(name: str, part: str | None = None) -> None:
            if name not in views:
                return
            path = str(out / f"{name}.png")
            if part is None:
                await page.screenshot(path=path, full_page=True)
            else:
                await page.locator(part).screenshot(path=path)
            print(f"saved {path}")

        await page.locator("#key-input").fill("not-the-key")
        await page.locator("#key-input").press("Enter")
        await expect(page.locator("#key-status")).to_have_text(re.compile("^401"))
        await save("key")
        await page.locator("#key-input").fill(key)
        await page.locator("#key-input").press("Enter")
        await expect(page.locator("#key-status")).to_have_text("The key works.")

        await page.locator("#tab-speak").click()
        await page.locator("#speak-voice").select_option("dev-a")
        await page.locator("#live-text").click()
        await page.keyboard.type(TYPED)
        highlighted = "([id, n]) => Number(document.getElementById(id).dataset.current) >= n"
        await page.wait_for_function(highlighted, arg=["live-captions", 4], timeout=300_000)
        await page.locator("#live-stop").click()
        await expect(page.locator("#live-status")).to_have_text(re.compile("^Stopped"))
        await page.locator("#speak-text").fill(SPOKEN)
        await page.locator("#speak-play").click()
        await page.wait_for_function(highlighted, arg=["speak-captions", 6], timeout=300_000)
        await save("captions", "#view-speak")
        status = page.locator("#speak-status")
        await expect(status).to_have_attribute("data-kind", "ok", timeout=300_000)
        played = (  # every word heard, none highlighted
            "() => [...document.querySelectorAll('#speak-captions .word')]"
            ".every((s) => s.classList.contains('spoken'))"
            " && document.getElementById('speak-captions').dataset.current === '-1'"
        )
        await page.wait_for_function(played, timeout=60_000)
        await save("speak")
        if not views & {"voices", "clone", "clone-job"}:
            await browser.close()
            return

        await page.locator("#tab-voices").click()
        await expect(page.locator("#voices-list tr").first).to_be_visible()
        await save("voices")

        await page.locator("#tab-clone").click()
        await page.locator("#clone-name").fill("My voice")
        await save("clone")
        for take in range(3):
            await page.locator("#clone-record-start").click()
            await page.wait_for_timeout(1500)
            await page.locator("#clone-record-stop").click()
            await expect(page.locator("#clone-takes li")).to_have_count(take + 1)
        await page.locator("#clone-submit").click()
        job = page.locator("#clone-job-status")
        await expect(job).to_have_text(re.compile("^(done|held|failed)$"), timeout=1_200_000)
        await save("clone-job")
        await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start a dev server)")
    parser.add_argument("--key", default=DEMO_KEY, help="an API key of that server")
    parser.add_argument("--out", type=Path, default=Path("docs/playground"))
    parser.add_argument(
        "--only", default=",".join(VIEWS), help=f"the screenshots to save, of {', '.join(VIEWS)}"
    )
    args = parser.parse_args()
    views = set(args.only.split(","))
    if not views <= set(VIEWS):
        parser.error(f"--only takes some of {', '.join(VIEWS)}")
    root = Path(tempfile.mkdtemp(prefix="voicehost-playground-"))
    microphone = root / "microphone.wav"
    speak(" ".join(clone_prompts()[:3]), microphone, 0.0, "wav", squeeze_pauses=True)
    with keyed_server(args.url, root) as url:
        asyncio.run(shoot(url, args.key, args.out, microphone, views))


if __name__ == "__main__":
    main()
