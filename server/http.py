"""The HTTP API, served by aiohttp inside the server's own event loop.

GET /          the live dashboard: one self-contained HTML page (server/dashboard/)
GET /events    server-sent events: the /status document every ``event_seconds`` (config),
               a comment line at least every ``KEEPALIVE_SECONDS`` between, and the last
               document (state ``stopping``) when the server stops, before it closes
GET /status    JSON: mode, versions, epochs, accuracies, queues, a row per worker
GET /metrics   Prometheus text format
GET /weights   the current weights as .npz
GET /healthz   200 "ok" while the server runs; its ``X-Snet-Worker-Port`` header names the
               worker port, for a worker given this port by mistake (client/port_probe.py)
GET /control   JSON: the staleness policy in force and its changes
POST /control  JSON ``{"staleness": "bounded:2"}``: another staleness policy from the
               next step (docs/staleness.md), answered once a checkpoint holds it; 400 for
               a bad one, with the reason; 503 when it could not be checkpointed (taken
               back: server/control.py)

With a token every path but /healthz needs it (server/security.py). Without a token the
read-only paths are open to whoever reaches the port (on loopback, by an IP address,
localhost or this machine's name), but POST /control only to clients on loopback (403
otherwise): changing how training runs is never left open to the network (a server
without a token listens beyond loopback only with ``--insecure``), nor to web pages that
a browser on this machine opens (server/security.py's browser middleware).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from importlib import resources
from typing import TYPE_CHECKING

from aiohttp import web

from .control import Control
from .export import current_weights_npz
from .metrics import metrics_text
from .security import bearer_middleware, browser_middleware, is_loopback
from .status import StatusText, status_document

if TYPE_CHECKING:
    from .app import SnetServer

SERVER_KEY: web.AppKey[SnetServer] = web.AppKey("snet_server")
STATUS_KEY: web.AppKey[StatusText] = web.AppKey("snet_status_text")
# /events is never silent longer (a comment between documents pushed further apart), so
# a reader tells a live server from a hung one in seconds, whatever --event-seconds says
# (snet status --watch gives up after 5 s: cli/event_stream.py), and proxies keep it open
KEEPALIVE_SECONDS = 2.0


@functools.cache
def dashboard_page() -> bytes:
    """The dashboard's HTML, shipped as package data next to this module."""
    return resources.files("snet.server").joinpath("dashboard/index.html").read_bytes()


async def _dashboard(request: web.Request) -> web.Response:
    return web.Response(
        body=dashboard_page(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )


async def _events(request: web.Request) -> web.StreamResponse:
    """Push the status document as an SSE ``status`` event until the client leaves or
    the server stops (it sends one last document first: shutdown sets ``stopping`` before
    it closes the HTTP side, and the runner's cleanup waits for this handler to end)."""
    server = request.app[SERVER_KEY]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # tell proxies not to hold the stream back
        }
    )
    await response.prepare(request)
    if request.method == "HEAD":
        return response  # the headers only: a stream after them broke a keep-alive client
    loop = asyncio.get_running_loop()
    # the browser went away: a reset while a write waited on it is a ConnectionError
    with contextlib.suppress(ConnectionError):
        await response.write(b"retry: 2000\n\n")
        while True:
            document = request.app[STATUS_KEY].text()
            await response.write(f"event: status\ndata: {document}\n\n".encode())
            if server.stopping.is_set():
                break
            # the next tick of a clock every reader shares, at least half a period away:
            # readers that came at other moments wake together and share one build of
            # the document (StatusText); none gets two documents in a moment
            every = server.config.event_seconds
            due = (math.floor(loop.time() / every + 0.5) + 1) * every
            while (left := due - loop.time()) > 0 and not server.stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(server.stopping.wait(), min(left, KEEPALIVE_SECONDS))
                if due > loop.time() and not server.stopping.is_set():
                    await response.write(b":\n\n")  # a comment: readers skip it
    return response


async def _status(request: web.Request) -> web.Response:
    # built for each request: a client that acted, then asks, is owed what it did
    return web.json_response(status_document(request.app[SERVER_KEY]))


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=metrics_text(request.app[SERVER_KEY]).encode(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def _weights(request: web.Request) -> web.Response:
    server = request.app[SERVER_KEY]
    coordinator = server.coordinator
    payload = current_weights_npz(coordinator)
    return web.Response(
        body=payload,
        content_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="snet-v{coordinator.version}.npz"',
            "X-Snet-Version": str(coordinator.version),
        },
    )


async def _healthz(request: web.Request) -> web.Response:
    port = request.app[SERVER_KEY].port
    return web.Response(text="ok\n", headers={"X-Snet-Worker-Port": str(port)})


def make_app(server: SnetServer, token: str | None = None) -> web.Application:
    """The aiohttp application for one server (with ``token``: every path but /healthz
    needs it; server/security.py)."""
    if token:
        middlewares = [bearer_middleware(token)]
    else:  # what a web page could send through a browser on this machine is refused
        middlewares = [browser_middleware(check_host=is_loopback(server.config.http_bind_host))]
    app = web.Application(middlewares=middlewares)
    app[SERVER_KEY] = server
    app[STATUS_KEY] = StatusText(server)
    control = Control(server, token_required=bool(token))
    app.router.add_get("/", _dashboard)
    app.router.add_get("/events", _events)
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/weights", _weights)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/control", control.state)
    app.router.add_post("/control", control.change)
    return app
