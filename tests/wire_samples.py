"""The wire format as protocol/README.md describes it, rebuilt by hand for the tests.

Frames are built from the README (``struct`` for the prefix, ``msgpack`` for the header,
raw little-endian bytes for the arrays; never snet's encoder); a small parser written from
the README alone reads the encoder's frames; helpers read the README's own tables and
examples; and one sample of every message type, as hand-built frame and as message.
"""

from __future__ import annotations

import re
import struct
import typing
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import FrameLimits
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
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
    NpBunch,
    PartialOutputs,
    PolicyChange,
    Resync,
    ServerHello,
    SliceState,
    Update,
    Weights,
    Welcome,
    WorkerReport,
)
from snet.protocol.network import NetworkSpec

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
        assert entry["dtype"] in README_DTYPES
        assert entry["codec"] == "none" or header["type"] in ("update", "weights")
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
    codecs = {"update": "sign", "weights": "delta:int8"}
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
        Sample(
            "welcome",
            {"worker_id": 3, "job": job, "codecs": codecs},
            [],
            Welcome(3, job, codecs),
        ),
        Sample(
            "weights",
            {
                "version": 5,
                "epoch": 1,
                "learning_rate": 0.1,
                "settled": 2,
                "delta_from": -1,
                "digest": "",
            },
            [ELEMENT],
            Weights(5, 1, 0.1, 2, element),
        ),
        Sample(
            "lease",
            {"lease_id": 7, "epoch": 0, "learning_rate": 0.0},
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
        Sample("resync", {"reason": "no base"}, [], Resync("no base")),
        Sample(
            "data_info",
            {"features": 2, "total_frames": 5, "cv_utterances": 1, "labels": "8bd69e52"},
            [("<f8", [2, 2], norms_raw), ("<i8", [2], struct.pack("<2q", 3, 2))],
            DataInfo(
                2,
                5,
                np.frombuffer(norms_raw, "<f8").reshape(2, 2),
                np.array([3, 2], dtype="<i8"),
                cv_utterances=1,
                labels="8bd69e52",
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
            {
                "code": "update_rejected",
                "text": "update contains NaN",
                "fatal": False,
                "lease_id": 3,
                "offset": 256,
            },
            [],
            ErrorMessage("update_rejected", "update contains NaN", False, 3, 256),
        ),
        Sample("goodbye", {"reason": "training complete"}, [], Goodbye("training complete")),
        Sample(
            "np_slice",
            {"start": 0, "stop": 1, "bunch": 4},
            [("<f4", [2], struct.pack("<2f", 0.5, -1.0)), ("<f4", [2], struct.pack("<2f", 0, 0))],
            SliceState(0, 1, 4, np.array([0.5, -1.0], dtype="<f4"), np.zeros(2, dtype="<f4")),
        ),
        Sample(
            "np_bunch",
            {"bunch": 5, "error_of": 4, "learning_rate": 0.5, "patterns": 1, "collect": True},
            [("<i8", [1], struct.pack("<q", 9)), ("<f4", [1, 2], struct.pack("<2f", 0.25, -0.25))],
            NpBunch(
                5,
                4,
                0.5,
                1,
                True,
                np.array([9], dtype="<i8"),
                np.array([[0.25, -0.25]], dtype="<f4"),
            ),
        ),
        Sample(
            "np_partial",
            {"bunch": 5, "compute_seconds": 0.125},
            [("<f4", [1, 2], struct.pack("<2f", 1.5, 2.0))],
            PartialOutputs(5, 0.125, np.array([[1.5, 2.0]], dtype="<f4")),
        ),
        Sample("policy", {"version": 12, "staleness": "gap"}, [], PolicyChange(12, "gap")),
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
