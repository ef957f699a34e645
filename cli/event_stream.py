"""A server's ``/events`` read as ``snet status --watch`` follows it: server-sent events
(the ``text/event-stream`` format), of which only ``status`` events are kept.

Why a stream and not /status read again and again: a server ends its event stream with
one last document (state ``stopping``, or ``trained`` while it lingers) before it closes
its HTTP side, so whoever follows the stream sees how the run ended; a server that exits
as soon as training completes (``--linger-seconds 0``, the default) is usually gone
before the next poll, which then cannot tell a finished run from a dead server.

Errors are not translated here: opening and reading raise what ``urllib`` and
``http.client`` raise (``URLError``, ``HTTPError``, ``HTTPException``, ``OSError``), and
a ``status`` event whose data is not JSON raises ``ValueError``; cli/status.py says why.
"""

from __future__ import annotations

import functools
import http.client
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

from snet.transport.tls import client_context

EVENT_STREAM = "text/event-stream"
# A read that waits longer fails (a hung server, a host gone from the network): the
# server sends something at least every 2 s (server/http.py: KEEPALIVE_SECONDS).
READ_SECONDS = 5.0


def open_page(
    url: str, path: str, token: str, tls_ca: str, timeout: float, headers: dict[str, str]
) -> Any:
    """GET ``url`` + ``path`` (with ``token``: as ``Authorization: Bearer``; with ``tls_ca``:
    an https server's certificate must be signed by that CA); urlopen's response."""
    if token:
        headers = {**headers, "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url.rstrip("/") + path, headers=headers)
    context = https_context(tls_ca) if tls_ca else None
    return urllib.request.urlopen(request, timeout=timeout, context=context)


@functools.cache
def https_context(tls_ca: str) -> ssl.SSLContext:
    """The context of an https server signed by ``tls_ca``, made once (a watch polls for
    hours: it read the CA file at every poll); ConfigError naming a missing file or a
    directory, as a worker's ``--tls-ca`` is checked (transport/tls.py)."""
    return client_context(tls_ca, what="--tls-ca")


def open_events(url: str, token: str, tls_ca: str) -> http.client.HTTPResponse | None:
    """``url``/events as an open stream; None when there is no event stream there (404,
    or an answer of another type: an older server, or something that is not snet)."""
    headers = {"Accept": EVENT_STREAM, "Cache-Control": "no-cache"}
    try:
        response = open_page(url, "/events", token, tls_ca, READ_SECONDS, headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            exc.close()
            return None
        raise
    if not isinstance(response, http.client.HTTPResponse):  # urlopen of http(s) gives one
        response.close()
        return None
    if response.headers.get_content_type() != EVENT_STREAM:
        response.close()
        return None
    return response


def status_events(lines: Iterable[bytes]) -> Iterator[object]:
    """The data of each ``status`` event in ``lines``, parsed as JSON, as they arrive.

    The format's rules as far as a reader of one server needs them: lines end with LF or
    CRLF; a line starting with ``:`` is a comment (the server's keep-alive); a blank
    line ends an event; several ``data`` lines are joined by LF; ``retry`` and ``id`` are
    of no use to a watcher that stops at the first interruption it cannot explain."""
    kind, data = "message", list[str]()
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data and kind == "status":
                yield json.loads("\n".join(data))
            kind, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
