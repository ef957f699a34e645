"""``Channel``: the sans-IO core of one connection, shared by server and worker.

It owns the ``FrameDecoder`` for incoming bytes and orders outgoing frames. The transport
around it (an ``asyncio.BufferedProtocol``) only forwards ``get_buffer``/``buffer_updated``
and the transport's ``pause_writing``/``resume_writing`` signals; the channel calls the
``write`` function it was given once per frame piece (scatter/gather: the header and each
array buffer separately, never joined), or its ``writelines`` once per frame when the
transport gathers them into one system call itself (``gathering_writer``).

While the peer is slow (writing paused), frames wait in a backlog in order; only the
newest ``Weights`` is kept there, because a worker always wants the newest weights and
an older copy still queued would cost bandwidth for nothing. ``before_send``, when set,
turns each message into the one actually written at the moment it is written (the
server compresses weights there: a delta must be computed against what the worker will
really have received, which coalescing decides).

Given a ``Conversation``, the channel checks every message against it: on send (a message
out of turn raises ``LocalProtocolError``, a bug on this side) and on receive (``OutOfTurn``,
the peer's fault: the caller closes the connection with that error's code). After a
refused frame the channel holds the sink tokens of what it decoded but did not hand out;
``abandon()`` returns them with the one of a partly received frame.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from .conversation import Conversation
from .decoder import Decoded, FrameDecoder, TrafficCounters
from .errors import OutOfTurn, ProtocolError
from .framing import FrameLimits, PayloadSink, encode
from .messages import Message, Weights

# Until the handshake is done (the server welcomed the worker after its token proof), a
# peer's frames are at most this large: a hello or a server's greeting needs a few hundred
# bytes; a 177-byte frame declaring a 512 MiB payload made the server allocate it before
# any hello was read (issue 12).
HANDSHAKE_PAYLOAD_BYTES = 4096
HANDSHAKE_HEADER_BYTES = 8192

WriteFunction = Callable[[bytes | memoryview], None]
WritelinesFunction = Callable[[list[bytes | memoryview]], None]
Transform = Callable[[Message], Message]


def gathering_writer(transport: object) -> WritelinesFunction | None:
    """The transport's ``writelines`` when it sends a frame's pieces in one ``writev``.

    uvloop's does: one system call per frame, and a small frame is one TCP segment rather
    than a header segment and a payload segment that wake the peer twice. Python 3.11's
    own asyncio transports join the pieces first (a copy of every 2 MB payload), so for
    them the channel keeps writing piece by piece.
    """
    if type(transport).__module__.split(".")[0] != "uvloop":
        return None
    get_extra_info = getattr(transport, "get_extra_info", None)
    if get_extra_info is not None and get_extra_info("sslcontext") is not None:
        return None  # uvloop's TLS transport held gathered writes back until close
    writelines: WritelinesFunction = getattr(transport, "writelines")  # noqa: B009
    return writelines


class Channel:
    """Decoding, ordering, coalescing and counting for one connection."""

    def __init__(
        self,
        write: WriteFunction,
        limits: FrameLimits | None = None,
        sink: PayloadSink | None = None,
        writelines: WritelinesFunction | None = None,
        conversation: Conversation | None = None,
    ) -> None:
        self._write = write
        self._writelines = writelines
        self.decoder = FrameDecoder(limits, sink)
        self.conversation = conversation
        self.limits = self.decoder.limits  # once the peer is trusted
        if conversation is not None:
            # Bounded before trust: until the handshake is done a peer's frames are small,
            # and no frame's payload goes anywhere before its type is in turn.
            self.decoder.limits = replace(
                self.limits,
                max_payload_bytes=min(self.limits.max_payload_bytes, HANDSHAKE_PAYLOAD_BYTES),
                max_header_bytes=min(self.limits.max_header_bytes, HANDSHAKE_HEADER_BYTES),
            )
            self.decoder.admit = self._admit
        self._orphans: list[object] = []  # sink tokens decoded, then refused with their frame
        self._backlog: deque[tuple[Message, int, bool]] = deque()
        self._paused = False
        self.frames_sent = 0
        self.bytes_sent = 0
        self.weights_coalesced = 0
        self.sent = TrafficCounters()
        self.before_send: Transform | None = None

    def encode_with(self, transform: Transform) -> None:
        """Pass each message through ``transform`` as it is written (a worker's weights
        codec: the newest weights encoded at the moment they leave)."""
        self.before_send = transform

    @property
    def received(self) -> TrafficCounters:
        return self.decoder.received

    # -- incoming

    def get_buffer(self) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> list[Decoded]:
        """Record received bytes; returns the messages they completed, each with its sink
        token (the caller owns it). Raises ``ProtocolError`` for a bad frame or a message
        out of turn; nothing after it is handed out."""
        self.decoder.buffer_updated(nbytes)
        return self.check(self.decoder.take())

    def check(self, decoded: list[Decoded]) -> list[Decoded]:
        """Check received messages against the conversation, in order."""
        if self.conversation is None:
            return decoded
        for position, item in enumerate(decoded):
            try:
                self.conversation.received(item.message)
            except ProtocolError:
                partial = self.decoder.abandon()  # reads no further
                held = [d.slot for d in decoded[position:]] + [partial]
                self._orphans.extend(token for token in held if token is not None)
                raise
        self._open_when_trusted()
        return decoded

    def _admit(self, message_type: str, payload_bytes: int) -> None:
        """The decoder read a frame's header: refuse a message out of turn before its
        payload is taken anywhere (a pooled element is lent only to an update in turn)."""
        assert self.conversation is not None
        if not self.conversation.may_receive(message_type):
            peer = self.conversation.role.peer
            raise OutOfTurn(
                f"a {peer.value} may not send {message_type} in state "
                f"{self.conversation.states[peer].value}"
            )

    def _open_when_trusted(self) -> None:
        if self.conversation is not None and self.conversation.trusted:
            self.decoder.limits = self.limits  # the handshake is done: the full limits

    def feed(self, data: bytes) -> list[Decoded]:
        """Decode bytes in hand as if received (the fault switch's duplicates), checked."""
        self.decoder.feed_only(data)
        return self.check(self.decoder.take())

    def abandon(self) -> list[object]:
        """Stop decoding; the sink tokens still held here (a partly received frame's, a
        refused frame's), for the caller to give back."""
        tokens, self._orphans = self._orphans, []
        tokens += [d.slot for d in self.decoder.take()]  # decoded, never handed out
        tokens.append(self.decoder.abandon())
        return [token for token in tokens if token is not None]

    # -- outgoing

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    @property
    def closed(self) -> bool:
        """This end has said goodbye or a fatal error: the conversation allows no more."""
        return self.conversation is not None and self.conversation.closed

    def send(self, message: Message, *, copies: int = 1, damaged: bool = False) -> None:
        """Send now, or queue behind earlier frames while the peer is slow.

        ``LocalProtocolError`` when the conversation does not allow ``message`` now.
        The fault switch alone uses the rest: ``copies`` frames carry the one message the
        conversation records (0: it is lost on the way, 2: it arrives twice); ``damaged``
        breaks the frame's magic, so that the peer refuses it as a malformed frame."""
        if self.conversation is not None:
            self.conversation.sent(message)
            self._open_when_trusted()
        if copies < 1:
            return
        if self._paused or self._backlog:
            if isinstance(message, Weights):
                before = len(self._backlog)
                self._backlog = deque(m for m in self._backlog if not isinstance(m[0], Weights))
                self.weights_coalesced += before - len(self._backlog)
            self._backlog.append((message, copies, damaged))
            return
        self._emit(message, copies, damaged)

    def writing_paused(self) -> None:
        self._paused = True

    def writing_resumed(self) -> None:
        self._paused = False
        while self._backlog and not self._paused:
            self._emit(*self._backlog.popleft())

    def _emit(self, message: Message, copies: int = 1, damaged: bool = False) -> None:
        if self.before_send is not None:
            message = self.before_send(message)
        pieces = encode(message)
        if damaged:
            pieces[0] = b"XX" + bytes(pieces[0][2:])
        size = sum(len(piece) for piece in pieces)
        for _ in range(copies):
            self.frames_sent += 1
            if self._writelines is not None:
                self._writelines(pieces)
            else:
                for piece in pieces:
                    self._write(piece)
            self.bytes_sent += size
            self.sent.add(message.TYPE, size)
