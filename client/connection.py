"""``ServerConnection``: the worker's TCP connection, as an ``asyncio.BufferedProtocol``.

It is the worker's *receiving task*: whatever the compute thread is doing, incoming
weights land in the ``WeightsBox`` and leases, evaluation requests and goodbyes in the
inbox, because this runs on the event loop while numpy runs in a thread.

``connect_with_backoff`` opens it, retrying with exponential backoff while the server is
unreachable (not started yet, restarting, or behind a cut link).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import typing
from collections.abc import Callable

from snet.protocol.channel import Channel, gathering_writer
from snet.protocol.errors import CodecError, ProtocolError
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import ErrorMessage, Message, Resync, Weights

from .buffers import SendBuffers, WeightsBox

log = logging.getLogger("snet.worker")

CONNECT_SECONDS = 10.0  # one attempt; a cut link drops SYNs silently, so never wait forever
MAX_BACKOFF_SECONDS = 5.0


class ServerUnreachable(Exception):
    """No connection to the server could be made within the retry window."""


class ServerGone(Exception):
    """The connection to the server was lost without a goodbye (the worker reconnects)."""


class ServerConnection(asyncio.BufferedProtocol):
    """Transport glue: decoded messages go to ``on_message``; weights to the box."""

    def __init__(
        self,
        limits: FrameLimits,
        on_message: Callable[[Message], None],
        on_lost: Callable[[Exception | None], None],
    ) -> None:
        self.limits = limits
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        self.box: WeightsBox | None = None
        self.send_buffers: SendBuffers | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.last_received = time.monotonic()  # any bytes from the server count as life

    def attach(self, box: WeightsBox, send_buffers: SendBuffers) -> None:
        """Once the job is known: receive weights into ``box``, track ``send_buffers``."""
        self.box, self.send_buffers = box, send_buffers
        assert self.channel is not None
        self.channel.decoder.sink = box

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = typing.cast(asyncio.Transport, transport)
        transport = self.transport
        # Pause as soon as anything is left unsent: then "resumed" means "all written",
        # which is when an update element may be filled again.
        transport.set_write_buffer_limits(high=0, low=0)
        self.channel = Channel(transport.write, self.limits, writelines=gathering_writer(transport))

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.channel is not None
        return self.channel.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.channel is not None and self.transport is not None
        self.last_received = time.monotonic()
        try:
            messages = self.channel.buffer_updated(nbytes)
        except ProtocolError as exc:
            log.error("bad frame from the server: %s", exc)
            self.send(ErrorMessage(exc.code, str(exc), True))
            self.transport.close()
            return
        for message in messages:
            if isinstance(message, Weights) and self.box is not None:
                self.file_weights(self.box, message)
            else:
                self.on_message(message)

    def file_weights(self, box: WeightsBox, message: Weights) -> None:
        """Put received weights in the box; ask for a full copy if they cannot be used."""
        try:
            box.receive(message)
        except CodecError as exc:
            if not box.awaiting_full:
                log.warning(
                    "cannot use weights %d (%s); asking for a full copy", message.version, exc
                )
                box.awaiting_full = True
                self.send(Resync(str(exc)[:200]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.send_buffers is not None:
            self.send_buffers.all_flushed()  # nothing more will be written: free them all
        self.on_lost(exc)

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.writing_paused()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.writing_resumed()
        self._check_flushed()

    def _check_flushed(self) -> None:
        if self.send_buffers is None or self.transport is None or self.channel is None:
            return
        if self.channel.backlog == 0 and self.transport.get_write_buffer_size() == 0:
            self.send_buffers.all_flushed()

    def send(self, message: Message) -> None:
        if self.channel is None or self.transport is None or self.transport.is_closing():
            return
        self.channel.send(message)
        self._check_flushed()

    def close(self) -> None:
        """Close after writing what is queued (e.g. a goodbye)."""
        if self.transport is not None:
            self.transport.close()

    async def leave(self, goodbye: Message, timeout: float = 2.0) -> None:
        """Send ``goodbye`` and wait (up to ``timeout``) for the server to close.

        Closing at once could lose the goodbye: a socket closed with unread data in it
        (weights keep coming) resets the connection, and the server drops what it had
        not read yet."""
        if self.transport is None or self.transport.is_closing():
            return
        self.send(goodbye)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)

    def abort(self) -> None:
        """Drop the connection now: on a dead link, queued data would never drain."""
        if self.transport is not None:
            self.transport.abort()


async def connect_with_backoff(
    host: str,
    port: int,
    make_protocol: Callable[[], ServerConnection],
    retry_seconds: float,
    deadline: float | None = None,
) -> ServerConnection:
    """Connect, retrying with exponential backoff (0.1 s doubling to 5 s, with jitter)
    for up to ``retry_seconds``, or until ``deadline`` (``time.monotonic()``) when given:
    the caller's one deadline across reconnects; raises ``ServerUnreachable`` after that."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + retry_seconds if deadline is None else deadline
    delay, attempts = 0.1, 0
    while True:
        attempts += 1
        timeout = max(min(CONNECT_SECONDS, deadline - time.monotonic()), 1.0)
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(make_protocol, host, port), timeout
            )
        except OSError as exc:  # TimeoutError is an OSError too
            reason = exc.strerror or f"no answer in {timeout:.0f} s"
            if time.monotonic() + delay > deadline:
                raise ServerUnreachable(
                    f"cannot reach the server at {host}:{port} ({reason}); "
                    f"gave up after {attempts} attempts in {retry_seconds:.0f} s"
                ) from exc
            level = logging.WARNING if attempts == 1 else logging.INFO
            log.log(
                level,
                "server %s:%d not reachable (%s); retrying with backoff for up to %.0f s more "
                "(next attempt in %.1f s)",
                host,
                port,
                reason,
                deadline - time.monotonic(),
                delay,
            )
            await asyncio.sleep(delay)
            # Jitter, so that many workers reconnecting to a restarted server spread out.
            delay = min(delay * 2, MAX_BACKOFF_SECONDS) * random.uniform(0.8, 1.0)
            continue
        if attempts > 1:
            log.info("reached the server at %s:%d after %d attempts", host, port, attempts)
        return connection
