"""A serving process's life: listen until SIGTERM or SIGINT, then drain and exit.

Draining stops admitting (``/readyz`` answers 503 at once, so a load balancer stops sending),
lets the streams in flight finish for up to the drain timeout, and only then closes the
listener and the serving process. A second signal skips the rest of the drain.

Every connection is aiohttp's, but for one thing (``EdgeRunner``): a client that ends its
sending side (a half-close: ``shutdown(SHUT_WR)``) still gets its answer. aiohttp closes the
connection there (aio-libs/aiohttp#3659), so a body cut short by that end was never answered;
now it reads as ``RequestPayloadError`` (the edge's ``400 invalid_body``, "received 20 of 56
bytes"), a whole request is answered as usual, and the connection closes after the answer.
The price: a client that closes outright while its request is handled looks the same to the
server (a FIN) until a write to it fails, so its handler is no longer cancelled at once; a
stream finds out at its next write (the first audio), a JSON route once it answers.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from voicehost.api.auth import AUTH, Authenticator, bind_host

if TYPE_CHECKING:
    from voicehost.config import Settings
    from voicehost.host.launcher import FrontEndMain

log = logging.getLogger(__name__)


class _AnsweringHalfClosed(RequestHandler):
    """aiohttp's connection handler, answering a peer that ended its sending side. (Private
    parts of aiohttp: tests/api/test_bodies.py holds them to what they do.)"""

    _body: object = None  # the newest request's body (the only one a half-close can cut)
    _answered: object = None  # the body of the request whose answer has been written

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages:
            self._body = self._messages[-1][1]

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        self._answered = request.content
        return await super().finish_response(request, resp, start_time)

    def eof_received(self) -> bool | None:
        waiting = self._waiter is not None and not self._waiter.done()  # between requests
        if (
            waiting
            or self._upgraded  # a WebSocket: its reader ends as aiohttp has it
            or self._payload_parser is not None
            or self._parser is None
            or self.transport is None
            or self.transport.get_extra_info("sslcontext") is not None  # TLS cannot half-close
        ):
            return None  # aiohttp's way: the connection closes
        body = self._body
        if isinstance(body, StreamReader) and not body.is_eof() and not body.exception():
            try:
                self._parser.feed_eof()  # raises: the body is shorter than it said
            except HttpProcessingError as exc:
                if body is not self._answered:  # its handler may still read it: that read fails
                    body.set_exception(web.RequestPayloadError(str(exc)), exc)
                body.feed_eof()  # and nothing waits for more of it after the answer
        self.close()  # no request can follow: close once this one is answered
        return True  # keep the sending side open for the answer


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _AnsweringHalfClosed(self, loop=self._loop, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer a half-closed peer (see the module)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server
        return server


async def serve_until_signalled(
    app: web.Application,
    host: str,
    port: int,
    drain: Callable[[], Awaitable[None]],
    in_flight: Callable[[], int],
    drain_timeout: float,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` (or on ``sock``, a bound socket this process shares with
    the host's other front ends); on the first SIGTERM/SIGINT await ``drain()`` (which stops
    admitting and returns once nothing is in flight) for at most ``drain_timeout`` s, or until
    a second signal, then shut down. ``in_flight()`` is for the log."""
    # handlers still running after the drain are cancelled within a second of closing
    runner = EdgeRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site: web.BaseSite = (
        web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)
    )
    await site.start()
    log.info("listening on http://%s:%d", host, port)
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[int] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        received = await signals.get()
        log.info("%s: draining (%d streams in flight)", signal.Signals(received).name, in_flight())
        draining = asyncio.ensure_future(drain())
        again = asyncio.ensure_future(signals.get())
        await asyncio.wait(
            (draining, again), timeout=drain_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        for task in (draining, again):
            task.cancel()
        if draining.done() and not draining.cancelled() and draining.exception() is None:
            log.info("drained: shutting down")
        elif again.done() and not again.cancelled():
            log.warning("second signal: shutting down with %d streams in flight", in_flight())
        else:
            log.warning("drain timeout: shutting down with %d streams in flight", in_flight())
        await asyncio.gather(draining, again, return_exceptions=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()


def serve_app(
    app: web.Application,
    settings: Settings,
    drain: Callable[[], Awaitable[None]],
    in_flight: Callable[[], int],
    sock: socket.socket | None = None,
) -> None:
    """``serve_until_signalled`` on the settings' host (loopback when no key is configured:
    ``bind_host``) and port, with their drain timeout; returns once the process has drained."""
    asyncio.run(
        serve_until_signalled(
            app,
            host=bind_host(settings.host, app[AUTH].enabled),
            port=settings.port,
            drain=drain,
            in_flight=in_flight,
            drain_timeout=settings.drain_timeout_seconds,
            sock=sock,
        )
    )


def serve_host(
    settings: Settings, main: FrontEndMain, role: Literal["serve", "worker"] = "serve"
) -> None:
    """A host of one engine core and ``settings.frontend_count()`` front ends, each running
    ``main`` (``voicehost.host.launcher.serve_frontends``), on the settings' host (loopback
    when no key is configured: ``bind_host``) and port; keys ``role`` cannot use stop it before
    anything starts. Returns once every front end has exited."""
    from voicehost.host.launcher import serve_frontends

    auth = Authenticator.from_settings(settings, role)
    serve_frontends(settings, main, bind_host(settings.host, auth.enabled))
