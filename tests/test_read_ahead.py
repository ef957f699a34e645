"""Frames read ahead (protocol/decoder.py): a receive between frames takes up to
``READ_AHEAD`` bytes, so a small frame comes in one system call, not three; the frames
after the first wait (``pending``) and are handed out one at a time, each before the next
is decoded, as when each came in receives of its own; a paused stream keeps them until
its reading resumes (the server pauses while its element pool is exhausted)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from fake_transport import FakeTransport

from snet.protocol.conversation import Conversation, Role
from snet.protocol.decoder import READ_AHEAD, Decoded, FrameDecoder
from snet.protocol.errors import ConnectionLost, MalformedFrame, ProtocolError
from snet.protocol.framing import PREFIX_SIZE, FrameLimits, encode_bytes
from snet.protocol.messages import (
    Goodbye,
    Heartbeat,
    Hello,
    Message,
    ServerHello,
    Weights,
    Welcome,
)
from snet.transport.stream import FrameStream

from protocol_samples import assert_same_message


def _receive(decoder: FrameDecoder, data: bytes) -> int:
    """One receive of ``data`` (as much of it as the buffer takes), as a transport does;
    how many bytes it took."""
    target = decoder.get_buffer()
    n = min(len(target), len(data))
    target[:n] = data[:n]
    decoder.buffer_updated(n)
    return n


def test_small_frames_come_in_one_receive_and_are_handed_out_one_at_a_time() -> None:
    frames = [Heartbeat(1.0), Goodbye("a"), Heartbeat(2.0)]
    stream = b"".join(encode_bytes(m) for m in frames)
    decoder = FrameDecoder()
    assert len(decoder.get_buffer()) == READ_AHEAD  # between frames: the read-ahead buffer
    assert _receive(decoder, stream) == len(stream)  # all three in one receive
    got = decoder.messages()
    assert got == [Heartbeat(1.0)] and decoder.pending
    with pytest.raises(RuntimeError, match="pending"):
        decoder.get_buffer()  # no receive while the owner has not taken them
    while decoder.pending:
        decoder.decode_next()
        got += decoder.messages()
    assert got == frames
    assert decoder.frames_decoded == 3 and decoder.bytes_received == len(stream)


def test_a_frame_split_across_receives_and_pending_bytes_that_end_mid_frame() -> None:
    first, second = encode_bytes(Goodbye("x" * 40)), encode_bytes(Heartbeat(3.0))
    decoder = FrameDecoder()
    _receive(decoder, first + second[:10])  # the second's prefix, cut
    assert decoder.messages() == [Goodbye("x" * 40)]
    assert decoder.pending
    decoder.decode_next()
    assert decoder.messages() == [] and not decoder.pending and decoder.mid_frame
    _receive(decoder, second[10:])
    assert decoder.messages() == [Heartbeat(3.0)] and not decoder.mid_frame


def test_a_large_payload_is_received_straight_into_its_own_buffer() -> None:
    """The read-ahead takes the prefix, the header and the payload's start; the rest,
    READ_AHEAD bytes or more, goes into the payload's buffer without a copy."""
    element = np.arange(20_000, dtype="<f4")
    sent = Weights(7, 1, 0.1, 0, element=element)
    frame = encode_bytes(sent)
    decoder = FrameDecoder()
    taken = _receive(decoder, frame)
    assert taken == READ_AHEAD
    target = decoder.get_buffer()
    assert len(target) == len(frame) - taken  # the payload's remainder, whole
    target[:] = frame[taken:]
    decoder.buffer_updated(len(target))
    (got,) = decoder.messages()
    assert_same_message(got, sent)
    # a remainder shorter than READ_AHEAD comes through the read-ahead buffer again
    small = encode_bytes(Weights(8, 1, 0.1, 0, element=element[: READ_AHEAD // 4]))
    decoder = FrameDecoder()
    taken = _receive(decoder, small)
    assert len(small) - taken < READ_AHEAD and len(decoder.get_buffer()) == READ_AHEAD
    _receive(decoder, small[taken:])
    assert decoder.messages()[0].version == 8


def test_a_bad_frame_among_pending_ones_ends_the_decoder() -> None:
    good = encode_bytes(Heartbeat(1.0))
    bad = b"XX" + good[2:]
    decoder = FrameDecoder()
    _receive(decoder, good + bad + good)
    assert decoder.messages() == [Heartbeat(1.0)]
    with pytest.raises(MalformedFrame, match="bad magic"):
        decoder.decode_next()
    assert not decoder.pending  # what came after it is never read
    with pytest.raises(MalformedFrame, match="closed"):
        decoder.get_buffer()


def test_fed_bytes_between_two_pending_frames_keep_their_order() -> None:
    """The fault switch's duplicate is fed while the rest of its receive is pending."""
    decoder = FrameDecoder()
    _receive(decoder, encode_bytes(Heartbeat(1.0)) + encode_bytes(Heartbeat(2.0)))
    assert decoder.messages() == [Heartbeat(1.0)]
    assert decoder.feed(encode_bytes(Heartbeat(1.0))) == [Heartbeat(1.0)]
    assert decoder.pending
    decoder.decode_next()
    assert decoder.messages() == [Heartbeat(2.0)]
    assert decoder.frames_decoded == 3


class _Transport(FakeTransport):
    """Its writes are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))


class _Pausing:
    """A handler that pauses its stream's reading at every frame but a goodbye (as the
    server does when its element pool runs out) and keeps what it is given."""

    def __init__(self) -> None:
        self.stream: FrameStream | None = None
        self.messages: list[Message] = []

    def stream_opened(self, stream: FrameStream) -> None:
        self.stream = stream

    def stream_received(self, decoded: Decoded) -> None:
        self.messages.append(decoded.message)
        if not isinstance(decoded.message, Goodbye) and self.stream is not None:
            self.stream.pause_reading()

    def stream_refused(self, error: ProtocolError) -> None:
        raise AssertionError(error)

    def stream_lost(self, error: ConnectionLost | None) -> None:
        pass

    def stream_drained(self) -> None:
        pass


def test_a_paused_stream_keeps_the_frames_of_its_last_receive_until_it_resumes() -> None:
    async def main() -> None:
        handler = _Pausing()
        stream = FrameStream(handler, Conversation(Role.SERVER), FrameLimits())  # type: ignore[arg-type]
        transport = _Transport()
        stream.connection_made(transport)
        stream.send(ServerHello(1, "s", b"n" * 32, False))
        hello = encode_bytes(Hello(1, "w", "numpy", (), b""))
        position = 0
        while position < len(hello):  # not trusted yet: exact-size receives
            target = stream.get_buffer(-1)
            target[:] = hello[position : position + len(target)]
            position += len(target)
            stream.buffer_updated(len(target))
        stream.send(Welcome(1, {}))  # trusted: the frames read ahead from here
        stream.resume_reading()  # the hello paused it
        data = b"".join(encode_bytes(m) for m in (Heartbeat(1.0), Goodbye("bye")))
        target = stream.get_buffer(-1)
        target[: len(data)] = data
        stream.buffer_updated(len(data))  # one receive, two frames
        assert handler.messages[1:] == [Heartbeat(1.0)]  # paused: the goodbye waits
        assert not transport.reading and stream.channel is not None and stream.channel.pending
        stream.resume_reading()
        assert handler.messages[1:] == [Heartbeat(1.0), Goodbye("bye")]
        assert transport.reading and not stream.channel.pending

    asyncio.run(main())


def test_the_prefix_alone_is_never_a_receive_of_its_own() -> None:
    """What the read-ahead is for: a frame whose prefix and header come together is one
    receive (exact-size buffers asked for PREFIX_SIZE bytes first)."""
    decoder = FrameDecoder()
    frame = encode_bytes(Heartbeat(5.0))
    assert len(decoder.get_buffer()) > PREFIX_SIZE + len(frame)
    _receive(decoder, frame)
    assert decoder.messages() == [Heartbeat(5.0)] and not decoder.pending


def test_a_peer_not_yet_trusted_gets_exact_size_receives_and_no_read_ahead_buffer() -> None:
    """Before the handshake is done a peer costs what it did: its 16-byte prefix, then its
    header, each a receive of its own (docs/security.md's bound per connection)."""
    from snet.protocol.channel import Channel

    channel = Channel(lambda piece: None, FrameLimits(), conversation=Conversation(Role.WORKER))
    assert len(channel.get_buffer()) == PREFIX_SIZE
    hello = encode_bytes(ServerHello(1, "s", b"n" * 32, False))
    received: list[Message] = []
    position = 0
    while position < len(hello):
        target = channel.get_buffer()
        target[:] = hello[position : position + len(target)]
        position += len(target)
        received += [m for m, _slot in channel.buffer_updated(len(target))]
    assert received == [ServerHello(1, "s", b"n" * 32, False)]
    assert channel.decoder._ahead is None  # never made
