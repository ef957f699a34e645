"""Pure tests of the Channel (ordering, coalescing, scatter/gather) and the token proof."""

from __future__ import annotations

import numpy as np
import pytest

from snet.protocol import auth
from snet.protocol.channel import Channel, gathering_writer
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import (
    encode_bytes,
)
from snet.protocol.messages import (
    Goodbye,
    Heartbeat,
    Lease,
    Message,
    Weights,
)

from protocol_samples import (
    assert_same_message,
)

# ---------------------------------------------------------------- channel


class Wire:
    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []

    def write(self, piece: bytes | memoryview) -> None:
        self.pieces.append(piece)

    def decode(self) -> list[Message]:
        decoder = FrameDecoder()
        out: list[Message] = []
        for piece in self.pieces:
            out.extend(decoder.feed(piece))
        assert not decoder.mid_frame
        return out


def test_channel_writes_each_piece_separately() -> None:
    wire = Wire()
    channel = Channel(wire.write)
    element = np.arange(8, dtype="<f4")
    message = Weights(1, 0, 0.1, 0, element=element)
    channel.send(message)
    assert len(wire.pieces) == 2
    assert isinstance(wire.pieces[1], memoryview)
    assert np.shares_memory(np.frombuffer(wire.pieces[1], dtype="<f4"), element)
    assert channel.frames_sent == 1
    assert channel.bytes_sent == len(encode_bytes(message))
    decoded = wire.decode()
    assert_same_message(decoded[0], message)


def test_channel_hands_a_gathering_transport_each_frame_once() -> None:
    wire = Wire()
    calls: list[list[bytes | memoryview]] = []

    def writelines(pieces: list[bytes | memoryview]) -> None:
        calls.append(pieces)
        wire.pieces.extend(pieces)

    channel = Channel(wire.write, writelines=writelines)
    element = np.arange(8, dtype="<f4")
    channel.send(Weights(1, 0, 0.1, 0, element=element))
    channel.send(Goodbye("done"))
    assert [len(pieces) for pieces in calls] == [2, 1]  # one call per frame, never joined
    assert np.shares_memory(np.frombuffer(calls[0][1], dtype="<f4"), element)
    assert channel.bytes_sent == sum(len(p) for p in wire.pieces)
    assert [m.TYPE for m in wire.decode()] == ["weights", "goodbye"]


def test_only_uvloop_transports_gather() -> None:
    assert gathering_writer(Wire()) is None  # e.g. asyncio's 3.11 transports join pieces
    uvloop = pytest.importorskip("uvloop")
    import asyncio

    async def a_uvloop_transport() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        assert gathering_writer(transport) == transport.writelines
        transport.close()
        server.close()
        await server.wait_closed()

    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    with runner:
        runner.run(a_uvloop_transport())


def test_channel_queues_while_paused_and_flushes_in_order() -> None:
    wire = Wire()
    channel = Channel(wire.write)
    channel.writing_paused()
    assert channel.paused
    sent: list[Message] = [
        Goodbye("a"),
        Heartbeat(1.0),
        Lease(1, 0, indices=np.arange(3, dtype="<i8")),
    ]
    for m in sent:
        channel.send(m)
    assert wire.pieces == []
    assert channel.backlog == 3
    assert channel.frames_sent == 0
    channel.writing_resumed()
    assert not channel.paused
    assert channel.backlog == 0
    assert channel.frames_sent == 3
    decoded = wire.decode()
    assert len(decoded) == 3
    for got, want in zip(decoded, sent, strict=True):
        assert_same_message(got, want)


def test_channel_coalesces_weights_in_backlog() -> None:
    wire = Wire()
    channel = Channel(wire.write)
    channel.writing_paused()
    w1 = Weights(1, 0, 0.1, 0, element=np.full(4, 1.0, "<f4"))
    w2 = Weights(2, 0, 0.1, 1, element=np.full(4, 2.0, "<f4"))
    w3 = Weights(3, 0, 0.1, 2, element=np.full(4, 3.0, "<f4"))
    lease = Lease(9, 0, indices=np.arange(5, dtype="<i8"))
    channel.send(w1)
    channel.send(Heartbeat(1.0))
    channel.send(w2)
    channel.send(lease)
    channel.send(Goodbye("x"))
    channel.send(w3)
    assert channel.backlog == 4
    assert channel.weights_coalesced == 2
    channel.writing_resumed()
    decoded = wire.decode()
    assert [m.TYPE for m in decoded] == ["heartbeat", "lease", "goodbye", "weights"]
    newest = decoded[-1]
    assert isinstance(newest, Weights)
    assert newest.version == 3
    np.testing.assert_array_equal(newest.element, w3.element)


def test_channel_keeps_queueing_behind_backlog_and_repauses() -> None:
    wire = Wire()
    pause_on_write = [False]

    def write(piece: bytes | memoryview) -> None:
        wire.write(piece)
        if pause_on_write[0]:
            channel.writing_paused()  # the transport's buffer fills on this frame

    channel = Channel(write)
    channel.writing_paused()
    channel.send(Goodbye("1"))
    channel.send(Goodbye("2"))
    channel.send(Goodbye("3"))
    pause_on_write[0] = True
    channel.writing_resumed()
    assert channel.frames_sent == 1
    assert channel.backlog == 2
    assert channel.paused
    pause_on_write[0] = False
    channel.send(Goodbye("4"))  # queued behind the backlog, not sent ahead of it
    assert channel.frames_sent == 1
    channel.writing_resumed()
    assert channel.backlog == 0
    decoded = wire.decode()
    assert [m.reason for m in decoded if isinstance(m, Goodbye)] == ["1", "2", "3", "4"]


def test_channel_decodes_incoming_through_buffer_protocol() -> None:
    channel = Channel(Wire().write)
    frame = encode_bytes(Heartbeat(2.5)) + encode_bytes(Goodbye("bye"))
    received: list[Message] = []
    position = 0
    while position < len(frame):
        target = channel.get_buffer()
        n = min(len(target), len(frame) - position)
        target[:n] = frame[position : position + n]
        position += n
        received.extend(message for message, _slot in channel.buffer_updated(n))
    assert received == [Heartbeat(2.5), Goodbye("bye")]


# ---------------------------------------------------------------- auth


def test_auth_proof_verifies() -> None:
    nonce = bytes(range(auth.NONCE_BYTES))
    proof = auth.proof("s3cret", nonce)
    assert len(proof) == 32
    assert auth.verify("s3cret", nonce, proof)
    assert auth.proof("s3cret", nonce) == proof  # deterministic


def test_auth_wrong_token_or_nonce_fails() -> None:
    nonce = b"\x01" * auth.NONCE_BYTES
    proof = auth.proof("s3cret", nonce)
    assert not auth.verify("other", nonce, proof)
    assert not auth.verify("s3cret", b"\x02" * auth.NONCE_BYTES, proof)
    assert not auth.verify("s3cret", nonce, b"")
    assert not auth.verify("s3cret", nonce, proof[:-1] + bytes([proof[-1] ^ 1]))
    assert b"s3cret" not in proof
