"""``RawClient``: a hand-driven worker on a blocking socket, for feeding a server of the
system ring bad input (``async_raw.AsyncRawClient`` is the fast ring's, on the test's loop)."""

from __future__ import annotations

import socket
import time
from typing import Any

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import encode_bytes
from snet.protocol.messages import Hello, Message, ServerHello, Welcome


def take_from(inbox: list[Message], kind: type[Any]) -> Any:
    """The first message of ``kind`` in ``inbox``, taken out (None if there is none)."""
    for index, message in enumerate(inbox):
        if isinstance(message, kind):
            return inbox.pop(index)
    return None


class RawClient:
    """A hand-driven worker on a blocking socket, for feeding the server bad input."""

    def __init__(self, port: int, name: str = "raw") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()
        self.inbox: list[Message] = []
        self.name = name

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: Message) -> None:
        self.sock.sendall(encode_bytes(message))

    def receive(self, kind: type[Any], timeout: float = 10.0) -> Any:
        """The next message of ``kind`` (others are kept in ``inbox``); fails on EOF."""
        deadline = time.monotonic() + timeout
        while (found := take_from(self.inbox, kind)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind.__name__} within {timeout} s")
            self.sock.settimeout(remaining)
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError(f"closed by the server while waiting for {kind.__name__}")
            self.inbox.extend(self.decoder.feed(data))
        return found

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True once the server closes the connection (reading what is left)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.inbox.extend(self.decoder.feed(data))
        return False

    def handshake(self, capabilities: tuple[str, ...] = ()) -> Any:
        self.receive(ServerHello)
        self.send(Hello(PROTOCOL_VERSION, self.name, "raw", capabilities, b""))
        return self.receive(Welcome)

    def close(self) -> None:
        self.sock.close()
