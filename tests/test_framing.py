"""Pure tests of framing and decoding: round trips, limits, bad input (the payload sink:
test_payload_sink.py)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import (
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
    FrameLimits,
    encode,
    encode_bytes,
)
from snet.protocol.messages import (
    MESSAGE_TYPES,
    Evaluate,
    Goodbye,
    Lease,
    Message,
    Weights,
)

from protocol_samples import (
    array_entry,
    assert_refuses_further_use,
    assert_same_message,
    raw_frame,
    sample_messages,
    weights_header,
)

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


def assert_refused_before_allocation(prefix: bytes) -> None:
    """A prefix announcing a huge part is refused without allocating for it."""
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


def test_oversized_payload_refused_before_allocation() -> None:
    header = msgpack.packb(weights_header(), use_bin_type=True)
    assert_refused_before_allocation(PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, len(header), 2**40))


def test_payload_over_custom_limit() -> None:
    limits = FrameLimits(max_payload_bytes=8)
    decoder = FrameDecoder(limits)
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))
    # exactly at the limit is fine
    ok = FrameDecoder(FrameLimits(max_payload_bytes=12))
    assert len(ok.feed(encode_bytes(Weights(1, 0, 0.1, 0, element=np.zeros(3, "<f4"))))) == 1


def test_oversized_header_refused_before_allocation() -> None:
    assert_refused_before_allocation(PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, 2**32 - 1, 0))


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
        (b"\x91" * 60_000 + b"\xc0", MalformedFrame),  # msgpack's StackError has no words
    ],
    ids=["0xc1", "trailing", "list", "str", "no-type", "int-type", "int-key", "unknown", "deep"],
)
def test_bad_headers(packed: bytes, error: type[ProtocolError]) -> None:
    decoder = FrameDecoder()
    with pytest.raises(error) as caught:
        decoder.feed(raw_frame(None, packed=packed))
    assert not str(caught.value).rstrip().endswith(":"), caught.value  # it says what
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
        ({"type": "heartbeat", "sent_at": 1.0, "arrays": [], "x": 1, b"y": 2},
         r"unknown field\(s\) \['x', b'y'\]"),  # str and bytes keys, named in one list
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
        "missing", "extra", "extra-str-and-bytes", "str-for-float", "bool-for-float",
        "bool-for-int", "float-for-int", "str-for-bytes", "bytes-for-str", "int-for-bool",
        "tuple-item", "tuple-str", "dict", "none",
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
    # empty, with dimensions no frame could fill (numpy's ValueError was the refusal's text)
    for shape in ([2**40, 2**40, 0], [0, 2**62]):
        decoder = FrameDecoder()
        entry = array_entry(dtype="<f4", shape=shape, nbytes=0)
        with pytest.raises(MalformedFrame, match="larger than any frame"):
            decoder.feed(raw_frame(weights_header(arrays=[entry])))


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
