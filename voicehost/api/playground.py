"""The web playground: the page at ``/`` and ``/playground``, its files at ``/playground/NAME``.

The files are the package's ``static/`` folder (HTML, CSS and plain JavaScript modules, no build
step) and work against the public API only, so the page is also a reference client. Every
answer carries a Content-Security-Policy that lets the page load scripts, styles and
connections from its own origin alone (no inline script, no other host: many installs have no
internet), and ``nosniff`` with the right content type.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from aiohttp import web

from voicehost.api.edge import error_response
from voicehost.api.openapi import TEXT, Json, Models, operation

STATIC = Path(__file__).with_name("static")
PAGE = "index.html"
FILE_ROUTE = "/playground/{file}"
FILE_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]*(\.[a-z0-9]+)+")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# 'self' covers the realtime socket (ws: of this origin, CSP 3); blob: is audio the page made
# itself (recorded takes, a downloaded file to play), never another origin.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "media-src 'self' blob:",
        "worker-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def page_files() -> dict[str, Path]:
    """The files the playground serves, by name: those of ``STATIC`` with a known type."""
    return {
        path.name: path
        for path in sorted(STATIC.iterdir())
        if path.is_file() and path.suffix in CONTENT_TYPES and FILE_PATTERN.fullmatch(path.name)
    }


FILES = page_files()


def clone_prompts() -> list[str]:
    """The sentences the Clone view asks a speaker to read, one per take, in its order (the
    ``PROMPTS`` of ``clone.js``): what a test's fake microphone says."""
    source = (STATIC / "clone.js").read_text()
    start = source.index("PROMPTS = [")
    block = source[start : source.index("];", start)]
    return [json.loads(line.strip().rstrip(",")) for line in block.splitlines()[1:]]


def _answer(name: str) -> web.Response:
    path = FILES.get(name)
    if path is None:
        return error_response(404, "not_found", f"the playground has no file {name!r}")
    return web.Response(
        body=path.read_bytes(),  # a few KB from the package, read as served (edits show at once)
        headers={"Content-Type": CONTENT_TYPES[path.suffix], **HEADERS},
    )


async def page(request: web.Request) -> web.Response:
    """``GET /`` and ``GET /playground``: the page."""
    return _answer(PAGE)


async def page_file(request: web.Request) -> web.Response:
    """``GET /playground/NAME``: one of the page's scripts, styles or images; 404 otherwise."""
    return _answer(request.match_info["file"])


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    """The web playground (``voicehost.api.playground``): open, it asks for a key itself."""
    page = operation(
        "The web playground: speak, clone, voices (a client of this API, in the browser)",
        {"200": {"description": "The page.", "content": {"text/html": {"schema": TEXT}}}},
        tag="playground",
    )
    typed = {"text/html", "text/css", "text/javascript", "image/svg+xml"}
    page_file = operation(
        "One of the playground's files (scripts, styles, images)",
        {
            "200": {
                "description": "The file, with its content type.",
                "content": {media: {"schema": TEXT} for media in sorted(typed)},
            },
        },
        tag="playground",
    )
    return {
        "playground": page,
        "playground_alias": page,
        "playground_file": page_file,
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ()
