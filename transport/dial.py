"""Connecting to a server: ``connect_with_backoff`` retries with exponential backoff and
jitter while the server is unreachable (not started yet, restarting, or behind a cut
link), and translates the socket errors of the last attempt into ``ServerUnreachable``."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable
from typing import TypeVar

from snet.protocol.errors import ServerUnreachable, TlsRefused
from snet.protocol.numbering import counted

from .tls import CopyingProtocol, refusal

log = logging.getLogger("snet.worker")

CONNECT_SECONDS = 10.0  # one attempt; a cut link drops SYNs silently, so never wait forever
MAX_BACKOFF_SECONDS = 5.0
# While an outage is young the retries stay frequent: a restarted server (a crash under
# systemd, a kill) listens again within seconds, and a worker backing off to 5 s would
# find it up to 5 s late. A refused connection costs the host next to nothing.
QUICK_RETRY_SECONDS = 30.0
QUICK_BACKOFF_SECONDS = 0.5

P = TypeVar("P", bound=asyncio.BaseProtocol)


CERT_WANTED_RESETS = 3  # handshakes reset in a row, this side without a certificate


async def connect_with_backoff(
    host: str,
    port: int,
    make_protocol: Callable[[], P],
    retry_seconds: float,
    ssl_context: ssl.SSLContext | None = None,
    deadline: float | None = None,
    client_cert: bool = True,
) -> P:
    """Connect, retrying with exponential backoff (0.1 s doubling, with jitter, to 0.5 s
    for the first 30 s of attempts, then to 5 s) for up to ``retry_seconds``, or until
    ``deadline`` (``time.monotonic()``) when given: the caller's one deadline across
    reconnects; raises ``ServerUnreachable`` after that, and ``TlsRefused`` at once when
    the server's certificate is not trusted, or, without a ``client_cert`` of this side,
    once ``CERT_WANTED_RESETS`` TLS handshakes in a row were reset after the TCP connect
    (a server that wants client certificates: such a worker retried its whole window,
    five minutes by default, and exited 3, as if the server were down)."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + retry_seconds if deadline is None else deadline
    made: list[P] = []

    def protocol() -> asyncio.BaseProtocol:
        made.append(make_protocol())
        inner = made[-1]
        if ssl_context is not None and isinstance(inner, asyncio.BufferedProtocol):
            return CopyingProtocol(inner)
        return inner

    delay, attempts, began, resets = 0.1, 0, time.monotonic(), 0
    while True:
        attempts += 1
        timeout = max(min(CONNECT_SECONDS, deadline - time.monotonic()), 1.0)
        try:
            await asyncio.wait_for(
                loop.create_connection(protocol, host, port, ssl=ssl_context), timeout
            )
            connection = made[-1]
        except ssl.SSLError as exc:
            raise TlsRefused(f"TLS with {host}:{port}: {refusal(exc)}") from exc
        except OSError as exc:  # TimeoutError is an OSError too
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Cancelled (a worker's SIGTERM) just as the attempt failed: 3.11's wait_for
                # then raises the failure and drops the cancel, and this loop retried until
                # its deadline (minutes) with the stop lost. The task still counts it.
                raise asyncio.CancelledError from exc
            reason = exc.strerror or f"no answer in {timeout:.0f} s"
            # TCP was fine and the handshake was cut (a timeout has no strerror either: a
            # host down or firewalled is no refusal of this worker's certificate)
            handshake_reset = (ssl_context is not None and not exc.strerror
                               and not isinstance(exc, TimeoutError))  # fmt: skip
            resets = resets + 1 if handshake_reset else 0
            if handshake_reset:
                reason = f"{type(exc).__name__} {exc}".strip() + (
                    ": the TLS handshake did not complete; a server that wants a client "
                    "certificate got none it trusts (--tls-cert, --tls-key)"
                )
            if handshake_reset and not client_cert and resets >= CERT_WANTED_RESETS:
                raise TlsRefused(
                    f"TLS with {host}:{port}: the server wants a client certificate, and this "
                    f"worker has none (--tls-cert, --tls-key): {counted(resets, 'handshake')} "
                    "reset"
                ) from exc
            if time.monotonic() + delay > deadline:
                raise ServerUnreachable(
                    f"cannot reach the server at {host}:{port} ({reason}); "
                    f"gave up after {counted(attempts, 'attempt')} in {retry_seconds:g} s"
                ) from exc
            level = logging.WARNING if attempts == 1 else logging.INFO
            log.log(
                level,
                "server %s:%d not reachable (%s); retrying with backoff for up to %s s more "
                "(next attempt in %.1f s)",
                host,
                port,
                reason,
                _seconds(deadline - time.monotonic()),  # "0 s more" of a window of 0.5 s
                delay,
            )
            await asyncio.sleep(delay)
            # Jitter, so that many workers reconnecting to a restarted server spread out.
            young = time.monotonic() - began < QUICK_RETRY_SECONDS
            ceiling = QUICK_BACKOFF_SECONDS if young else MAX_BACKOFF_SECONDS
            delay = min(delay * 2, ceiling) * random.uniform(0.8, 1.0)
            continue
        if attempts > 1:
            log.info("reached the server at %s:%d after %d attempts", host, port, attempts)
        return connection


def _seconds(value: float) -> str:
    """Seconds as a log line says them: whole from 10 up, else to a tenth."""
    return f"{value:.0f}" if value >= 10 else f"{max(value, 0.0):.1f}"
