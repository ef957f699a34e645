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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .decoder import FrameDecoder, TrafficCounters
from .framing import FrameLimits, PayloadSink, encode
from .messages import Message, Weights

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
    ) -> None:
        self._write = write
        self._writelines = writelines
        self.decoder = FrameDecoder(limits, sink)
        self._backlog: deque[Message] = deque()
        self._paused = False
        self.frames_sent = 0
        self.bytes_sent = 0
        self.weights_coalesced = 0
        self.sent = TrafficCounters()
        self.before_send: Transform | None = None

    @property
    def received(self) -> TrafficCounters:
        return self.decoder.received

    # -- incoming

    def get_buffer(self) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> list[Message]:
        """Record received bytes; returns the messages they completed (may raise FrameError)."""
        self.decoder.buffer_updated(nbytes)
        return self.decoder.messages()

    # -- outgoing

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def send(self, message: Message) -> None:
        """Send now, or queue behind earlier frames while the peer is slow."""
        if self._paused or self._backlog:
            if isinstance(message, Weights):
                before = len(self._backlog)
                self._backlog = deque(m for m in self._backlog if not isinstance(m, Weights))
                self.weights_coalesced += before - len(self._backlog)
            self._backlog.append(message)
            return
        self._emit(message)

    def writing_paused(self) -> None:
        self._paused = True

    def writing_resumed(self) -> None:
        self._paused = False
        while self._backlog and not self._paused:
            self._emit(self._backlog.popleft())

    def _emit(self, message: Message) -> None:
        if self.before_send is not None:
            message = self.before_send(message)
        pieces = encode(message)
        self.frames_sent += 1
        size = sum(len(piece) for piece in pieces)
        if self._writelines is not None:
            self._writelines(pieces)
        else:
            for piece in pieces:
                self._write(piece)
        self.bytes_sent += size
        self.sent.add(message.TYPE, size)
