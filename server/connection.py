"""``WorkerConnection``: one worker's TCP connection, as an ``asyncio.BufferedProtocol``.

The transport receives straight into the buffers the ``Channel``'s decoder hands out
(update payloads into free pooled elements). The conversation is checked here: the first
message must be a ``Hello`` with the right protocol version and token proof; after that,
updates, evaluation results, heartbeats and goodbyes go to the ``Coordinator``.

A frame that cannot be decoded closes this connection with an ``ErrorMessage`` and never
affects the server; a refused update is answered with a non-fatal ``ErrorMessage``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import typing
from collections.abc import Callable
from typing import Any

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.channel import Channel, gathering_writer
from snet.protocol.codecs.handshake import agree_codecs
from snet.protocol.codecs.weights import WeightsEncoder
from snet.protocol.errors import (
    AuthError,
    ProtocolError,
    RejectedUpdate,
    UnknownCodec,
    VersionMismatch,
)
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import (
    ErrorMessage,
    EvalResult,
    FramesWanted,
    Goodbye,
    Heartbeat,
    Hello,
    Message,
    Resync,
    ServerHello,
    Update,
    WorkerReport,
)

from .ledger import CompressionLedger
from .plausible import checked_report
from .pool import PooledElement
from .session import WorkerSession, name_problem, unique_name
from .training import Coordinator

log = logging.getLogger("snet.server")

HIGH_WATER = 4 * 1024 * 1024  # bytes queued in the transport before weights coalesce
LOW_WATER = 1024 * 1024


class ConnectionCounters:
    """Server-wide counts of refused connections and frames, for /status."""

    def __init__(self) -> None:
        self.frames_refused = 0
        self.handshakes_refused = 0
        self.connections = 0


class WorkerConnection(asyncio.BufferedProtocol):
    """Transport glue between one socket, its ``Channel`` and the ``Coordinator``."""

    def __init__(
        self,
        coordinator: Coordinator,
        limits: FrameLimits,
        token: str | None,
        server_name: str,
        next_id: Callable[[], int],
        counters: ConnectionCounters,
        connections: set[WorkerConnection],
    ) -> None:
        self.coordinator = coordinator
        self.limits = limits
        self.token = token
        self.server_name = server_name
        self.next_id = next_id
        self.counters = counters
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        self.session: WorkerSession | None = None
        self.nonce = os.urandom(auth.NONCE_BYTES)
        self.peer = "?"
        self.closing = False
        self.connected_at = time.monotonic()
        self.last_sent = self.connected_at  # when a frame was last queued for this worker

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = typing.cast(asyncio.Transport, transport)
        transport = self.transport
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        peer: Any = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.channel = Channel(
            transport.write, self.limits, self.coordinator.pool, gathering_writer(transport)
        )
        self.connections.add(self)
        self.counters.connections += 1
        self.channel.send(
            ServerHello(PROTOCOL_VERSION, self.server_name, self.nonce, self.token is not None)
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.channel is not None
        return self.channel.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.channel is not None
        try:
            messages = self.channel.buffer_updated(nbytes)
        except ProtocolError as exc:
            self.counters.frames_refused += 1
            self.fail(exc.code, str(exc))
            return
        for message in messages:
            if self.closing:
                self._release(message)
                continue
            try:
                self.dispatch(message)
            except RejectedUpdate as exc:
                log.warning("refused update from %s: %s", self.describe(), exc)
                self.send(ErrorMessage(exc.code, str(exc), False, exc.lease_id, exc.offset))
            except (ProtocolError, AuthError) as exc:
                self.fail(exc.code, str(exc))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost does the cleanup

    def connection_lost(self, exc: Exception | None) -> None:
        was_closing, self.closing = self.closing, True  # nothing can be written any more
        self.connections.discard(self)
        if self.channel is not None:
            slot = self.channel.decoder.abandon()
            if isinstance(slot, PooledElement):
                self.coordinator.pool.release(slot)
        if self.session is not None:
            reason = "closed" if was_closing else f"connection lost ({exc or 'eof'})"
            self.coordinator.remove_worker(self.session, reason)
            self.session = None

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.writing_paused()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.writing_resumed()

    # ------------------------------------------------------------ conversation

    def dispatch(self, message: Message) -> None:
        if self.session is None:
            if not isinstance(message, Hello):
                raise ProtocolError(f"expected hello, got {message.TYPE}")
            self._handshake(message)
            return
        self.session.touch()
        if isinstance(message, Update):
            self.coordinator.on_update(self.session, message)
        elif isinstance(message, EvalResult):
            self.coordinator.on_eval_result(self.session, message)
        elif isinstance(message, FramesWanted):
            self.coordinator.on_frames_wanted(self.session, message)
        elif isinstance(message, Heartbeat):
            pass
        elif isinstance(message, WorkerReport):
            report = checked_report(message.report)
            figures = report.pop("compression", None)  # goes to the compression ledger
            if self.session.ledger is not None:
                self.session.ledger.absorb_report(figures)
            self.session.report = report
        elif isinstance(message, Resync):
            self.coordinator.on_resync(self.session, message.reason)
        elif isinstance(message, Goodbye):
            self.close(f"goodbye: {message.reason}")
        elif isinstance(message, ErrorMessage):
            log.warning("worker %s reports %s: %s", self.describe(), message.code, message.text)
        else:
            raise ProtocolError(f"a worker may not send {message.TYPE}")

    def _handshake(self, hello: Hello) -> None:
        problem = name_problem(hello.worker_name)
        if problem:
            self.counters.handshakes_refused += 1
            raise ProtocolError(problem)
        if hello.protocol_version != PROTOCOL_VERSION:
            self.counters.handshakes_refused += 1
            raise VersionMismatch(
                f"worker speaks protocol {hello.protocol_version}, server {PROTOCOL_VERSION}"
            )
        if self.token is not None and not auth.verify(self.token, self.nonce, hello.proof):
            self.counters.handshakes_refused += 1
            raise AuthError("wrong or missing token proof")
        try:
            codecs = agree_codecs(hello.capabilities, self.coordinator.job.compress)
            problem = self.coordinator.policy.combination.codec_problem(codecs["update"])
            if problem:
                raise UnknownCodec(problem)
        except UnknownCodec:
            self.counters.handshakes_refused += 1
            raise
        assert self.channel is not None
        encoder = WeightsEncoder(codecs["weights"], self.coordinator.layout)
        self.channel.before_send = encoder.prepare  # weights are encoded as they are written
        ledger = CompressionLedger(
            codecs["update"], encoder, self.channel.received, self.channel.sent
        )
        self.session = WorkerSession(
            worker_id=self.next_id(),
            name=unique_name(
                hello.worker_name or f"worker-{self.peer}",
                (s.name for s in self.coordinator.sessions.values()),
            ),
            address=self.peer,
            backend=hello.backend[:32],
            capabilities=hello.capabilities,
            send=self.send,
            close=self.close,
            ledger=ledger,
        )
        self.coordinator.add_worker(self.session)

    def _release(self, message: Message) -> None:
        slot = getattr(message, "slot", None)
        if isinstance(slot, PooledElement):
            self.coordinator.pool.release(slot)

    # ------------------------------------------------------------ sending and closing

    def describe(self) -> str:
        return self.session.name if self.session else self.peer

    def send(self, message: Message) -> None:
        """Queue ``message`` for this worker; a no-op once the connection is closing or
        gone. Never raises: what one peer's socket does must not reach the caller (the
        step machinery sends to every worker after each step)."""
        transport = self.transport
        if self.channel is None or transport is None or self.closing or transport.is_closing():
            return
        try:
            self.channel.send(message)
        except (OSError, RuntimeError) as exc:  # uvloop: "unable to perform operation ..."
            log.warning("cannot write to %s (%s); dropping the connection", self.describe(), exc)
            self.closing = True
            transport.abort()
            return
        self.last_sent = time.monotonic()

    def fail(self, code: str, text: str) -> None:
        """Refuse this peer: tell it why, close this connection only."""
        log.warning("closing connection from %s: %s: %s", self.describe(), code, text)
        self.send(ErrorMessage(code, text, True))
        self.close(f"{code}: {text}")

    def close(self, reason: str) -> None:
        if self.closing or self.transport is None:
            return
        self.closing = True
        if self.session is not None:
            self.coordinator.remove_worker(self.session, reason)
            self.session = None
        if self.channel is not None:
            self.channel.writing_resumed()  # hand the backlog (e.g. the error) to the transport
        self.transport.close()  # flushes what is queued, then connection_lost

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
