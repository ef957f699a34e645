"""``FrameDecoder``: a sans-IO state machine that turns received bytes into messages.

It is built for ``asyncio.BufferedProtocol``: the transport asks ``get_buffer()`` for the
memory to receive into and reports ``buffer_updated(n)``; the decoder hands out, in turn,
the 16-byte prefix buffer, a header buffer of exactly the declared size, and the payload
buffer (from the ``PayloadSink`` when it offers one, so an update lands directly in a free
pooled element). ``feed(data)`` does the same for bytes already in hand (tests feed one byte
at a time). After any ``FrameError`` the decoder is finished; the connection must close.
"""

from __future__ import annotations

from typing import Any

from . import PROTOCOL_VERSION
from .errors import FrameTooLarge, MalformedFrame, ProtocolError, VersionMismatch
from .framing import (
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    ArrayInfo,
    FrameLimits,
    PayloadSink,
    build_message,
    parse_arrays,
    parse_header,
)
from .messages import Message

_PREFIX, _HEADER, _PAYLOAD, _BROKEN = range(4)


class FrameDecoder:
    """Decode a byte stream of frames into messages, checking every size first."""

    def __init__(self, limits: FrameLimits | None = None, sink: PayloadSink | None = None):
        self.limits = limits or FrameLimits()
        self.sink = sink
        self._state = _PREFIX
        self._buffer: memoryview = memoryview(bytearray(PREFIX_SIZE))
        self._filled = 0
        self._ready: list[Message] = []
        self._type = ""
        self._header: dict[str, Any] = {}
        self._arrays: tuple[ArrayInfo, ...] = ()
        self._payload_len = 0
        self._slot: object = None
        self.frames_decoded = 0
        self.bytes_received = 0

    # -- the BufferedProtocol side

    def get_buffer(self) -> memoryview:
        """The memory the next received bytes must be written to (never empty)."""
        if self._state == _BROKEN:
            raise MalformedFrame("decoder is closed after an earlier frame error")
        return self._buffer[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last ``get_buffer()``."""
        self._filled += nbytes
        self.bytes_received += nbytes
        try:
            while self._filled == len(self._buffer) and self._state != _BROKEN:
                self._advance()
        except ProtocolError:
            self._break()
            raise
        except Exception as exc:  # a safety net: any surprise in a peer's bytes is its fault
            self._break()
            raise MalformedFrame(f"undecodable frame: {type(exc).__name__}: {exc}") from exc

    def messages(self) -> list[Message]:
        """Take the messages completed so far."""
        ready, self._ready = self._ready, []
        return ready

    # -- the plain-bytes side

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Decode ``data`` (any amount, even one byte) and return completed messages."""
        view = memoryview(data).cast("B")
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)
        return self.messages()

    @property
    def mid_frame(self) -> bool:
        """True when part of a frame has been received (EOF now means truncation)."""
        return self._state != _BROKEN and (self._state != _PREFIX or self._filled > 0)

    def abandon(self) -> object:
        """Give up a partly received frame; returns the sink token to release, if any."""
        slot, self._slot = self._slot, None
        self._state = _BROKEN
        return slot

    # -- internals

    def _break(self) -> None:
        self._state = _BROKEN

    def _advance(self) -> None:
        if self._state == _PREFIX:
            self._on_prefix()
        elif self._state == _HEADER:
            self._on_header()
        else:
            self._on_payload()

    def _on_prefix(self) -> None:
        magic, version, _flags, header_len, payload_len = PREFIX.unpack(self._buffer)
        if magic != MAGIC:
            raise MalformedFrame(f"bad magic {bytes(magic)!r}: not an snet frame")
        if version != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"peer speaks protocol version {version}, this is {PROTOCOL_VERSION}"
            )
        if _flags != 0:
            raise MalformedFrame(f"flags byte is {_flags}; version 1 defines none")
        if header_len == 0:
            raise MalformedFrame("empty header")
        if header_len > self.limits.max_header_bytes:
            raise FrameTooLarge(
                f"header of {header_len} bytes (limit {self.limits.max_header_bytes})"
            )
        if payload_len > self.limits.max_payload_bytes:
            raise FrameTooLarge(
                f"payload of {payload_len} bytes (limit {self.limits.max_payload_bytes})"
            )
        self._payload_len = payload_len
        self._state = _HEADER
        self._buffer = memoryview(bytearray(header_len))
        self._filled = 0

    def _on_header(self) -> None:
        self._type, self._header = parse_header(self._buffer)
        self._arrays = parse_arrays(self._type, self._header, self._payload_len, self.limits)
        target = None
        if self.sink is not None and self._payload_len:
            target = self.sink.payload_target(self._type, self._arrays, self._payload_len)
        if target is not None:
            buffer, self._slot = target
            if len(buffer) != self._payload_len:
                raise MalformedFrame("payload sink returned a buffer of the wrong size")
            self._buffer = buffer.cast("B") if buffer.format != "B" else buffer
        else:
            self._buffer = memoryview(bytearray(self._payload_len))
        self._filled = 0
        self._state = _PAYLOAD
        if self._payload_len == 0:
            self._on_payload()

    def _on_payload(self) -> None:
        slot, self._slot = self._slot, None
        try:
            message = build_message(self._type, self._header, self._arrays, self._buffer, slot)
        except ProtocolError:
            self._slot = slot  # so that abandon() can still release it
            raise
        self._ready.append(message)
        self.frames_decoded += 1
        self._state = _PREFIX
        self._buffer = memoryview(bytearray(PREFIX_SIZE))
        self._filled = 0
