"""What the server does to all its workers' connections at once.

Each ``WorkerConnection`` adds itself to the server's set when it opens and leaves it when
its transport has closed (server/connection.py); here is what goes over the whole set:
heartbeats and timeouts (``tend_connections``, every second or so), reading paused and
resumed with the element pool, the goodbye, and, before the process exits, the wait for
every goodbye to be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterable

from snet.protocol.messages import TIMEOUT, Goodbye, Heartbeat
from snet.transport.stream import LINGER_SECONDS

from .admission import Admission
from .connection import WorkerConnection
from .pool import ElementShare

CLOSED_POLL_SECONDS = 0.02


def tend_connections(
    connections: Iterable[WorkerConnection],
    now: float,
    admission: Admission,
    heartbeat_seconds: float,
    timeout_seconds: float,
) -> None:
    """Close connections past their handshake deadline or silent past the timeout; send
    a heartbeat on links quiet for ``heartbeat_seconds`` (the server calls it every second
    or so)."""
    for connection in list(connections):
        session = connection.session
        if session is None:
            waited = now - connection.connected_at
            if waited > admission.handshake_seconds and not connection.closing:
                text = f"no hello in {waited:.0f} s"
                admission.timed_out(text)
                connection.fail(TIMEOUT, text, logged=False)
            continue
        # not read by the server (its pool full): its messages wait unread, it is not silent
        quiet = session.quiet(now) if not connection.paused_at else 0.0
        share = connection.stream.sink
        held = share.unfinished_past(now) if isinstance(share, ElementShare) else 0.0
        if held:
            connection.fail(TIMEOUT, f"an update frame unfinished for {held:.0f} s, holding "
                            "one of the server's update elements")  # fmt: skip
        elif quiet > timeout_seconds:
            connection.fail(TIMEOUT, f"no message for {quiet:.0f} s")
        elif quiet > heartbeat_seconds or now - connection.last_sent > heartbeat_seconds:
            # Also a sign of life for the worker: one that hears nothing for its
            # server_timeout_seconds takes the link for dead and reconnects.
            connection.send(Heartbeat(time.time()))


def set_reading(connections: Iterable[WorkerConnection], on: bool) -> None:
    """Resume (``on``) or pause reading every connection (the element pool's watch)."""
    for connection in connections:
        if on:
            connection.resume_reading()
        else:
            connection.pause_reading()


def say_goodbye(connections: Iterable[WorkerConnection], goodbye: str, reason: str) -> None:
    """Send every worker ``goodbye`` and close its connection once it has read it."""
    for connection in list(connections):
        connection.send(Goodbye(goodbye))
        connection.close(reason)


async def all_closed(
    connections: Collection[WorkerConnection], listener: asyncio.AbstractServer | None
) -> None:
    """Until every connection has closed, LINGER_SECONDS and a little at most: each
    lingers until its worker has read the goodbye (transport/stream.py). A server that
    exited first reset them, and a worker behind in reading (a second's backlog, a
    SIGSTOP) lost its goodbye in the reset, retried its whole window and exited 3, or, as
    a systemd unit, was restarted against the finished job every 10 s. One still open
    then (a stopped worker whose unread frames fill its socket: its transport cannot
    finish closing) is left to the process's exit. ``listener``: the worker port's
    server, closed already, whose ``wait_closed`` waits for every connection on
    CPython 3.12's loop, without a bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_SECONDS + 0.5  # a lingering close gives up by then
    while connections and loop.time() < deadline:
        await asyncio.sleep(CLOSED_POLL_SECONDS)
    if listener is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSED_POLL_SECONDS):
                await listener.wait_closed()
