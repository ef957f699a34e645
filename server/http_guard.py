"""``HttpListener``: the HTTP port, with bounds on slow and numerous clients.

aiohttp parses requests with bounded lines and headers (8190 bytes each) but, left to its
defaults, lets a client take an hour (its keep-alive timeout, 3630 s) to send a request
line, and takes any number of connections. Here:

- **A request must be in within ``http_header_seconds``** of the connection opening or of
  the previous response on it: the runner's ``keepalive_timeout`` is set to that bound,
  and aiohttp closes a connection whose handler is still waiting for a whole request when
  it expires, partial request line or not (a slowloris); a ``POST /control`` body gets as
  long again after its headers (server/control.py: ``408``, and the connection closed).
  A TLS handshake gets the same time.
- **At most ``http_connections`` connections at once**, and at most
  ``http_connections_per_address`` of them from one address (transport/addresses.py): one more is
  answered ``503 Service Unavailable`` (with ``Retry-After``) and closed before anything of
  it is read, and counted (``http_connections_refused`` and
  ``http_connections_refused_per_address`` in /status and /metrics). Without the bound per
  address one host could hold every connection (dribbling requests and reconnecting as
  each is closed, or streaming ``/events``) and have the dashboard, ``snet status`` and
  Prometheus answered 503 for as long as it liked.

Both are checked as the connection is made (its peer's address is known only then; for
TLS, once its handshake is done), on the connections aiohttp holds at that moment, so a
burst of connections accepted together is counted one by one.

A response being streamed (``/events``, ``/weights``) is not a request being sent: the
bound does not cut it.

A request aiohttp cannot parse (HTTP/1.1 without ``Host``, a malformed header line) is
answered ``400 Bad Request`` by aiohttp, which also logged a ten-line ERROR traceback for
each: anyone reaching the port, no token needed, could flood the log. ``RequestErrors``
logs them sparingly instead, one line each for the first and every hundredth (the
refusals above are logged alike); an error in snet's own handlers keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import typing
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from snet.transport.addresses import peer_address, start_listening

if typing.TYPE_CHECKING:
    from .config import ServerConfig

log = logging.getLogger("snet.server")


def _unavailable(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


BUSY_RESPONSE = _unavailable(b"the server has too many HTTP connections open; try again shortly\n")
BUSY_HERE_RESPONSE = _unavailable(
    b"the server has too many HTTP connections open from this address (its limit per "
    b"address); try again shortly\n"
)


def _worth_a_line(count: int) -> bool:
    """Whether the ``count``-th of a kind of refusal is logged: the first and every 100th
    (a flood is one line a hundred, its count in it)."""
    return count == 1 or count % 100 == 0


class _Busy(asyncio.Protocol):
    """A connection over a limit: one 503, then closed."""

    def __init__(self, response: bytes) -> None:
        self.response = response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = typing.cast(asyncio.WriteTransport, transport)  # uvloop's do not subclass
        writer.write(self.response)
        writer.close()


class _Gate(asyncio.Protocol):
    """A new connection until it is made: then admitted (handed over to aiohttp's
    handler, which gets every event from then on) or refused."""

    def __init__(self, admit: typing.Callable[[asyncio.BaseTransport], asyncio.Protocol]):
        self.admit = admit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        protocol = self.admit(transport)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


class RequestErrors(logging.LoggerAdapter):
    """The logger aiohttp's request handlers are given (``AppRunner(logger=...)``): a
    request it could not parse is the client's mistake, already answered 400, so it is
    logged in one line, sparingly (module docstring); anything else goes to aiohttp's
    logger, traceback and all."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.malformed = 0  # requests aiohttp could not parse

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            super().exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        self.malformed += 1
        if _worth_a_line(self.malformed):
            first = (exc_info.message or type(exc_info).__name__).strip().splitlines()[:1]
            log.warning("malformed HTTP request answered %d: %.80r (%d so far)",
                        exc_info.code, " ".join(first), self.malformed)  # fmt: skip


class HttpListener:
    """The listening socket of the HTTP port, in front of an ``AppRunner``'s server."""

    def __init__(
        self,
        runner: web.AppRunner,
        max_connections: int,
        header_seconds: float,
        tls: ssl.SSLContext | None = None,
        per_address: int = 0,
    ) -> None:
        self.runner = runner
        self.max_connections = max_connections
        self.header_seconds = header_seconds
        self.tls = tls
        self.per_address = per_address  # 0: no bound per address
        self.refused = 0  # connections answered 503 at max_connections
        self.refused_per_address = 0  # and at per_address
        self._server: asyncio.Server | None = None

    @classmethod
    def of(
        cls, runner: web.AppRunner, config: ServerConfig, tls: ssl.SSLContext | None
    ) -> HttpListener:
        """The listener ``config`` sets for ``runner``."""
        return cls(runner, config.http_connections, config.http_header_seconds, tls,
                   config.http_per_address)  # fmt: skip

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (their TLS handshake done)."""
        handlers = self.runner.server
        return len(handlers.connections) if handlers is not None else 0

    async def start(self, host: str, port: int) -> int:
        """Listen (``OSError`` if the port is taken); returns the port bound."""
        handlers = self.runner.server
        assert handlers is not None, "the runner is set up first"

        def admit(transport: asyncio.BaseTransport) -> asyncio.Protocol:
            held = handlers.connections
            if len(held) >= self.max_connections:
                self.refused += 1
                if _worth_a_line(self.refused):
                    log.warning("HTTP connection refused (%d open, the limit; %d refused "
                                "so far)", self.max_connections, self.refused)  # fmt: skip
                return _Busy(BUSY_RESPONSE)
            if self.per_address:
                address = peer_address(transport.get_extra_info("peername"))
                if _held_from(address, held) >= self.per_address:
                    self.refused_per_address += 1
                    count = self.refused_per_address
                    if _worth_a_line(count):
                        log.warning("HTTP connection from %s refused (%d open from it, the "
                                    "limit per address; %d refused so far)", address,
                                    self.per_address, count)  # fmt: skip
                    return _Busy(BUSY_HERE_RESPONSE)
            return typing.cast(asyncio.Protocol, handlers())

        self._server = await start_listening(
            lambda: _Gate(admit), host, port, self.tls, self.header_seconds if self.tls else None
        )
        return int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting (the runner's cleanup then closes the open connections)."""
        if self._server is not None:
            self._server.close()


def _held_from(address: str, held: typing.Iterable[RequestHandler]) -> int:
    """How many of aiohttp's connections ``held`` come from ``address`` (at most
    ``http_connections`` of them: counted afresh for each new one, nothing to keep in step)."""
    count = 0
    for handler in held:
        transport = handler.transport  # None once its connection is lost
        if transport is not None and peer_address(transport.get_extra_info("peername")) == address:
            count += 1
    return count
