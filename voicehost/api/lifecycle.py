"""A serving process's life: listen until SIGTERM or SIGINT, then drain and exit.

Draining stops admitting (``/readyz`` answers 503 at once, so a load balancer stops sending),
lets the streams in flight finish for up to the drain timeout, and only then closes the
listener and the serving process. A second signal skips the rest of the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)


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
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
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
