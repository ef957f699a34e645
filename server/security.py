"""Secure by default: who may talk to the server, over both ports (issue 12).

- A server that listens beyond loopback refuses to start without a token unless told
  ``--insecure``: with no token, anyone who reaches the worker port can change the
  weights, and anyone who reaches the HTTP port can read them.
- The token comes from ``--token-file`` or the ``SNET_TOKEN`` environment variable, so it
  need never be on a command line (where ``ps`` shows it); ``--token`` still works, with a
  warning.
- With a token, every HTTP endpoint but ``/healthz`` needs it, as ``Authorization: Bearer
  TOKEN`` (``snet status`` sends it) or, for a browser, ``?token=TOKEN`` in the address
  (the dashboard passes it on to ``/events``). Tokens are compared in constant time.
- Without a token, on loopback, the HTTP port still meets web pages: a browser on this
  machine sends what any site's page asks of 127.0.0.1. So such a server answers only
  requests addressed to it by an IP address, ``localhost`` or this machine's name (a
  site's own name made to resolve to 127.0.0.1, DNS rebinding, would make its pages
  same-origin with the port and let them read the weights and change the policy), and
  refuses a ``POST`` that a page of another origin sent (cross-site request forgery:
  a form or ``fetch`` in ``text/plain`` needs no permission from the server).
- TLS on both ports (``--tls-cert``, ``--tls-key``; transport/tls.py), with mutual TLS on
  the worker port (``--tls-client-ca``); a worker certificate is then proof enough to
  listen beyond loopback without a token.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from snet.protocol.errors import ConfigError
from snet.transport.handshake_failures import HTTP_PORT, WORKER_PORT, TlsFailures
from snet.transport.tls import CopyingProtocol, read_token_file, server_contexts, token_in_sight

from .config import ServerConfig

log = logging.getLogger("snet.server")

OPEN_PATHS = frozenset({"/healthz"})  # for probes: says only that the process is up


def is_loopback(host: str) -> bool:
    """True for addresses only this machine reaches (127.0.0.0/8, ::1, localhost, and
    ``::ffff:127.x.x.x``: how a dual-stack socket reports an IPv4 loopback peer)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name other than localhost, or "" (every interface)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def resolve_token(config: ServerConfig) -> str | None:
    """The shared secret from ``token_file``, else ``token`` (flag, SNET_TOKEN or TOML);
    None when there is none. Refuses a server exposed beyond loopback without one."""
    token = config.token
    if config.token_file:
        if token:  # said: the token given beside it is not the one workers must prove
            log.warning("both a token and token_file were given: the file's token is used")
        token = read_token_file(config.token_file)
    elif token and (said := token_in_sight(("SNET_TOKEN",))):
        log.warning("%s", said)
    exposed = [h for h in (config.host, config.http_bind_host) if not is_loopback(h)]
    if exposed and not token and not config.insecure and not config.tls_client_ca:
        raise ConfigError(
            f"listening on {exposed[0] or 'every interface'} (beyond loopback) without a "
            "token: anyone who reaches the ports could change or read the weights. Give "
            "--token-file FILE (or SNET_TOKEN), or --insecure to allow it"
        )
    if exposed and not token and config.insecure:
        log.warning("listening beyond loopback with no token (--insecure): the ports are open")
    elif exposed and not token:  # --tls-client-ca: certificates guard the worker port only
        log.warning("listening beyond loopback with no token: the worker port takes only "
                    "workers with a certificate --tls-client-ca signed, but the HTTP port "
                    "asks for none: anyone who reaches it can read /status and /weights "
                    "(give --token-file to require a token there)")  # fmt: skip
    return token or None


def tls_contexts(
    config: ServerConfig, failures: TlsFailures
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The worker port's and the HTTP port's TLS contexts (None, None: plain TCP), their
    failed handshakes counted and said by ``failures``."""
    if not config.tls_cert:  # (ServerConfig refuses a certificate without its key)
        return None, None
    workers, http = server_contexts(config.tls_cert, config.tls_key, config.tls_client_ca)
    failures.watch(workers, WORKER_PORT)
    failures.watch(http, HTTP_PORT)
    return workers, http


def over_tls(stream: asyncio.BufferedProtocol, tls: ssl.SSLContext | None) -> asyncio.BaseProtocol:
    """The worker port's protocol: the stream itself, or behind TLS a copying adapter."""
    return CopyingProtocol(stream) if tls is not None else stream


def bearer_middleware(token: str) -> Middleware:
    """aiohttp middleware: every path but ``OPEN_PATHS`` needs the token."""
    expected = token.encode()

    @web.middleware
    async def check(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not _authorised(request, expected):
            raise web.HTTPUnauthorized(
                text="this server needs its token: Authorization: Bearer TOKEN "
                "(snet status reads SNET_TOKEN), or ?token=TOKEN in a browser\n",
                headers={"WWW-Authenticate": 'Bearer realm="snet"'},
            )
        return await handler(request)

    return check


def browser_middleware(check_host: bool) -> Middleware:
    """aiohttp middleware for a server without a token: refuse what a web page in a
    browser on this machine could send it (module docstring). ``check_host``: the HTTP
    port listens on loopback only, so every honest request names an IP address,
    ``localhost`` or this machine (``--insecure`` servers beyond loopback are reached by
    any name the network gives them, and are open to the network anyway)."""
    own = {socket.gethostname().lower().rstrip(".")}

    @web.middleware
    async def check(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:  # a worker given this port asks it by any name
            return await handler(request)
        if check_host and not names_this_machine(request.headers.get("Host", ""), own):
            raise web.HTTPForbidden(
                text="this server has no token, so it answers only requests addressed to "
                "an IP address, localhost or this machine's name (a web page could reach "
                "it through a name of its own: DNS rebinding); give the server "
                "--token-file to be reached by other names\n"
            )
        if request.method not in ("GET", "HEAD", "OPTIONS") and _cross_site(request):
            raise web.HTTPForbidden(
                text="a request from a web page of another origin (a server without a "
                "token takes changes only from programs on this machine)\n"
            )
        return await handler(request)

    return check


def names_this_machine(host_header: str, own: set[str]) -> bool:
    """Whether a Host header names this machine without asking DNS: an IP address,
    ``localhost`` (and ``*.localhost``, which browsers resolve to loopback themselves),
    one of ``own``'s names, or no Host at all (HTTP/1.0: no browser sends that)."""
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:7080
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # name:port (a bare IPv6 address has more colons)
        host = host.partition(":")[0]
    host = host.rstrip(".")
    if not host or host in own or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cross_site(request: web.Request) -> bool:
    """A browser's request sent by a page of another origin: browsers name the page's
    origin in ``Origin`` (``null`` for opaque ones) on every POST, and newer ones say
    ``Sec-Fetch-Site``; programs such as curl send neither."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return urllib.parse.urlsplit(origin).netloc.lower() != request.host.lower()


def _authorised(request: web.Request, expected: bytes) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.partition(" ")
    # an auth scheme's name is case-insensitive (RFC 9110 11.1): "bearer" is "Bearer"
    bearer = scheme.lower() == "bearer"
    given = credentials.strip() if bearer else request.query.get("token", "")
    # bytes that are not UTF-8 came in as surrogates (aiohttp decodes with surrogateescape):
    # given back as they came, a wrong token, where a plain encode() raised (500, traceback)
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)
