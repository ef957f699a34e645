"""The HTTP API, served by aiohttp inside the server's own event loop.

GET /status    JSON: mode, versions, epochs, accuracies, queues, a row per worker
GET /metrics   Prometheus text format
GET /weights   the current weights as .npz
GET /healthz   200 "ok" while the server runs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .export import current_weights_npz
from .status import metrics_text, status_document

if TYPE_CHECKING:
    from .app import SnetServer

SERVER_KEY: web.AppKey[SnetServer] = web.AppKey("snet_server")


async def _status(request: web.Request) -> web.Response:
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
    return web.Response(text="ok\n")


def make_app(server: SnetServer) -> web.Application:
    """The aiohttp application for one server."""
    app = web.Application()
    app[SERVER_KEY] = server
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/weights", _weights)
    app.router.add_get("/healthz", _healthz)
    return app
