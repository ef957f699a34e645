"""``ServerConnection``: the worker's TCP connection, as an ``asyncio.BufferedProtocol``.

It is the worker's *receiving task*: whatever the compute thread is doing, incoming
weights land in the ``WeightsBox`` and leases, evaluation requests and goodbyes in the
inbox, because this runs on the event loop while numpy runs in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Callable

from snet.protocol.channel import Channel
from snet.protocol.errors import CodecError, ProtocolError
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import ErrorMessage, Message, Resync, Weights

from .buffers import SendBuffers, WeightsBox

log = logging.getLogger("snet.worker")


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
        self.channel = Channel(transport.write, self.limits)

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.channel is not None
        return self.channel.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.channel is not None and self.transport is not None
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
        if self.transport is not None:
            self.transport.close()
