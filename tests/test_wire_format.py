"""Conformance of snet's wire format with its written description, protocol/README.md.

Frames are built by hand from the README (``struct`` for the prefix, ``msgpack`` for the
header, raw little-endian bytes for the arrays; never snet's encoder) and must decode with
snet's ``FrameDecoder`` into the right messages; frames from snet's encoder must parse with
the small parser below, written from the README alone. The README's examples (hex dumps,
the token-proof vector, the job), its message tables, dtype table and error codes are
checked against the code, so that the document cannot go stale.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
import struct
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol import PROTOCOL_VERSION, auth, errors
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import ProtocolError
from snet.protocol.framing import ALLOWED_DTYPES, FrameLimits, encode_bytes
from snet.protocol.job import JobSpec
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
from snet.protocol.network import ELEMENT_DTYPE, ElementLayout, NetworkSpec

README = Path(__file__).resolve().parents[1] / "protocol" / "README.md"

# ---------------------------------------------------------------- the README, by hand

PREFIX_FORMAT = ">2sBBIQ"  # magic, version, flags, header length, payload length
PREFIX_BYTES = 16
MAX_HEADER_BYTES = 65536
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024 * 1024

# One array as the README describes it: (dtype string, shape, the raw payload bytes).
HandArray = tuple[str, list[int], bytes]


def descriptor(dtype: str, shape: list[int], raw: bytes) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "codec": "none", "nbytes": len(raw)}


def hand_frame(
    type_name: str,
    scalars: dict[str, Any],
    arrays: list[HandArray] = [],  # noqa: B006 - never mutated
    *,
    canonical_order: bool = False,
) -> bytes:
    """A frame built from the README alone.

    The header keys go in the reference encoder's order (type, fields, arrays) when
    ``canonical_order``, else in reverse, since receivers must not depend on the order.
    """
    descriptors = [descriptor(*array) for array in arrays]
    header: dict[str, Any]
    if canonical_order:
        header = {"type": type_name, **scalars, "arrays": descriptors}
    else:
        header = {"arrays": descriptors, **dict(reversed(scalars.items())), "type": type_name}
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    payload = b"".join(raw for _, _, raw in arrays)
    return struct.pack(PREFIX_FORMAT, b"SN", 1, 0, len(packed), len(payload)) + packed + payload


def raw_frame(header: Any, payload: bytes = b"") -> bytes:
    """A frame around any header value (for refusals and optional forms)."""
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    return struct.pack(PREFIX_FORMAT, b"SN", 1, 0, len(packed), len(payload)) + packed + payload


def parse_frame(data: bytes) -> tuple[dict[str, Any], list[np.ndarray], int]:
    """The README's frame format, parsed by hand: (header, arrays, frame length)."""
    magic, version, flags, header_len, payload_len = struct.unpack_from(PREFIX_FORMAT, data)
    assert (magic, version, flags) == (b"SN", 1, 0)
    header_end = PREFIX_BYTES + header_len
    header = msgpack.unpackb(data[PREFIX_BYTES:header_end], raw=False)
    assert isinstance(header, dict) and isinstance(header["type"], str)
    payload = data[header_end : header_end + payload_len]
    assert len(payload) == payload_len
    arrays, position = [], 0
    for entry in header["arrays"]:
        assert set(entry) == {"dtype", "shape", "codec", "nbytes"}
        assert entry["codec"] == "none" and entry["dtype"] in README_DTYPES
        itemsize = README_DTYPES[entry["dtype"]]
        count = 1
        for n in entry["shape"]:
            count *= n
        assert entry["nbytes"] == count * itemsize
        chunk = payload[position : position + entry["nbytes"]]
        arrays.append(np.frombuffer(chunk, dtype=entry["dtype"]).reshape(entry["shape"]))
        position += entry["nbytes"]
    assert position == payload_len  # back to back, no padding, nothing after
    return header, arrays, header_end + payload_len


# ---------------------------------------------------------------- the README's own text


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def table_cells(line: str) -> list[str]:
    """The cells of a Markdown table row, honouring ``\\|`` escapes."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in cells]


def readme_dtypes(text: str) -> dict[str, int]:
    """The allowed-dtype table: dtype string -> item size."""
    section = text.split("Allowed `dtype` strings", 1)[1].split("\n\n", 2)[1]
    rows = [table_cells(line) for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip("`"): int(cells[2]) for cells in rows}


README_DTYPES = readme_dtypes(readme_text())


def message_sections(text: str) -> dict[str, str]:
    """Message type -> the text of its ``### `type` — Class`` section."""
    parts = re.split(r"^### `(\w+)` — ", text, flags=re.MULTILINE)
    return {
        name: body.split("\n## ", 1)[0] for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def example_frames(text: str) -> list[tuple[str, bytes]]:
    """Every ``<!-- example: name -->`` hex block, comments after ``#`` stripped."""
    found = re.findall(r"<!-- example: (\w+) -->\n```text\n(.*?)```", text, flags=re.DOTALL)
    return [
        (name, bytes.fromhex(" ".join(line.split("#", 1)[0] for line in body.splitlines())))
        for name, body in found
    ]


def fenced_block(text: str, marker: str, language: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", text, flags=re.DOTALL)
    assert match is not None, f"README has no {marker} block"
    return match.group(1)


# ---------------------------------------------------------------- one sample of each type

NETWORK = NetworkSpec((2, 3, 2), ("sigmoid",))
ELEMENT_VALUES = [i / 4 - 2 for i in range(17)]  # 2:3:2 has 17 weights and biases
ELEMENT_RAW = struct.pack("<17f", *ELEMENT_VALUES)
ELEMENT: HandArray = ("<f4", [17], ELEMENT_RAW)
NONCE = bytes(range(32))


class Sample(typing.NamedTuple):
    type_name: str
    scalars: dict[str, Any]
    arrays: list[HandArray]
    message: Message


def samples() -> list[Sample]:
    job = JobSpec().to_dict()
    indices = struct.pack("<3q", 5, 9, 2)
    report = {"board": "spert-2", "busy_fraction": 0.75, "cycles": [1, 2]}
    element = np.frombuffer(ELEMENT_RAW, dtype="<f4")
    norms_raw = struct.pack("<4d", 1.5, -2.0, 0.5, 4.0)  # means, then standard deviations
    rows_raw = struct.pack("<4f", 0.25, -1.0, 3.0, 0.5)
    update: dict[str, Any] = {
        "base_version": 4,
        "lease_id": 7,
        "offset": 128,
        "patterns": 64,
        "loss_sum": 12.5,
        "correct": 40,
        "compute_seconds": 0.25,
    }
    return [
        Sample(
            "server_hello",
            {"protocol_version": 1, "server_name": "snet", "nonce": NONCE, "auth_required": True},
            [],
            ServerHello(1, "snet", NONCE, True),
        ),
        Sample(
            "hello",
            {
                "protocol_version": 1,
                "worker_name": "w1",
                "backend": "numpy",
                "capabilities": ["codec:none"],
                "proof": b"\x01" * 32,
            },
            [],
            Hello(1, "w1", "numpy", ("codec:none",), b"\x01" * 32),
        ),
        Sample("welcome", {"worker_id": 3, "job": job}, [], Welcome(3, job)),
        Sample(
            "weights",
            {"version": 5, "epoch": 1, "learning_rate": 0.1, "settled": 2},
            [ELEMENT],
            Weights(5, 1, 0.1, 2, element),
        ),
        Sample(
            "lease",
            {"lease_id": 7, "epoch": 0},
            [("<i8", [3], indices)],
            Lease(7, 0, np.array([5, 9, 2], dtype="<i8")),
        ),
        Sample("update", update, [ELEMENT], Update(**update, element=element)),
        Sample("evaluate", {"version": 9, "epoch": 2}, [ELEMENT], Evaluate(9, 2, element)),
        Sample(
            "eval_result",
            {"version": 9, "epoch": 2, "frames": 500, "correct": 450, "loss_sum": 80.25},
            [],
            EvalResult(9, 2, 500, 450, 80.25),
        ),
        Sample(
            "worker_report",
            {"sent_at": 1700000000.25, "report": report},
            [],
            WorkerReport(1700000000.25, report),
        ),
        Sample(
            "data_info",
            {"features": 2, "total_frames": 5},
            [("<f8", [2, 2], norms_raw), ("<i8", [2], struct.pack("<2q", 3, 2))],
            DataInfo(
                2,
                5,
                np.frombuffer(norms_raw, "<f8").reshape(2, 2),
                np.array([3, 2], dtype="<i8"),
            ),
        ),
        Sample(
            "frames_wanted",
            {"reason": "no such file"},
            [],
            FramesWanted("no such file"),
        ),
        Sample(
            "frames",
            {},
            [
                ("<i8", [2], struct.pack("<2q", 4, 0)),
                ("<f4", [2, 2], rows_raw),
                ("<i4", [2], struct.pack("<2i", 1, 0)),
            ],
            Frames(
                np.array([4, 0], dtype="<i8"),
                np.frombuffer(rows_raw, "<f4").reshape(2, 2),
                np.array([1, 0], dtype="<i4"),
            ),
        ),
        Sample("heartbeat", {"sent_at": 1700000000.5}, [], Heartbeat(1700000000.5)),
        Sample(
            "error",
            {"code": "update_rejected", "text": "update contains NaN", "fatal": False},
            [],
            ErrorMessage("update_rejected", "update contains NaN", False),
        ),
        Sample("goodbye", {"reason": "training complete"}, [], Goodbye("training complete")),
    ]


SAMPLES = samples()
SAMPLE_IDS = [sample.type_name for sample in SAMPLES]


def assert_is_sample(message: Message, sample: Sample) -> None:
    assert type(message) is type(sample.message)
    assert message == sample.message  # every scalar field (arrays are not compared by ==)
    for name, (dtype, shape, raw) in zip(type(message).ARRAYS, sample.arrays, strict=True):
        array = getattr(message, name)
        assert array.dtype == np.dtype(dtype) and list(array.shape) == shape
        assert array.tobytes() == raw


def decode_one(data: bytes, limits: FrameLimits | None = None) -> Message:
    messages = FrameDecoder(limits).feed(data)
    assert len(messages) == 1
    return messages[0]


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


# Three items of each README dtype, in struct's explicit little-endian formats.
STRUCT_FORMATS = {
    "<f4": "<3f",
    "<f2": "<3e",
    "<f8": "<3d",
    "<i4": "<3i",
    "<i8": "<3q",
    "|u1": "<3B",
    "|i1": "<3b",
}


@pytest.mark.parametrize("dtype", sorted(README_DTYPES))
def test_every_readme_dtype_decodes_little_endian(dtype: str) -> None:
    # The arrays' bytes come from struct's explicit little-endian codes, not from numpy.
    values = [1, -2, 3] if dtype != "|u1" else [1, 2, 255]
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


# ---------------------------------------------------------------- the README's contents


def test_readme_hex_examples_are_what_the_encoder_produces() -> None:
    expected: dict[str, Message] = {
        "goodbye": Goodbye("training complete"),
        "heartbeat": Heartbeat(1700000000.5),
        "lease": Lease(7, 0, np.array([5, 9, 2], dtype="<i8")),
    }
    found = example_frames(readme_text())
    assert {name for name, _ in found} == set(expected)
    for name, frame in found:
        assert frame == encode_bytes(expected[name]), f"README example {name!r} is stale"
        parse_frame(frame)


def test_readme_token_proof_vector() -> None:
    lines = fenced_block(readme_text(), "example-proof", "text").splitlines()
    vector = dict(line.split(": ", 1) for line in lines if line)
    token, nonce = vector["token"], bytes.fromhex(vector["nonce"])
    by_hand = hmac.new(token.encode("utf-8"), b"snet-hello\x00" + nonce, hashlib.sha256)
    assert by_hand.hexdigest() == vector["proof"]
    assert auth.proof(token, nonce).hex() == vector["proof"]
    assert auth.NONCE_BYTES == len(nonce) == 32


def test_readme_job_example_is_a_job() -> None:
    example = json.loads(fenced_block(readme_text(), "example-job", "json"))
    current = JobSpec().to_dict()
    assert set(example) == set(current)
    for key, value in current.items():
        if isinstance(value, dict):
            assert set(example[key]) == set(value), f"job[{key!r}] keys differ"
    JobSpec.from_dict(example)
    welcome = decode_one(hand_frame("welcome", {"worker_id": 1, "job": example}))
    assert isinstance(welcome, Welcome) and welcome.job == example


MSGPACK_TYPE_NAMES = {
    int: "int",
    float: "float",
    str: "str",
    bytes: "bin",
    bool: "bool",
    tuple[str, ...]: "array of str",
    dict[str, Any]: "map",
}
ARRAY_DTYPES = {
    "element": ELEMENT_DTYPE.str,
    "indices": "<i8",
    "norms": "<f8",
    "lengths": "<i8",
    "features": "<f4",
    "labels": "<i4",
}


def test_readme_tables_match_every_message() -> None:
    sections = message_sections(readme_text())
    assert list(sections) == list(MESSAGE_TYPES)
    for type_name, cls in MESSAGE_TYPES.items():
        rows = [
            table_cells(line) for line in sections[type_name].splitlines() if line.startswith("| `")
        ]
        documented = {cells[0].strip("`"): cells[1] for cells in rows}
        hints = typing.get_type_hints(cls)
        scalars = [f.name for f in fields(cls) if f.name not in cls.ARRAYS and f.name != "slot"]
        assert list(documented) == [*scalars, *cls.ARRAYS], type_name
        for name in scalars:
            assert documented[name] == MSGPACK_TYPE_NAMES[hints[name]], f"{type_name}.{name}"
        for name in cls.ARRAYS:
            assert documented[name] == f"`{ARRAY_DTYPES[name]}`", f"{type_name}.{name}"
        assert f"— {cls.__name__} (" in readme_text()


def test_readme_dtype_table_is_the_decoders() -> None:
    assert set(README_DTYPES) == ALLOWED_DTYPES
    for dtype, itemsize in README_DTYPES.items():
        assert np.dtype(dtype).itemsize == itemsize
        assert np.dtype(dtype).byteorder in "<|="


def test_readme_lists_every_error_code() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type)]
    codes = {vars(c)["code"] for c in classes if isinstance(vars(c).get("code"), str)}
    assert {"malformed_frame", "frame_too_large", "update_rejected"} <= codes
    table = re.findall(r"^\| `(\w+)` \| (?:server|both|—) \|", readme_text(), flags=re.MULTILINE)
    assert codes <= set(table)


def test_element_layout_is_weights_then_biases_per_layer() -> None:
    layout = ElementLayout.for_network(NETWORK)
    assert layout.offsets == (0, 6, 9, 15) and layout.size == 17 and layout.nbytes == 68
    assert NETWORK.connections == 17
    w0 = np.arange(6, dtype="<f4").reshape(2, 3)
    b0 = np.array([10, 11, 12], dtype="<f4")
    w1 = np.arange(20, 26, dtype="<f4").reshape(3, 2)
    b1 = np.array([30, 31], dtype="<f4")
    flat = np.concatenate([w0.ravel(), b0, w1.ravel(), b1])
    views = layout.views(flat)
    for view, part in zip(views, (w0, b0, w1, b1), strict=True):
        assert np.array_equal(view, part)
    # W_l[i, j] sits at offset(W_l) + i * fan_out + j
    assert flat[9 + 2 * 2 + 1] == w1[2, 1]
