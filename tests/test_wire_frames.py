"""Hand-built frames decode, encoder frames parse, and refusals carry the README's codes."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.codecs.sparse import TopKCodec
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import ProtocolError
from snet.protocol.framing import FrameLimits, encode_bytes
from snet.protocol.messages import (
    MESSAGE_TYPES,
    DataInfo,
    ErrorMessage,
    Goodbye,
    Heartbeat,
    Lease,
    Update,
    Weights,
)
from snet.protocol.network import ElementLayout, NetworkSpec

from wire_samples import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    ELEMENT,
    ELEMENT_VALUES,
    MAX_HEADER_BYTES,
    NETWORK,
    PREFIX_BYTES,
    PREFIX_FORMAT,
    README_DTYPES,
    SAMPLE_IDS,
    SAMPLES,
    HandArray,
    Sample,
    assert_is_sample,
    decode_one,
    descriptor,
    hand_frame,
    parse_frame,
    raw_frame,
    readme_text,
)

# ---------------------------------------------------------------- hand-built frames decode


def test_samples_cover_every_message_type() -> None:
    assert list(MESSAGE_TYPES) == SAMPLE_IDS


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_hand_built_frame_decodes(sample: Sample) -> None:
    frame = hand_frame(sample.type_name, sample.scalars, sample.arrays)
    assert_is_sample(decode_one(frame), sample)
    one_byte_at_a_time = FrameDecoder()
    decoded = [m for i in range(len(frame)) for m in one_byte_at_a_time.feed(frame[i : i + 1])]
    assert len(decoded) == 1
    assert_is_sample(decoded[0], sample)


def test_hand_built_frames_back_to_back_decode_in_order() -> None:
    stream = b"".join(hand_frame(s.type_name, s.scalars, s.arrays) for s in SAMPLES)
    decoded = FrameDecoder().feed(stream)
    assert len(decoded) == len(SAMPLES)
    for message, sample in zip(decoded, SAMPLES, strict=True):
        assert_is_sample(message, sample)


def test_receivers_accept_the_optional_and_alternative_forms() -> None:
    # No "arrays" key for a type without arrays; no "codec"; float fields as float 32 or int.
    assert decode_one(raw_frame({"type": "goodbye", "reason": "bye"})) == Goodbye("bye")
    no_codec = {"type": "lease", "lease_id": 1, "epoch": 0}
    no_codec["arrays"] = [{"dtype": "<i8", "shape": [1], "nbytes": 8}]
    lease = decode_one(raw_frame(no_codec, struct.pack("<q", 42)))
    assert isinstance(lease, Lease) and lease.indices.tolist() == [42]
    single = msgpack.packb(
        {"type": "heartbeat", "sent_at": 2.5, "arrays": []}, use_single_float=True
    )
    assert b"\xca" in single  # msgpack float 32
    prefix = struct.pack(PREFIX_FORMAT, b"SN", 1, 0, len(single), 0)
    assert decode_one(prefix + single) == Heartbeat(2.5)
    int_for_float = raw_frame({"type": "heartbeat", "sent_at": 7, "arrays": []})
    assert decode_one(int_for_float) == Heartbeat(7.0)
    # An error without the (optional) lease_id and offset names no update.
    error = decode_one(raw_frame({"type": "error", "code": "timeout", "text": "t", "fatal": True}))
    assert isinstance(error, ErrorMessage) and (error.lease_id, error.offset) == (-1, -1)


# Three items of each README dtype, in struct's explicit little-endian formats.
STRUCT_FORMATS = {
    "<f4": "<3f",
    "<f2": "<3e",
    "<f8": "<3d",
    "<i4": "<3i",
    "<i8": "<3q",
    "|u1": "<3B",
    "|i1": "<3b",
    "<u2": "<3H",
    "<u4": "<3I",
}


@pytest.mark.parametrize("dtype", sorted(README_DTYPES))
def test_every_readme_dtype_decodes_little_endian(dtype: str) -> None:
    # The arrays' bytes come from struct's explicit little-endian codes, not from numpy.
    unsigned = {"|u1": [1, 2, 255], "<u2": [1, 2, 65535], "<u4": [1, 2, 2**32 - 1]}
    values = unsigned.get(dtype, [1, -2, 3])
    raw = struct.pack(STRUCT_FORMATS[dtype], *values)
    assert len(raw) == 3 * README_DTYPES[dtype]
    lease = decode_one(hand_frame("lease", {"lease_id": 1, "epoch": 0}, [(dtype, [3], raw)]))
    assert isinstance(lease, Lease)
    assert lease.indices.dtype == np.dtype(dtype) and lease.indices.tolist() == values


def test_arrays_are_read_without_alignment() -> None:
    # Ints of 1, 2 and 3 msgpack bytes shift the element to every offset modulo 4.
    offsets = set()
    for version, settled in itertools.product((5, 200), (2, 60000)):
        scalars = {"version": version, "epoch": 1, "learning_rate": 0.1, "settled": settled}
        frame = hand_frame("weights", scalars, [ELEMENT])
        offsets.add((PREFIX_BYTES + struct.unpack_from(PREFIX_FORMAT, frame)[3]) % 4)
        weights = decode_one(frame)
        assert isinstance(weights, Weights) and weights.settled == settled
        assert weights.element.tolist() == ELEMENT_VALUES
    assert offsets == {0, 1, 2, 3}


# ---------------------------------------------------------------- encoder frames parse


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_encoder_frame_parses_by_the_readme(sample: Sample) -> None:
    frame = encode_bytes(sample.message)
    header, arrays, length = parse_frame(frame)
    assert length == len(frame)
    assert header == {
        "type": sample.type_name,
        **sample.scalars,
        "arrays": [descriptor(*array) for array in sample.arrays],
    }
    assert [a.tobytes() for a in arrays] == [raw for _, _, raw in sample.arrays]
    # The README gives the encoder's key order (type, fields in table order, arrays) and
    # float 64 for floats, so a hand-built frame in that order is byte-identical.
    assert frame == hand_frame(
        sample.type_name, sample.scalars, sample.arrays, canonical_order=True
    )


# ---------------------------------------------------------------- refusals and limits

GOOD_LEASE = {"type": "lease", "lease_id": 1, "epoch": 0}
LEASE_ARRAY = {"dtype": "<i8", "shape": [2], "codec": "none", "nbytes": 16}


def lease_with(entry: dict[str, Any], payload: bytes = b"\0" * 16) -> bytes:
    return raw_frame({**GOOD_LEASE, "arrays": [entry]}, payload)


def prefix(
    magic: bytes = b"SN", version: int = 1, header: int = 10, payload: int = 0, flags: int = 0
) -> bytes:
    return struct.pack(PREFIX_FORMAT, magic, version, flags, header, payload)


REFUSALS = [
    pytest.param(prefix(magic=b"GE"), "malformed_frame", id="bad-magic"),
    pytest.param(prefix(version=2), "version_mismatch", id="prefix-version-2"),
    pytest.param(prefix(header=0), "malformed_frame", id="header-length-0"),
    pytest.param(prefix(flags=1), "malformed_frame", id="flags-not-zero"),
    pytest.param(prefix(header=MAX_HEADER_BYTES + 1), "frame_too_large", id="header-over-64k"),
    pytest.param(
        prefix(payload=DEFAULT_MAX_PAYLOAD_BYTES + 1), "frame_too_large", id="payload-over-512M"
    ),
    pytest.param(raw_frame([1, 2]), "malformed_frame", id="header-not-a-map"),
    pytest.param(raw_frame({"reason": "x"}), "malformed_frame", id="no-type"),
    pytest.param(raw_frame({"type": "shout", "arrays": []}), "unknown_message", id="unknown-type"),
    pytest.param(
        raw_frame({"type": "goodbye", "reason": "x", "arrays": [], "extra": 1}),
        "malformed_frame",
        id="unknown-field",
    ),
    pytest.param(raw_frame({"type": "goodbye", "arrays": []}), "malformed_frame", id="no-field"),
    pytest.param(
        raw_frame({"type": "heartbeat", "sent_at": True, "arrays": []}),
        "malformed_frame",
        id="bool-for-float",
    ),
    pytest.param(
        raw_frame({**GOOD_LEASE, "epoch": False, "arrays": [LEASE_ARRAY]}, b"\0" * 16),
        "malformed_frame",
        id="bool-for-int",
    ),
    pytest.param(
        raw_frame({"type": "error", "code": "x", "text": "y", "fatal": 1, "arrays": []}),
        "malformed_frame",
        id="int-for-bool",
    ),
    pytest.param(
        raw_frame(
            {"type": "server_hello", "protocol_version": 1, "server_name": "s"}
            | {"nonce": "not bin", "auth_required": False, "arrays": []}
        ),
        "malformed_frame",
        id="str-for-bin",
    ),
    pytest.param(
        raw_frame({"type": "welcome", "worker_id": 1, "job": {1: 2}, "arrays": []}),
        "malformed_frame",
        id="int-map-key",
    ),
    pytest.param(raw_frame({**GOOD_LEASE, "arrays": []}), "malformed_frame", id="array-missing"),
    pytest.param(lease_with({**LEASE_ARRAY, "dtype": ">i8"}), "malformed_frame", id="big-endian"),
    pytest.param(lease_with({**LEASE_ARRAY, "dtype": "<u8"}), "malformed_frame", id="dtype-<u8"),
    pytest.param(lease_with({**LEASE_ARRAY, "codec": "zstd"}), "malformed_frame", id="codec"),
    pytest.param(lease_with({**LEASE_ARRAY, "nbytes": 15}, b"\0" * 15), "malformed_frame", id="nb"),
    pytest.param(
        lease_with({**LEASE_ARRAY, "shape": [1] * 9, "nbytes": 8}, b"\0" * 8),
        "malformed_frame",
        id="ndim-9",
    ),
    pytest.param(
        raw_frame({**GOOD_LEASE, "arrays": [LEASE_ARRAY]}, b"\0" * 24),
        "malformed_frame",
        id="payload-longer-than-arrays",
    ),
]


@pytest.mark.parametrize(("frame", "code"), REFUSALS)
def test_refusals_carry_the_readme_code(frame: bytes, code: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(frame)
    assert caught.value.code == code
    with pytest.raises(ProtocolError):  # the decoder is finished: the connection must close
        decoder.get_buffer()


def test_extra_bytes_after_the_header_map_are_refused() -> None:
    packed = msgpack.packb({"type": "goodbye", "reason": "x", "arrays": []}) + b"\xc0"
    frame = struct.pack(PREFIX_FORMAT, b"SN", 1, 0, len(packed), 0) + packed
    with pytest.raises(ProtocolError) as caught:
        FrameDecoder().feed(frame)
    assert caught.value.code == "malformed_frame"


def test_size_limits_are_checked_on_the_prefix_alone() -> None:
    # Only the 16 prefix bytes are fed: the refusal must not wait for the header or payload.
    for frame in (prefix(header=MAX_HEADER_BYTES + 1), prefix(payload=2048)):
        with pytest.raises(ProtocolError) as caught:
            FrameDecoder(FrameLimits(max_payload_bytes=1024)).feed(frame)
        assert caught.value.code == "frame_too_large"
    at_limits = hand_frame("lease", {"lease_id": 1, "epoch": 0}, [("|u1", [1024], b"\1" * 1024)])
    assert isinstance(decode_one(at_limits, FrameLimits(max_payload_bytes=1024)), Lease)


def test_readme_states_the_limits_the_code_uses() -> None:
    text = readme_text()
    limits = FrameLimits()
    assert limits.max_header_bytes == MAX_HEADER_BYTES and f"{MAX_HEADER_BYTES}" in text
    assert limits.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES
    assert f"{DEFAULT_MAX_PAYLOAD_BYTES}" in text
    assert limits.max_ndim == 8 and "at most 8" in text
    assert PROTOCOL_VERSION == 1 and struct.calcsize(PREFIX_FORMAT) == PREFIX_BYTES


# ---------------------------------------------------------------- encoded elements (8.8)


def encoded_update(codec: str, parts: list[HandArray]) -> bytes:
    """An update whose element is the parts of ``codec``, built from the README alone."""
    scalars = {
        "base_version": 0,
        "lease_id": 1,
        "offset": 0,
        "patterns": 8,
        "loss_sum": 1.0,
        "correct": 1,
        "compute_seconds": 0.01,
    }
    descriptors = [{"dtype": d, "shape": s, "codec": codec, "nbytes": len(r)} for d, s, r in parts]
    header = {"type": "update", **scalars, "arrays": descriptors}
    return raw_frame(header, b"".join(raw for _, _, raw in parts))


def decoded_element(frame: bytes) -> np.ndarray:
    from snet.protocol.codecs import parse_codec

    update = decode_one(frame)
    assert isinstance(update, Update) and update.encoded is not None
    out = ElementLayout.for_network(NETWORK).allocate()
    parse_codec(update.encoded.codec).decode(
        ElementLayout.for_network(NETWORK), update.encoded, out
    )
    return out


def test_hand_built_topk_update_decodes_as_the_readme_says() -> None:
    # 2:3:2 segments hold 6, 3, 6 and 2 values; topk:0.5 keeps ceil(n / 2) of each.
    kept = {0: ([1, 4, 5], [1.5, -2.0, 3.0]), 1: ([0, 2], [0.5, 0.25]), 2: ([0, 1, 3], [7, 8, 9])}
    kept[3] = ([1], [-1.0])
    parts: list[HandArray] = []
    expected: list[float] = []
    for segment, size in enumerate((6, 3, 6, 2)):
        indices, values = kept[segment]
        gaps = [i - previous - 1 for previous, i in zip([-1, *indices], indices, strict=False)]
        parts.append(("|u1", [len(gaps)], bytes(gaps)))  # every gap < 128: one byte each
        parts.append(("<f4", [len(values)], struct.pack(f"<{len(values)}f", *values)))
        dense = [0.0] * size
        for index, value in zip(indices, values, strict=True):
            dense[index] = value
        expected += dense
    assert decoded_element(encoded_update("topk:0.5", parts)).tolist() == expected
    # A gap of 300 = 0b10_0101100 takes two varint bytes, low 7 bits first: 0xAC 0x02.
    big = ElementLayout.for_network(NetworkSpec.parse("20:20:2"))  # W0 has 400 values
    two_bytes = [("|u1", [2], bytes([0x2C | 0x80, 0x02])), ("<f4", [1], struct.pack("<f", 5.0))]
    rest = [("|u1", [0], b""), ("<f4", [0], b"")] * 3
    frame = encoded_update("topk:0.002", [*two_bytes, *rest])  # keeps ceil(0.92) = 1
    message = decode_one(frame)
    assert isinstance(message, Update) and message.encoded is not None
    out = big.allocate()
    TopKCodec(0.002).decode(big, message.encoded, out)
    assert out[300] == 5.0 and np.count_nonzero(out) == 1


def test_hand_built_sign_update_decodes_as_the_readme_says() -> None:
    # One block per segment: a scale, then the sign bits, least significant bit first.
    bits = {0: 0b101001, 1: 0b011, 2: 0b111111, 3: 0b10}
    scales = {0: 0.5, 1: 2.0, 2: 0.25, 3: 4.0}
    parts: list[HandArray] = []
    expected: list[float] = []
    for segment, size in enumerate((6, 3, 6, 2)):
        parts.append(("<f4", [1], struct.pack("<f", scales[segment])))
        parts.append(("|u1", [1], bytes([bits[segment]])))
        expected += [
            scales[segment] if bits[segment] >> i & 1 else -scales[segment] for i in range(size)
        ]
    assert decoded_element(encoded_update("sign", parts)).tolist() == expected


@pytest.mark.parametrize(
    ("descriptors", "why"),
    [
        ([("topk:0.5", "<u2"), ("sign", "<f4")], "several codecs"),
        ([("zstd", "<u2")], "unknown array codec"),
        ([("topk:.5", "<u2")], "unknown array codec"),  # not the canonical spelling
    ],
)
def test_encoded_descriptors_are_checked_on_the_header(
    descriptors: list[tuple[str, str]], why: str
) -> None:
    entries = [{"dtype": d, "shape": [1], "codec": c, "nbytes": 2} for c, d in descriptors]
    entries = [{**e, "nbytes": 4} if e["dtype"] == "<f4" else e for e in entries]
    frame = raw_frame(
        {"type": "update", "arrays": entries}, b"\0" * sum(e["nbytes"] for e in entries)
    )
    with pytest.raises(ProtocolError, match=why) as caught:
        FrameDecoder().feed(frame)
    assert caught.value.code == "malformed_frame"
    lease = lease_with({**LEASE_ARRAY, "codec": "sign"})
    with pytest.raises(ProtocolError, match="cannot carry an element encoded"):
        FrameDecoder().feed(lease)


def test_the_labels_digest_is_left_out_where_it_was_not_asked_for() -> None:
    """A worker of an earlier version refuses a data_info with a field it does not know:
    the server sends the digest only to a worker that says it checks it (``data:labels``),
    and the encoder leaves the field out at its default."""
    norms, lengths = np.zeros((2, 2), "<f8"), np.array([3, 2], "<i8")
    bare = parse_frame(encode_bytes(DataInfo(2, 5, norms=norms, lengths=lengths)))[0]
    assert "labels" not in bare and bare["features"] == 2
    told = DataInfo(2, 5, norms=norms, lengths=lengths, labels="8bd69e52")
    assert parse_frame(encode_bytes(told))[0]["labels"] == "8bd69e52"
