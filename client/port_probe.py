"""Is the port a worker was given the server's HTTP port? Asked once its connection stays
silent or closes before the server's hello.

An snet server speaks first on its worker port (``server_hello`` as soon as a worker
connects); an HTTP server waits for a request and then, at most, closes the connection.
So a silent or closed connection is the moment to ask: a second connection first listens
(a server that speaks first, as a slow snet server would, is left alone: nothing is sent
to it), then sends ``GET /healthz`` and reads the first bytes back. ``HTTP/1.`` means
the worker was given an HTTP port, which no retry can cure; an snet server's /healthz
names its worker port in the ``X-Snet-Worker-Port`` header, so the error can say which
port to use. Anything else (no answer, a frame of the snet protocol, TLS that does not
complete) is not HTTP and the worker goes on as before.

A worker without ``--tls-ca`` at a server that serves TLS heard nothing either (the server
waits for a TLS handshake), and retried for its whole window before exit 3, "no server
reachable": so such a worker also sends the port a TLS client hello, and if a TLS
handshake record comes back (a server that wants client certificates resets the
handshake after that), says to give ``--tls-ca`` (exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from snet.protocol.errors import ConfigError
from snet.protocol.numbering import is_plain_int

WORKER_PORT_HEADER = "X-Snet-Worker-Port"  # the server's /healthz sends it
PROBE_SECONDS = 3.0  # for the whole probe: connect, ask, read the status line and headers
LISTEN_SECONDS = 0.5  # how long the probe listens before it asks
HEAD_BYTES = 8192  # an HTTP status line and headers fit; more is not needed
TLS_RECORD_HEAD = 5  # a TLS record's type, version and length


class WrongPort(ConfigError):
    """The worker's ``--server`` names a port that speaks HTTP, not the worker protocol."""


async def http_answer(
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    listen_seconds: float = LISTEN_SECONDS,
) -> bytes | None:
    """The head of the answer to ``GET /healthz`` on ``host:port`` if it is HTTP, else None
    (it listens ``listen_seconds`` before it asks)."""
    request = (
        f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), listen_seconds):
                    return None  # it spoke first: not HTTP (and it heard nothing from us)
            writer.write(request)
            await writer.drain()
            head = b""
            while b"\r\n\r\n" not in head and len(head) < HEAD_BYTES:
                chunk = await reader.read(HEAD_BYTES - len(head))
                if not chunk:
                    break
                head += chunk
    except (OSError, TimeoutError, ssl.SSLError):
        return None
    finally:
        await _close(writer)
    return head if head.startswith(b"HTTP/1.") else None


async def _close(writer: asyncio.StreamWriter | None) -> None:
    """Close a probe's connection (if it was opened), whatever state it is in."""
    if writer is not None:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def worker_port_of(head: bytes) -> int | None:
    """The worker port an snet server's HTTP answer names (None: not an snet server's)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == WORKER_PORT_HEADER.lower() and is_plain_int(value.strip()):
            return int(value.strip())
    return None


async def speaks_tls(host: str, port: int) -> ssl.SSLContext | None:
    """An unverifying context if ``host:port`` answers a TLS client hello with a TLS
    handshake record, else None (only to tell the worker what it is missing). The answer's
    first bytes are read, not a whole handshake: a server that wants a client certificate
    (``--tls-client-ca``) resets a handshake without one, which was taken for "no TLS"."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    client = context.wrap_bio(ssl.MemoryBIO(), outgoing)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()  # writes its client hello, then wants the answer
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(outgoing.read())
            head = await reader.readexactly(TLS_RECORD_HEAD)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        await _close(writer)
    # a handshake record (22) of TLS 1.x (3, *), its length at most a record's
    speaks = head[0] == 22 and head[1] == 3 and int.from_bytes(head[3:5], "big") <= 2**14 + 2048
    return context if speaks else None


async def refuse_if_http(host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
    """Raise ``WrongPort`` with the worker port to use when ``host:port`` speaks HTTP, or
    saying to give ``--tls-ca`` when it serves TLS and the worker has none."""
    unverified = await speaks_tls(host, port) if tls is None else None
    head = await http_answer(host, port, tls or unverified)
    if unverified is not None:
        worker_port = worker_port_of(head) if head is not None else None
        https = f"; that port speaks HTTPS: the worker port is {worker_port}" if worker_port else ""
        raise WrongPort(
            f"{host}:{port}: the server serves TLS: give --tls-ca (the CA of its certificate, "
            f"e.g. ca.pem of snet tls init){https}"
        )
    if head is None:
        return
    worker_port = worker_port_of(head)
    if worker_port is not None:
        raise WrongPort(
            f"{host}:{port}: that port speaks HTTP: the worker port is {worker_port} "
            f"(--server {host}:{worker_port})"
        )
    raise WrongPort(
        f"{host}:{port}: that port speaks HTTP: give the snet server's worker port "
        "(its --port, default 7000), not an HTTP port"
    )
