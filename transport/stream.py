"""``FrameStream``: one TCP connection carrying snet frames, for server and worker alike.

It is the ``asyncio.BufferedProtocol`` the event loop drives, and all the glue between a
socket and a ``Channel``, written once: the transport receives straight into the buffers
the channel's decoder hands out (``get_buffer``/``buffer_updated``), the transport's
``pause_writing``/``resume_writing`` reach the channel's backlog, and closing, aborting
and writing after either are handled here. What the connection *means* is its handler's
(``StreamHandler``): the server's ``WorkerConnection``, the worker's ``ServerConnection``.

The rules it keeps:

- A message from the peer that breaks the protocol (a bad frame, a message out of turn)
  is answered with one fatal ``error`` frame carrying that error's code, and the
  connection is closed; the handler hears of it first (``stream_refused``). The close
  lingers (``LINGER_SECONDS``): this side's writing ends, what still comes in is read and
  dropped until the peer closes. Closed at once, with the peer's frames still arriving
  unread, the socket was reset, and the peer lost the error frame it had not read yet.
- Sending on a connection that is closing or closed, or after this side said goodbye,
  is a counted no-op (``sends_dropped``): a peer that went away never makes ``send``
  raise (a write to a closed uvloop transport raises; none is ever made).
- Socket errors become ``ConnectionLost`` here, the one place they are translated.
- Sink tokens (pooled buffers a payload landed in) are handed to the handler with their
  message; a token the handler never gets (a frame cut short, a message refused or
  arriving while the connection closes) is released here.
- The fault switch (``transport/faults.py``), when there is one, acts here.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections import deque
from typing import Protocol

from snet.protocol.channel import Channel, WritelinesFunction, gathering_writer
from snet.protocol.conversation import Conversation
from snet.protocol.decoder import Decoded
from snet.protocol.errors import ConnectionLost, MalformedFrame, ProtocolError
from snet.protocol.framing import FrameLimits, PayloadSink, encode_bytes
from snet.protocol.messages import ErrorMessage, Message

from .addresses import peer_text
from .faults import FaultRule, FaultSwitch

LINGER_SECONDS = 2.0  # a refusing side reads and drops for this long before closing anyway
# Frames queued for a peer that reads nothing before it is dropped: a worker that reads is
# never sent more than a few unread (leases, their frames, an evaluate; weights coalesce),
# but a peer that sends requests and reads no answers would grow the queue without end.
MAX_BACKLOG = 1024

log = logging.getLogger("snet.transport")


def release_tokens(tokens: list[object]) -> None:
    """Give back each token with a ``release()`` (an ``ElementLoan`` goes back to its pool
    by itself); None and other tokens are left."""
    for token in tokens:
        # the duck test, not isinstance against a Protocol: a runtime-checkable
        # Protocol's check walks the class's attributes on every call (about 50 Python
        # calls, of the server's 600 an update, when it ran for every update frame)
        release = getattr(token, "release", None)
        if release is not None:
            release()


class StreamHandler(Protocol):
    """What a connection does with its stream's events (all on the event loop)."""

    def stream_opened(self, stream: FrameStream) -> None:
        """Connected: the stream can send."""

    def stream_received(self, decoded: Decoded) -> None:
        """A message from the peer, checked against the conversation; the handler owns
        its sink token from here."""

    def stream_refused(self, error: ProtocolError) -> None:
        """The peer broke the protocol; the stream tells it ``error.code`` and closes."""

    def stream_lost(self, error: ConnectionLost | None) -> None:
        """The connection is gone (``None``: closed cleanly). Nothing is sent after it."""

    def stream_drained(self) -> None:
        """Everything sent so far has left the process (the transport's buffer is empty)."""


class FrameStream(asyncio.BufferedProtocol):
    """The transport glue of one connection: socket <-> ``Channel`` <-> handler."""

    def __init__(
        self,
        handler: StreamHandler,
        conversation: Conversation,
        limits: FrameLimits,
        sink: PayloadSink | None = None,
        water: tuple[int, int] = (64 * 1024, 16 * 1024),
        faults: FaultSwitch | None = None,
    ) -> None:
        self.handler = handler
        self.conversation = conversation
        self.limits = limits
        self.sink = sink
        self.water = water  # (high, low) bytes queued in the transport before pausing
        self.faults = faults
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        self.peer = "?"
        self.closing = False  # close() was called: what is queued is flushed, no more
        self.lost = False  # connection_lost was called
        self.sends_dropped = 0  # messages sent after closing, or after this side's goodbye
        self.writes_dropped = 0  # frame pieces the channel wrote once the socket was gone
        self.last_sent = time.monotonic()  # when a frame was last queued
        self.last_received = time.monotonic()  # when bytes last came in
        self._gather: WritelinesFunction | None = None  # the transport's writev, if it has one
        self._held = False  # a delay fault holds the outgoing frames back
        self._delayed: deque[Decoded] | None = None  # incoming ones held by a delay fault
        self._dropping: memoryview | None = None  # refused: what comes in lands here, unread

    # ------------------------------------------------------------ the transport's events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = typing.cast(asyncio.Transport, transport)
        high, low = self.water
        self.transport.set_write_buffer_limits(high=high, low=low)
        self.peer = peer_text(transport.get_extra_info("peername"))
        self._gather = gathering_writer(transport)
        # With a fault switch every byte goes through _write, to be counted for cuts.
        gather = self._writelines if self._gather and self.faults is None else None
        self.channel = Channel(
            self._write, self.limits, self.sink, gather, conversation=self.conversation
        )
        self.handler.stream_opened(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._dropping is not None:
            return self._dropping
        assert self.channel is not None
        return self.channel.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.channel is not None
        self.last_received = time.monotonic()
        if self._dropping is not None:
            return  # refused: read only so that closing does not reset the connection
        if self.faults is not None and self.faults.passing("receive", nbytes) is not None:
            self.abort()  # cut: what came in with these bytes is lost
            return
        try:
            received = self.channel.buffer_updated(nbytes)
        except ProtocolError as exc:
            self.refuse(exc)
            return
        self._deliver_all(received)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.channel is not None:
            release_tokens(self.channel.abandon())
        if self._delayed:
            release_tokens([item.slot for item in self._delayed])
            self._delayed.clear()
        error = None if exc is None else ConnectionLost(f"connection lost: {exc}")
        if error is not None:
            error.__cause__ = exc  # e.g. the TLS alert of a server that refused us
        self.handler.stream_lost(error)

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.writing_paused()

    def resume_writing(self) -> None:
        if self.channel is not None and not self._held:
            self.channel.writing_resumed()
        self._check_drained()

    # ------------------------------------------------------------ receiving

    def _deliver_all(self, received: list[Decoded]) -> None:
        for position, item in enumerate(received):
            try:
                if self.faults is None:
                    self._deliver(item)
                    continue
                try:
                    self._receive_faulty(item)
                except ProtocolError as exc:
                    release_tokens([later.slot for later in received[position + 1 :]])
                    self.refuse(exc)
                    return
            except BaseException:  # a bug in a handler: what it never saw goes back
                release_tokens([later.slot for later in received[position + 1 :]])
                raise

    def _deliver(self, item: Decoded) -> None:
        if self._delayed is not None:
            self._delayed.append(item)  # behind a delayed frame: TCP keeps order
        elif self.closing or self.lost:
            release_tokens([item.slot])
        else:
            self.handler.stream_received(item)

    def refuse(self, error: ProtocolError) -> None:
        """The peer broke the protocol: tell it ``error.code`` (fatal) and close."""
        self.handler.stream_refused(error)
        self.send(ErrorMessage(error.code, str(error), True))
        if self.channel is not None:
            release_tokens(self.channel.abandon())
        self.close_lingering()

    def close_lingering(self) -> None:
        """Close once the peer does (having read our last frame: an error, a goodbye),
        LINGER_SECONDS at most; until then what comes in is read (even if reading was
        paused) and dropped, so that the close does not reset the connection: a reset
        fails the peer's next write, and its transport then closes without reading what
        it had not read yet (workers lost the server's goodbye so, retried their whole
        window and exited 3)."""
        transport = self.transport
        if transport is None or self.lost or self.closing:
            self.close()
            return
        self._dropping = memoryview(bytearray(64 * 1024))
        if not transport.is_reading():
            transport.resume_reading()
        if self.channel is not None:
            self._held = False
            self.channel.writing_resumed()  # the error frame to the transport first
        self.closing = True
        if transport.can_write_eof():
            transport.write_eof()  # our side is done: the peer reads the error, then EOF
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    # ------------------------------------------------------------ sending and closing

    @property
    def open(self) -> bool:
        """Frames may still be sent (not closing, not lost, no goodbye said)."""
        return not (self.closing or self.lost or self.channel is None or self.channel.closed)

    def send(self, message: Message) -> bool:
        """Send ``message``, or drop it (counted) when this connection can no longer send;
        True when it was handed to the channel. Raises ``LocalProtocolError`` (a bug) when
        the conversation does not allow it now; never for a peer that went away."""
        if not self.open:
            self.sends_dropped += 1
            return False
        assert self.channel is not None
        rule = self.faults.message("send", message.TYPE) if self.faults is not None else None
        if rule is None:
            self.channel.send(message)
        else:
            self._send_faulty(message, rule)
        self.last_sent = time.monotonic()
        if self.channel.backlog > MAX_BACKLOG:
            log.warning("%s reads nothing: %d frames wait for it; dropping the connection",
                        self.peer, self.channel.backlog)  # fmt: skip
            self.abort()
            return True  # handed on, as any send before the loss that drops it
        self._check_drained()
        return True

    def _writable(self) -> bool:
        transport = self.transport
        return transport is not None and not self.lost and not transport.is_closing()

    def _writelines(self, pieces: list[bytes | memoryview]) -> None:
        if self._gather is None or not self._writable():
            self.writes_dropped += 1
            return
        try:
            self._gather(pieces)
        except (OSError, RuntimeError) as exc:
            self._write_failed(exc)

    def _write(self, piece: bytes | memoryview) -> None:
        transport = self.transport
        if transport is None or not self._writable():
            self.writes_dropped += 1
            return
        try:
            if self.faults is not None:
                passing = self.faults.passing("send", len(piece))
                if passing is not None:
                    transport.write(piece[:passing])
                    self.abort()
                    return
            transport.write(piece)
        except (OSError, RuntimeError) as exc:
            self._write_failed(exc)

    def _write_failed(self, exc: Exception) -> None:
        """A transport that refuses a write (uvloop: "unable to perform operation") is
        gone: drop the connection; ``stream_lost`` follows. Never raised to the sender."""
        self.writes_dropped += 1
        log.warning("cannot write to %s (%s); dropping the connection", self.peer, exc)
        self.abort()

    def _check_drained(self) -> None:
        transport, channel = self.transport, self.channel
        if transport is None or channel is None or self.lost:
            return
        if channel.backlog == 0 and transport.get_write_buffer_size() == 0:
            self.handler.stream_drained()

    def close(self) -> None:
        """Close after writing what is queued (e.g. a goodbye or an error)."""
        if self.closing or self.transport is None:
            return
        self.closing = True
        if self.channel is not None and not self.lost:
            self._held = False
            self.channel.writing_resumed()  # hand the backlog to the transport first
        self.transport.close()

    def abort(self) -> None:
        """Drop the connection now: on a dead link, queued data would never drain."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def write_eof(self) -> None:
        if self.transport is not None and not self.lost and self.transport.can_write_eof():
            self.transport.write_eof()

    def pause_reading(self) -> None:
        # not while lingering: it reads to drop until the peer closes (close_lingering), and
        # paused, the peer's close went unread until the linger ran out
        if (
            self._dropping is None
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # ------------------------------------------------------------ the fault switch

    def _send_faulty(self, message: Message, rule: FaultRule) -> None:
        assert self.channel is not None
        log.warning("fault switch: %s (%s to %s)", rule, message.TYPE, self.peer)
        if rule.action == "delay":
            self._held = True
            self.channel.writing_paused()
            asyncio.get_running_loop().call_later(rule.seconds, self._release_held)
        copies = {"drop": 0, "duplicate": 2}.get(rule.action, 1)
        self.channel.send(message, copies=copies, damaged=rule.action == "corrupt")

    def _release_held(self) -> None:
        self._held = False
        if self.channel is not None and not self.lost:
            self.channel.writing_resumed()
            self._check_drained()

    def _receive_faulty(self, item: Decoded) -> None:
        assert self.faults is not None and self.channel is not None
        rule = self.faults.message("receive", item.message.TYPE)
        if rule is None:
            self._deliver(item)
            return
        log.warning("fault switch: %s (%s from %s)", rule, item.message.TYPE, self.peer)
        if rule.action == "drop":
            release_tokens([item.slot])
        elif rule.action == "corrupt":
            release_tokens([item.slot])
            raise MalformedFrame("bad magic: frame damaged in transit (fault switch)")
        elif rule.action == "duplicate":
            again = encode_bytes(item.message)  # copied before the first copy is handed on
            self._deliver(item)
            for copy in self.channel.feed(again):
                self._deliver(copy)
        else:  # delay: this message and all after it come late, in order
            self._delayed = deque([item])
            asyncio.get_running_loop().call_later(rule.seconds, self._deliver_delayed)

    def _deliver_delayed(self) -> None:
        held, self._delayed = self._delayed or deque(), None
        while held:
            self._deliver(held.popleft())
