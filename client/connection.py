"""``ServerConnection``: what the worker's TCP connection to its server means to it.

It is the worker's *receiving task*: whatever the compute thread is doing, incoming
weights land in the ``WeightsBox`` and leases, evaluation requests and goodbyes in the
inbox, because this runs on the event loop while numpy runs in a thread. The socket glue
is the shared ``FrameStream`` (transport/stream.py), which checks every message against
the conversation (protocol/conversation.py) and closes the connection, with the error's
code, on a bad frame or a message out of turn; the connection is then lost and the worker
connects again. ``transport.dial.connect_with_backoff`` opens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from snet.protocol.conversation import Conversation, Role
from snet.protocol.decoder import Decoded
from snet.protocol.errors import (
    CodecError,
    ConnectionLost,
    FrameTooLarge,
    ProtocolError,
    SlotOverwritten,
)
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import Message, Resync, Weights
from snet.transport.faults import FaultSwitch
from snet.transport.shared_board import BoardReader
from snet.transport.stream import FrameStream

from .buffers import SendBuffers, WeightsBox

log = logging.getLogger("snet.worker")


class ServerConnection:
    """Decoded messages go to ``on_message``; weights to the box once it is attached."""

    def __init__(
        self,
        limits: FrameLimits,
        on_message: Callable[[Message], None],
        on_lost: Callable[[Exception | None], None],
        faults: FaultSwitch | None = None,
    ) -> None:
        self.limits = limits
        self.on_message = on_message
        self.on_lost = on_lost
        self.faults = faults
        self.stream: FrameStream | None = None
        self.box: WeightsBox | None = None
        self.send_buffers: SendBuffers | None = None
        self.update_board: BoardReader | None = None  # client/update_steps.py writes it
        self.refused_frame_bytes: int | None = None  # a frame over this worker's own limit
        self.closed = asyncio.get_running_loop().create_future()

    def new_stream(self) -> FrameStream:
        """The protocol factory for ``create_connection``: this connection's stream.

        Pause as soon as anything is left unsent (high water 0): then "drained" means
        "all written", which is when an update element may be filled again."""
        self.stream = FrameStream(
            self, Conversation(Role.WORKER), self.limits, water=(0, 0), faults=self.faults
        )
        return self.stream

    @property
    def last_received(self) -> float:
        """When bytes last came from the server: any bytes count as life."""
        assert self.stream is not None
        return self.stream.last_received

    def attach(
        self, box: WeightsBox, send_buffers: SendBuffers, update_board: BoardReader | None = None
    ) -> None:
        """Once the job is known: receive weights into ``box``, track ``send_buffers``, and
        put updates in ``update_board`` (the server's for this worker) when there is one."""
        self.box, self.send_buffers, self.update_board = box, send_buffers, update_board
        assert self.stream is not None and self.stream.channel is not None
        self.stream.channel.decoder.receive_into(box)

    # ------------------------------------------------------------ stream events

    def stream_opened(self, stream: FrameStream) -> None:
        pass  # the server speaks first

    def stream_received(self, decoded: Decoded) -> None:
        message = decoded.message
        if isinstance(message, Weights) and self.box is not None:
            self.file_weights(self.box, message, decoded.slot)
        else:
            self.on_message(message)

    def stream_refused(self, error: ProtocolError) -> None:
        if (
            isinstance(error, FrameTooLarge)
            and error.payload_bytes is not None
            and error.limit_bytes == self.limits.max_payload_bytes
        ):
            # Over this worker's own --max-frame-mb, not the handshake's small bound: a
            # setting here to change, not the server's fault; the worker stops and says
            # so (client/frame_limit.py), and any reconnection would be refused alike.
            self.refused_frame_bytes = error.payload_bytes
            return
        log.error("the server broke the protocol: %s: %s", error.code, error)

    def stream_lost(self, error: ConnectionLost | None) -> None:
        if not self.closed.done():
            self.closed.set_result(error)
        if self.send_buffers is not None:
            self.send_buffers.all_flushed()  # nothing more will be written: free them all
        self.on_lost(error)

    def stream_drained(self) -> None:
        if self.send_buffers is not None:
            self.send_buffers.all_flushed()

    # ------------------------------------------------------------ weights and sending

    def file_weights(self, box: WeightsBox, message: Weights, slot: object = None) -> None:
        """Put received weights in the box; ask for a full copy if they cannot be used."""
        try:
            box.receive(message, slot)
        except CodecError as exc:
            if box.ask_for_full_copy():
                # a slot gone round is the machine's business, not a fault: not a warning
                # (a loaded demo printed twenty of them)
                level = logging.INFO if isinstance(exc, SlotOverwritten) else logging.WARNING
                log.log(level, "cannot use weights %d (%s); asking for a full copy",
                        message.version, str(exc))  # fmt: skip
                self.send(Resync(str(exc)[:200]))

    def send(self, message: Message) -> None:
        """Send to the server; a counted no-op once the connection closes."""
        if self.stream is not None:
            self.stream.send(message)

    def close(self) -> None:
        """Close after writing what is queued (e.g. a goodbye)."""
        if self.stream is not None:
            self.stream.close()

    async def leave(self, goodbye: Message, timeout: float = 2.0) -> None:
        """Send ``goodbye`` and wait (up to ``timeout``) for the server to close.

        Closing at once could lose the goodbye: a socket closed with unread data in it
        (weights keep coming) resets the connection, and the server drops what it had
        not read yet."""
        if self.stream is None or not self.stream.open:
            return
        self.send(goodbye)
        self.stream.write_eof()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)

    def abort(self) -> None:
        """Drop the connection now: on a dead link, queued data would never drain."""
        if self.stream is not None:
            self.stream.abort()
