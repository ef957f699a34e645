"""``FrameDecoder``: a sans-IO state machine that turns received bytes into messages.

It is built for ``asyncio.BufferedProtocol``: the transport asks ``get_buffer()`` for the
memory to receive into and reports ``buffer_updated(n)``; the decoder hands out, in turn,
the 16-byte prefix buffer, a header buffer of exactly the declared size, and the payload
buffer (from the ``PayloadSink`` when it offers one, so an update lands directly in a free
pooled element). ``feed(data)`` does the same for bytes already in hand (tests feed one byte
at a time). After any ``FrameError`` the decoder is finished; the connection must close.

A payload received into a sink's buffer comes out as ``Decoded(message, slot)``: the
message, and beside it the sink's token for that buffer. The message itself (a frozen wire
dataclass) owns nothing; whoever takes the ``Decoded`` owns the token and must give it
back to the sink (``take()``). ``messages()`` and ``feed()`` are for decoders without a
sink, where there is nothing to give back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from . import PROTOCOL_VERSION
from .errors import FrameTooLarge, MalformedFrame, ProtocolError, TlsOnPlainPort, VersionMismatch
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

TLS_HANDSHAKE = b"\x16\x03"  # a TLS record of type handshake, version 3.x: a ClientHello

_PREFIX, _HEADER, _PAYLOAD, _BROKEN = range(4)


class Decoded(NamedTuple):
    """A decoded message and the sink token of the buffer its payload landed in (``None``
    when the decoder allocated the payload itself). The taker owns the token."""

    message: Message
    slot: object = None


class TrafficCounters:
    """Frames and bytes (whole frames: prefix, header and payload) per message type, for
    one direction of one connection: what the compression ledger counts."""

    def __init__(self) -> None:
        self.frames: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def add(self, message_type: str, nbytes: int) -> None:
        self.frames[message_type] = self.frames.get(message_type, 0) + 1
        self.bytes[message_type] = self.bytes.get(message_type, 0) + nbytes


class FrameDecoder:
    """Decode a byte stream of frames into messages, checking every size first."""

    def __init__(self, limits: FrameLimits | None = None, sink: PayloadSink | None = None):
        self.limits = limits or FrameLimits()  # the owner may change them between frames
        self.sink = sink
        # Called with a frame's type and payload size once its header is read, before the
        # payload is given anywhere to go; raises to refuse the frame (``Channel``).
        self.admit: Callable[[str, int], None] | None = None
        self._state = _PREFIX
        self._buffer: memoryview = memoryview(bytearray(PREFIX_SIZE))
        self._filled = 0
        self._ready: list[Decoded] = []
        self._type = ""
        self._header: dict[str, Any] = {}
        self._arrays: tuple[ArrayInfo, ...] = ()
        self._payload_len = 0
        self._header_len = 0
        self._slot: object = None
        self.frames_decoded = 0
        self.bytes_received = 0
        self.received = TrafficCounters()

    def receive_into(self, sink: PayloadSink) -> None:
        """Receive payloads into ``sink`` from the next frame on (a worker's weights box,
        once the job says how large an element is)."""
        self.sink = sink

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

    def take(self) -> list[Decoded]:
        """Take the messages completed so far, each with its sink token (owned by the caller)."""
        ready, self._ready = self._ready, []
        return ready

    def messages(self) -> list[Message]:
        """Take the messages completed so far (for a decoder without a sink)."""
        ready = self.take()
        if any(decoded.slot is not None for decoded in ready):
            raise RuntimeError("messages() would drop sink tokens: use take() with a sink")
        return [decoded.message for decoded in ready]

    # -- the plain-bytes side

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Decode ``data`` (any amount, even one byte) and return completed messages."""
        self.feed_only(data)
        return self.messages()

    def feed_decoded(self, data: bytes | bytearray | memoryview) -> list[Decoded]:
        """``feed`` for a decoder with a sink: each message with its sink token."""
        self.feed_only(data)
        return self.take()

    def feed_only(self, data: bytes | bytearray | memoryview) -> None:
        """Decode ``data``; the completed messages wait for ``take()``."""
        view = memoryview(data).cast("B")
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

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
        if magic != MAGIC and bytes(magic[:2]) == TLS_HANDSHAKE:
            raise TlsOnPlainPort("a TLS handshake: this port does not serve TLS")
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
            limit = self.limits.max_payload_bytes
            text = f"payload of {payload_len} bytes (limit {limit})"
            raise FrameTooLarge(text, payload_len, limit)
        self._payload_len = payload_len
        self._header_len = header_len
        self._state = _HEADER
        self._buffer = memoryview(bytearray(header_len))
        self._filled = 0

    def _on_header(self) -> None:
        self._type, self._header = parse_header(self._buffer)
        self._arrays = parse_arrays(self._type, self._header, self._payload_len, self.limits)
        if self.admit is not None:
            self.admit(self._type, self._payload_len)
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
        message = build_message(self._type, self._header, self._arrays, self._buffer)
        slot, self._slot = self._slot, None  # a refused frame leaves it for abandon()
        self._ready.append(Decoded(message, slot))
        self.frames_decoded += 1
        self.received.add(self._type, PREFIX_SIZE + self._header_len + self._payload_len)
        self._state = _PREFIX
        self._buffer = memoryview(bytearray(PREFIX_SIZE))
        self._filled = 0
