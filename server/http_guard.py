"""``HttpListener``: the HTTP port, with bounds on slow and numerous clients.

aiohttp parses requests with bounded lines and headers (8190 bytes each) but, left to its
defaults, lets a client take an hour (its keep-alive timeout, 3630 s) to send a request
line, and takes any number of connections. Here:

- **A request must be in within ``http_header_seconds``** of the connection opening or of
  the previous response on it: the runner's ``keepalive_timeout`` is set to that bound,
  and aiohttp closes a connection whose handler is still waiting for a whole request when
  it expires, partial request line or not (a slowloris); a request's body is read under
  the same bound (server/http.py). A TLS handshake gets the same time.
- **At most ``http_connections`` connections at once**: one more is answered
  ``503 Service Unavailable`` (with ``Retry-After``) and closed before anything of it is
  read, and counted (``http_connections_refused`` in /status and /metrics).

A response being streamed (``/events``, ``/weights``) is not a request being sent: the
bound does not cut it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import typing

from aiohttp import web

log = logging.getLogger("snet.server")

BUSY_BODY = b"the server has too many HTTP connections open; try again shortly\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
    + str(len(BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + BUSY_BODY
)


class _Busy(asyncio.Protocol):
    """A connection over the limit: one 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = typing.cast(asyncio.WriteTransport, transport)  # uvloop's do not subclass
        writer.write(BUSY_RESPONSE)
        writer.close()


class HttpListener:
    """The listening socket of the HTTP port, in front of an ``AppRunner``'s server."""

    def __init__(
        self,
        runner: web.AppRunner,
        max_connections: int,
        header_seconds: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.runner = runner
        self.max_connections = max_connections
        self.header_seconds = header_seconds
        self.tls = tls
        self.refused = 0  # connections answered 503
        self._server: asyncio.Server | None = None

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (their TLS handshake done)."""
        handlers = self.runner.server
        return len(handlers.connections) if handlers is not None else 0

    async def start(self, host: str, port: int) -> int:
        """Listen (``OSError`` if the port is taken); returns the port bound."""
        handlers = self.runner.server
        assert handlers is not None, "the runner is set up first"

        def accept() -> asyncio.BaseProtocol:
            if len(handlers.connections) >= self.max_connections:
                self.refused += 1
                if self.refused == 1 or self.refused % 100 == 0:
                    log.warning("HTTP connection refused (%d open, the limit; %d refused "
                                "so far)", self.max_connections, self.refused)  # fmt: skip
                return _Busy()
            return handlers()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            accept,
            host or None,
            port,
            ssl=self.tls,
            ssl_handshake_timeout=self.header_seconds if self.tls else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting (the runner's cleanup then closes the open connections)."""
        if self._server is not None:
            self._server.close()
