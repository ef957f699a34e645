"""Pure tests of the wire protocol: framing, decoding, channel, auth and the job."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.channel import Channel
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import (
    ConfigError,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    UnknownMessage,
    VersionMismatch,
)
from snet.protocol.framing import (
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    ArrayInfo,
    FrameLimits,
    encode,
    encode_bytes,
)
from snet.protocol.job import DataSpec, JobSpec, frames_of, split_utterances
from snet.protocol.messages import (
    MESSAGE_TYPES,
    DataInfo,
    ErrorMessage,
    EvalResult,
    Evaluate,
    Frames,
    FramesWanted,
    Goodbye,
    Heartbeat,
    Hello,
    Lease,
    Message,
    ServerHello,
    Update,
    Weights,
    Welcome,
    WorkerReport,
)
from snet.protocol.network import NetworkSpec

# ---------------------------------------------------------------- helpers


def sample_messages() -> list[Message]:
    """One instance of every message type, with arrays of several dtypes and shapes."""
    rng = np.random.default_rng(7)
    job = JobSpec(network=NetworkSpec((117, 8, 10), ("tanh",)), bunch_size=16, chunk_frames=64)
    return [
        ServerHello(PROTOCOL_VERSION, "server-α", bytes(range(32)), True),
        Hello(PROTOCOL_VERSION, "worker-1", "numpy", ("fp16", "int8"), b"\x00\xffproof"),
        Welcome(3, job.to_dict()),
        Weights(7, 2, 0.125, 5, element=rng.standard_normal(37).astype("<f4")),
        Lease(11, 2, indices=rng.permutation(50).astype("<i8")),
        Update(7, 11, 16, 16, 35.25, 9, 0.003, element=rng.standard_normal(37).astype("<f4")),
        Evaluate(8, 2, element=rng.standard_normal((3, 4)).astype("<f8")),
        EvalResult(8, 2, 5520, 4000, 1234.5),
        Heartbeat(1700000000.25),
        ErrorMessage("update_rejected", "NaN in update", False),
        Goodbye("done"),
        WorkerReport(1700000001.5, {"busy_seconds": 1.25, "ratio": 4, "board": "spert-ii"}),
        DataInfo(
            13,
            60,
            norms=rng.standard_normal((2, 13)).astype("<f8"),
            lengths=np.array([20, 40], dtype="<i8"),
        ),
        FramesWanted("cannot read /data/train.pfile"),
        Frames(
            indices=np.array([3, 4, 9], dtype="<i8"),
            features=rng.standard_normal((3, 13)).astype("<f4"),
            labels=np.array([1, 1, 7], dtype="<i4"),
        ),
    ]


def assert_same_message(decoded: Message, original: Message) -> None:
    assert type(decoded) is type(original)
    assert decoded == original  # scalar fields (arrays are compare=False)
    for f in dataclasses.fields(original):
        if f.name in original.ARRAYS or f.name == "slot":
            continue
        assert getattr(decoded, f.name) == getattr(original, f.name), f.name
        assert type(getattr(decoded, f.name)) is type(getattr(original, f.name)), f.name
    for name in original.ARRAYS:
        got, want = getattr(decoded, name), getattr(original, name)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want)


def raw_frame(
    header: Any,
    payload: bytes = b"",
    *,
    magic: bytes = MAGIC,
    version: int = PROTOCOL_VERSION,
    payload_len: int | None = None,
    packed: bytes | None = None,
) -> bytes:
    """A hand-made frame; ``packed`` replaces the msgpack header bytes when given."""
    header_bytes = packed if packed is not None else msgpack.packb(header, use_bin_type=True)
    declared = len(payload) if payload_len is None else payload_len
    return PREFIX.pack(magic, version, 0, len(header_bytes), declared) + header_bytes + payload


def weights_header(**changes: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "type": "weights",
        "version": 1,
        "epoch": 0,
        "learning_rate": 0.5,
        "settled": 0,
        "arrays": [{"dtype": "<f4", "shape": [3], "codec": "none", "nbytes": 12}],
    }
    header.update(changes)
    return header


def array_entry(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"dtype": "<f4", "shape": [3], "codec": "none", "nbytes": 12}
    entry.update(changes)
    return entry


def assert_refuses_further_use(decoder: FrameDecoder) -> None:
    assert not decoder.mid_frame
    with pytest.raises(MalformedFrame):
        decoder.feed(encode_bytes(Goodbye("again")))
    with pytest.raises(MalformedFrame):
        decoder.get_buffer()


# ---------------------------------------------------------------- round trips


def test_samples_cover_every_message_type() -> None:
    assert {m.TYPE for m in sample_messages()} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: m.TYPE)
def test_round_trip_whole_frame(message: Message) -> None:
    decoder = FrameDecoder()
    frame = encode_bytes(message)
    decoded = decoder.feed(frame)
    assert len(decoded) == 1
    assert_same_message(decoded[0], message)
    assert decoder.frames_decoded == 1
    assert decoder.bytes_received == len(frame)
    assert not decoder.mid_frame


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: m.TYPE)
def test_round_trip_one_byte_at_a_time(message: Message) -> None:
    decoder = FrameDecoder()
    frame = encode_bytes(message)
    for i in range(len(frame) - 1):
        assert decoder.feed(frame[i : i + 1]) == []
        assert decoder.mid_frame
    decoded = decoder.feed(frame[-1:])
    assert len(decoded) == 1
    assert_same_message(decoded[0], message)
    assert not decoder.mid_frame


def test_many_frames_in_one_feed_in_order() -> None:
    messages = sample_messages()
    stream = b"".join(encode_bytes(m) for m in messages)
    decoder = FrameDecoder()
    decoded = decoder.feed(stream)
    assert len(decoded) == len(messages)
    for got, want in zip(decoded, messages, strict=True):
        assert_same_message(got, want)
    assert decoder.frames_decoded == len(messages)


def test_frames_split_at_awkward_boundaries() -> None:
    messages = sample_messages()
    stream = b"".join(encode_bytes(m) for m in messages)
    decoder = FrameDecoder()
    decoded: list[Message] = []
    for start in range(0, len(stream), 7):
        decoded.extend(decoder.feed(stream[start : start + 7]))
    assert [m.TYPE for m in decoded] == [m.TYPE for m in messages]
    for got, want in zip(decoded, messages, strict=True):
        assert_same_message(got, want)


def test_buffered_protocol_side_matches_feed() -> None:
    message = sample_messages()[5]  # Update
    frame = encode_bytes(message)
    decoder = FrameDecoder()
    position = 0
    while position < len(frame):
        target = decoder.get_buffer()
        assert len(target) > 0
        n = min(len(target), 5, len(frame) - position)
        target[:n] = frame[position : position + n]
        position += n
        decoder.buffer_updated(n)
    decoded = decoder.messages()
    assert len(decoded) == 1
    assert_same_message(decoded[0], message)
    assert decoder.messages() == []


def test_zero_size_arrays_round_trip() -> None:
    message = Lease(1, 0, indices=np.zeros(0, dtype="<i8"))
    pieces = encode(message)
    assert len(pieces) == 1  # no empty array piece
    decoded = FrameDecoder().feed(encode_bytes(message))
    assert_same_message(decoded[0], message)
    default = Weights(1, 0, 0.1, 0)  # default element is an empty float32 array
    assert_same_message(FrameDecoder().feed(encode_bytes(default))[0], default)


def test_int_value_accepted_for_float_field() -> None:
    header = weights_header(learning_rate=1)
    decoded = FrameDecoder().feed(raw_frame(header, b"\x00" * 12))
    assert isinstance(decoded[0], Weights)
    assert decoded[0].learning_rate == 1.0
    assert isinstance(decoded[0].learning_rate, float)


# ---------------------------------------------------------------- scatter/gather


def test_encode_returns_array_buffers_as_separate_pieces() -> None:
    a = np.arange(10, dtype="<f4")
    message = Weights(1, 0, 0.1, 0, element=a)
    pieces = encode(message)
    assert len(pieces) == 2
    header_piece, array_piece = pieces
    assert isinstance(header_piece, bytes)
    assert header_piece[:2] == MAGIC
    assert isinstance(array_piece, memoryview)
    assert array_piece.nbytes == a.nbytes
    # no copy: the piece is the array's own memory
    assert np.shares_memory(np.frombuffer(array_piece, dtype="<f4"), a)
    _, _, _, header_len, payload_len = PREFIX.unpack(header_piece[:PREFIX_SIZE])
    assert len(header_piece) == PREFIX_SIZE + header_len
    assert payload_len == a.nbytes
    assert b"".join(bytes(p) for p in pieces) == encode_bytes(message)


def test_encode_non_contiguous_array_sends_its_values() -> None:
    base = np.arange(20, dtype="<f4").reshape(4, 5)
    view = base[:, 1]  # strided
    message = Evaluate(1, 0, element=view)
    decoded = FrameDecoder().feed(encode_bytes(message))[0]
    assert isinstance(decoded, Evaluate)
    np.testing.assert_array_equal(decoded.element, view)


# ---------------------------------------------------------------- truncation and limits


def test_truncated_frame_is_mid_frame_and_yields_nothing() -> None:
    frame = encode_bytes(sample_messages()[3])
    decoder = FrameDecoder()
    assert not decoder.mid_frame
    assert decoder.feed(frame[:-1]) == []
    assert decoder.mid_frame
    decoder2 = FrameDecoder()
    assert decoder2.feed(frame[:3]) == []  # inside the prefix
    assert decoder2.mid_frame


def test_oversized_payload_refused_before_allocation() -> None:
    header = msgpack.packb(weights_header(), use_bin_type=True)
    prefix = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, len(header), 2**40)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge):
            decoder.feed(prefix)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert_refuses_further_use(decoder)


def test_payload_over_custom_limit() -> None:
    limits = FrameLimits(max_payload_bytes=8)
    decoder = FrameDecoder(limits)
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))
    # exactly at the limit is fine
    ok = FrameDecoder(FrameLimits(max_payload_bytes=12))
    assert len(ok.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))) == 1


def test_oversized_header_refused_before_allocation() -> None:
    prefix = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 2**32 - 1, 0)
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge):
            decoder.feed(prefix)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert_refuses_further_use(decoder)


def test_header_over_custom_limit() -> None:
    frame = encode_bytes(Goodbye("x" * 100))
    with pytest.raises(FrameTooLarge):
        FrameDecoder(FrameLimits(max_header_bytes=50)).feed(frame)


def test_zero_length_header_refused() -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 0, 0))


# ---------------------------------------------------------------- bad input


def test_bad_magic() -> None:
    frame = encode_bytes(Goodbye("x"))
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame, match="magic"):
        decoder.feed(b"XX" + frame[2:])
    assert_refuses_further_use(decoder)


def test_wrong_protocol_version() -> None:
    decoder = FrameDecoder()
    with pytest.raises(VersionMismatch):
        decoder.feed(raw_frame({"type": "goodbye", "reason": "x"}, version=PROTOCOL_VERSION + 1))
    assert_refuses_further_use(decoder)


def test_garbage_bytes() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame):
        decoder.feed(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert_refuses_further_use(decoder)


def test_garbage_fed_one_byte_at_a_time_fails_at_prefix() -> None:
    decoder = FrameDecoder()
    garbage = bytes(range(200, 216))
    for byte in garbage[:-1]:
        assert decoder.feed(bytes([byte])) == []
    with pytest.raises(MalformedFrame):
        decoder.feed(garbage[-1:])


@pytest.mark.parametrize(
    ("packed", "error"),
    [
        (b"\xc1", MalformedFrame),  # 0xc1 is never used in msgpack
        (msgpack.packb({"type": "goodbye", "reason": "x"}) + b"\x01", MalformedFrame),  # extra
        (msgpack.packb([1, 2, 3]), MalformedFrame),  # not a map
        (msgpack.packb("goodbye"), MalformedFrame),
        (msgpack.packb({"reason": "x"}), MalformedFrame),  # no type
        (msgpack.packb({"type": 5}), MalformedFrame),
        (msgpack.packb({1: "goodbye"}), MalformedFrame),  # non-string map key
        (msgpack.packb({"type": "bogus", "arrays": []}), UnknownMessage),
    ],
    ids=["not-msgpack", "trailing", "list", "str", "no-type", "int-type", "int-key", "unknown"],
)
def test_bad_headers(packed: bytes, error: type[ProtocolError]) -> None:
    decoder = FrameDecoder()
    with pytest.raises(error):
        decoder.feed(raw_frame(None, packed=packed))
    assert_refuses_further_use(decoder)


def test_unknown_message_is_not_a_frame_error() -> None:
    with pytest.raises(UnknownMessage) as info:
        FrameDecoder().feed(raw_frame({"type": "hello_v2", "arrays": []}))
    assert not isinstance(info.value, FrameError)
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"type": "heartbeat", "arrays": []}, "lacks field 'sent_at'"),
        ({"type": "heartbeat", "sent_at": 1.0, "arrays": [], "extra": 1}, "unknown field"),
        ({"type": "heartbeat", "sent_at": "soon", "arrays": []}, "sent_at"),
        ({"type": "heartbeat", "sent_at": True, "arrays": []}, "sent_at"),
        ({"type": "eval_result", "version": True, "epoch": 0, "frames": 1, "correct": 1,
          "loss_sum": 1.0, "arrays": []}, "version"),  # bool where int expected
        ({"type": "eval_result", "version": 1.5, "epoch": 0, "frames": 1, "correct": 1,
          "loss_sum": 1.0, "arrays": []}, "version"),  # float where int expected
        ({"type": "server_hello", "protocol_version": 1, "server_name": "s",
          "nonce": "not-bytes", "auth_required": True, "arrays": []}, "nonce"),
        ({"type": "server_hello", "protocol_version": 1, "server_name": b"s",
          "nonce": b"n", "auth_required": True, "arrays": []}, "server_name"),
        ({"type": "server_hello", "protocol_version": 1, "server_name": "s",
          "nonce": b"n", "auth_required": 1, "arrays": []}, "auth_required"),
        ({"type": "hello", "protocol_version": 1, "worker_name": "w", "backend": "numpy",
          "capabilities": ["fp16", 3], "proof": b"", "arrays": []}, "capabilities"),
        ({"type": "hello", "protocol_version": 1, "worker_name": "w", "backend": "numpy",
          "capabilities": "fp16", "proof": b"", "arrays": []}, "capabilities"),
        ({"type": "welcome", "worker_id": 1, "job": [1, 2], "arrays": []}, "job"),
        ({"type": "goodbye", "reason": None, "arrays": []}, "reason"),
    ],
    ids=[
        "missing", "extra", "str-for-float", "bool-for-float", "bool-for-int", "float-for-int",
        "str-for-bytes", "bytes-for-str", "int-for-bool", "tuple-item", "tuple-str",
        "dict", "none",
    ],
)  # fmt: skip
def test_bad_fields(header: dict[str, Any], match: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame, match=match):
        decoder.feed(raw_frame(header))
    assert_refuses_further_use(decoder)


@pytest.mark.parametrize(
    ("arrays", "payload"),
    [
        ([array_entry(nbytes=8)], b"\x00" * 8),  # nbytes does not match dtype x shape
        ([array_entry(dtype="|O", nbytes=24)], b"\x00" * 24),  # disallowed dtype
        ([array_entry(dtype=">f4")], b"\x00" * 12),  # big-endian is not allowed
        ([array_entry(dtype="<c8", nbytes=24)], b"\x00" * 24),
        ([array_entry(codec="zstd")], b"\x00" * 12),
        ([array_entry(shape=[-3])], b"\x00" * 12),
        ([array_entry(shape=[True, 3])], b"\x00" * 12),
        ([array_entry(shape=[1] * 9, nbytes=4)], b"\x00" * 4),  # ndim over the limit
        ([array_entry(shape="3")], b"\x00" * 12),
        ([array_entry(nbytes=-12)], b"\x00" * 12),
        ([array_entry(nbytes=12.0)], b"\x00" * 12),
        ([], b""),  # Weights carries one array
        ([array_entry(), array_entry()], b"\x00" * 24),
        (["<f4"], b"\x00" * 12),
        ({"dtype": "<f4"}, b"\x00" * 12),
    ],
    ids=[
        "nbytes", "object", "big-endian", "complex", "codec", "negative", "bool-dim", "ndim",
        "shape-str", "nbytes-negative", "nbytes-float", "none", "two", "entry-str", "not-list",
    ],
)  # fmt: skip
def test_bad_array_descriptors(arrays: Any, payload: bytes) -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(weights_header(arrays=arrays), payload))
    assert_refuses_further_use(decoder)


def test_unhashable_dtype_is_malformed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(weights_header(arrays=[array_entry(dtype=["<f4"])]), b"\0" * 12))
    assert_refuses_further_use(decoder)


def test_overflowing_shape_is_malformed() -> None:
    decoder = FrameDecoder()
    entry = array_entry(dtype="|u1", shape=[2**32, 2**32], nbytes=0)
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(weights_header(arrays=[entry])))
    assert_refuses_further_use(decoder)


def test_payload_length_mismatch() -> None:
    # The prefix declares 16 payload bytes, the arrays need 12.
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(weights_header(), b"\x00" * 16))
    assert_refuses_further_use(decoder)
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(weights_header(), b"\x00" * 8))
    assert_refuses_further_use(decoder)


def test_error_after_good_frame_keeps_earlier_message_count() -> None:
    decoder = FrameDecoder()
    good = encode_bytes(Goodbye("fine"))
    assert len(decoder.feed(good)) == 1
    with pytest.raises(MalformedFrame):
        decoder.feed(b"XX" + good[2:])
    assert decoder.frames_decoded == 1


# ---------------------------------------------------------------- payload sink


class RecordingSink:
    """A PayloadSink that hands out preallocated buffers for weights frames."""

    def __init__(self, size: int) -> None:
        self.buffers: list[np.ndarray] = []
        self.size = size
        self.calls: list[tuple[str, tuple[ArrayInfo, ...], int]] = []

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None:
        self.calls.append((message_type, arrays, payload_bytes))
        if message_type != "weights" or payload_bytes != self.size * 4:
            return None
        buffer = np.full(self.size, -1.0, dtype="<f4")
        self.buffers.append(buffer)
        return buffer.data.cast("B"), f"token-{len(self.buffers)}"


def test_sink_receives_payload_in_place() -> None:
    sink = RecordingSink(6)
    decoder = FrameDecoder(sink=sink)
    sent = Weights(4, 1, 0.2, 3, element=np.arange(6, dtype="<f4"))
    frame = encode_bytes(sent)
    decoded: list[Message] = []
    for i in range(len(frame)):  # byte by byte, so the payload is written piecewise
        decoded.extend(decoder.feed(frame[i : i + 1]))
    assert len(decoded) == 1
    message = decoded[0]
    assert isinstance(message, Weights)
    assert message.slot == "token-1"
    assert np.shares_memory(message.element, sink.buffers[0])
    np.testing.assert_array_equal(sink.buffers[0], np.arange(6))
    assert sink.calls[0][0] == "weights"
    assert sink.calls[0][1] == (ArrayInfo("<f4", (6,), "none", 24),)
    assert sink.calls[0][2] == 24
    # the sink is asked for every frame with a payload; a refusal means a private buffer
    other = Weights(5, 1, 0.2, 3, element=np.arange(4, dtype="<f4"))
    got = decoder.feed(encode_bytes(other))[0]
    assert isinstance(got, Weights)
    assert got.slot is None
    assert not any(np.shares_memory(got.element, b) for b in sink.buffers)
    np.testing.assert_array_equal(got.element, np.arange(4))


def test_sink_not_asked_for_frames_without_payload() -> None:
    sink = RecordingSink(6)
    decoder = FrameDecoder(sink=sink)
    decoder.feed(encode_bytes(Goodbye("x")))
    decoder.feed(encode_bytes(Weights(1, 0, 0.1, 0)))
    assert sink.calls == []


def test_sink_buffer_of_wrong_size_is_refused() -> None:
    class WrongSink:
        def payload_target(
            self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
        ) -> tuple[memoryview, object] | None:
            return memoryview(bytearray(payload_bytes + 1)), "wrong"

    decoder = FrameDecoder(sink=WrongSink())
    with pytest.raises(MalformedFrame):
        decoder.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))


def test_abandon_returns_token_of_partial_frame() -> None:
    sink = RecordingSink(6)
    decoder = FrameDecoder(sink=sink)
    frame = encode_bytes(Weights(4, 1, 0.2, 3, element=np.arange(6, dtype="<f4")))
    assert decoder.feed(frame[:-5]) == []
    assert decoder.mid_frame
    assert decoder.abandon() == "token-1"
    assert not decoder.mid_frame
    with pytest.raises(MalformedFrame):
        decoder.feed(frame[-5:])


def test_abandon_without_sink_or_between_frames_returns_none() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))
    assert decoder.abandon() is None
    partial = FrameDecoder()
    partial.feed(encode_bytes(Goodbye("x"))[:10])
    assert partial.abandon() is None


def test_abandon_after_bad_fields_still_returns_token() -> None:
    # The fields are checked only after the payload has landed in the sink's buffer; the
    # token must not be lost when they are bad.
    sink = RecordingSink(3)
    decoder = FrameDecoder(sink=sink)
    header = weights_header()
    del header["settled"]
    with pytest.raises(MalformedFrame):
        decoder.feed(raw_frame(header, b"\x00" * 12))
    assert decoder.abandon() == "token-1"


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
        received.extend(channel.buffer_updated(n))
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


# ---------------------------------------------------------------- job


def test_jobspec_round_trip() -> None:
    job = JobSpec(
        network=NetworkSpec((117, 32, 16, 10), ("relu", "tanh")),
        data=DataSpec(context=4, cv_fraction=0.2, split_seed=5),
        mode="sync",
        bunch_size=32,
        learning_rates=(0.5, 0.25),
        momentum=0.5,
        epochs=3,
        updates_per_step=2,
        max_in_flight=4,
        chunk_frames=256,
        seed=9,
    )
    assert JobSpec.from_dict(job.to_dict()) == job
    # through msgpack, as it travels in Welcome
    wire = msgpack.unpackb(msgpack.packb(job.to_dict(), use_bin_type=True), raw=False)
    assert JobSpec.from_dict(wire) == job
    assert JobSpec.from_dict(JobSpec().to_dict()) == JobSpec()
    welcome = Welcome(1, job.to_dict())
    decoded = FrameDecoder().feed(encode_bytes(welcome))[0]
    assert isinstance(decoded, Welcome)
    assert JobSpec.from_dict(decoded.job) == job


def test_jobspec_learning_rate_schedule() -> None:
    job = JobSpec(learning_rates=(0.4, 0.2, 0.1))
    assert [job.learning_rate(e) for e in range(5)] == [0.4, 0.2, 0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "bsp"},
        {"bunch_size": 0},
        {"epochs": 0},
        {"learning_rates": ()},
        {"learning_rates": (0.1, 0.0)},
        {"learning_rates": (-0.1,)},
        {"momentum": 1.0},
        {"momentum": -0.1},
        {"chunk_frames": 64, "bunch_size": 128},
        {"max_in_flight": 0},
        {"updates_per_step": -1},
        {"network": NetworkSpec((100, 10), ())},  # fsdd with context 4 needs 117 inputs
        {"data": DataSpec(context=2)},
    ],
)
def test_jobspec_bad_values(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        JobSpec(**changes)


def test_jobspec_input_size_not_checked_for_npz_sources() -> None:
    job = JobSpec(network=NetworkSpec((20, 4), ()), data=DataSpec(source="/data/x.npz"))
    assert job.network.input_size == 20


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("network"),
        lambda d: d.update(unknown_field=1),
        lambda d: d.update(network={"sizes": [117]}),
        lambda d: d.update(network="117:512:10"),
        lambda d: d.update(data={"context": -1}),
        lambda d: d.update(data={"nonsense": 1}),
        lambda d: d.update(learning_rates=None),
        lambda d: d.update(mode="turbo"),
        lambda d: d.update(bunch_size="128"),
    ],
    ids=[
        "no-network", "unknown", "short", "net-str", "context", "data-key", "lr-none", "mode",
        "bunch-str",
    ],
)  # fmt: skip
def test_jobspec_from_bad_dict(mutate: Any) -> None:
    data = JobSpec().to_dict()
    mutate(data)
    with pytest.raises(ConfigError):
        JobSpec.from_dict(data)


def test_jobspec_from_dict_non_numeric_rate_is_config_error() -> None:
    data = JobSpec().to_dict()
    data["learning_rates"] = ["fast"]
    with pytest.raises(ConfigError):
        JobSpec.from_dict(data)


def test_jobspec_nan_learning_rate_is_config_error() -> None:
    with pytest.raises(ConfigError):
        JobSpec(learning_rates=(math.nan,))


@pytest.mark.parametrize("changes", [{"context": -1}, {"cv_fraction": 0.0}, {"cv_fraction": 1.0}])
def test_dataspec_bad_values(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        DataSpec(**changes)


def test_dataspec_window() -> None:
    assert DataSpec(context=4).window == 9
    assert DataSpec(context=0).window == 1


@pytest.mark.parametrize(("utterances", "fraction"), [(2, 0.1), (10, 0.5), (3000, 0.1), (7, 0.99)])
def test_split_utterances_deterministic_disjoint_covering(utterances: int, fraction: float) -> None:
    train, cv = split_utterances(utterances, fraction, seed=3)
    train2, cv2 = split_utterances(utterances, fraction, seed=3)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(cv, cv2)
    assert len(np.intersect1d(train, cv)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, cv])), np.arange(utterances))
    assert len(train) >= 1 and len(cv) >= 1
    assert len(cv) == min(max(1, round(utterances * fraction)), utterances - 1)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(cv) > 0)


def test_split_utterances_depends_on_seed() -> None:
    a, _ = split_utterances(100, 0.3, seed=0)
    b, _ = split_utterances(100, 0.3, seed=1)
    assert not np.array_equal(a, b)


def test_split_utterances_needs_two() -> None:
    with pytest.raises(ConfigError):
        split_utterances(1, 0.5, seed=0)


def test_frames_of() -> None:
    lengths = np.array([2, 3, 4, 1])
    np.testing.assert_array_equal(frames_of(np.array([0, 2]), lengths), [0, 1, 5, 6, 7, 8])
    np.testing.assert_array_equal(frames_of(np.array([3, 1]), lengths), [9, 2, 3, 4])
    everything = frames_of(np.arange(4), lengths)
    np.testing.assert_array_equal(everything, np.arange(10))
    empty = frames_of(np.zeros(0, dtype=np.int64), lengths)
    assert empty.shape == (0,)
    assert empty.dtype == np.int64
    assert frames_of(np.array([1]), lengths).dtype == np.int64
