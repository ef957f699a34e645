"""``AsyncRawClient``: ``raw_client.RawClient`` for the fast ring, on the test's own loop.

A hand-driven worker for feeding an in-process server bad input: a blocking socket would
stall the loop that runs the server, so this one reads and writes with asyncio streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import encode_bytes
from snet.protocol.messages import Hello, Message, ServerHello, Welcome

from raw_client import take_from


class AsyncRawClient:
    """Frames in, messages out, nothing checked: what the server does with it is the test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.inbox: list[Message] = []
        self.name = name

    @classmethod
    async def connect(cls, port: int, name: str = "raw") -> AsyncRawClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        return cls(reader, writer, name)

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, message: Message) -> None:
        await self.send_bytes(encode_bytes(message))

    async def receive(self, kind: type[Any], timeout: float = 10.0) -> Any:
        """The next message of ``kind`` (others are kept in ``inbox``); fails on EOF."""
        deadline = time.monotonic() + timeout
        while (found := take_from(self.inbox, kind)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind.__name__} within {timeout} s")
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 20), remaining)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError(f"closed by the server while waiting for {kind.__name__}")
            self.inbox.extend(self.decoder.feed(data))
        return found

    async def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True once the server closes the connection (reading what is left; what it
        sent stays in ``inbox``)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 20), remaining)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                # Our end too, and its outcome taken: a reset is also set on the stream's
                # close future, reported as never retrieved when it is collected first.
                await self.close()
                return True
            self.inbox.extend(self.decoder.feed(data))
        return False

    async def handshake(self, capabilities: tuple[str, ...] = ()) -> Any:
        await self.receive(ServerHello)
        await self.send(Hello(PROTOCOL_VERSION, self.name, "raw", capabilities, b""))
        return await self.receive(Welcome)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
