"""One message of every type, and small builders of raw frames, for the protocol tests."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import (
    MalformedFrame,
)
from snet.protocol.framing import (
    MAGIC,
    PREFIX,
    encode_bytes,
)
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
        Resync("delta from version 3, this worker holds 2"),
        PolicyChange(41, "bounded:2"),
        WorkerReport(1700000001.5, {"busy_seconds": 1.25, "ratio": 4, "board": "spert-ii"}),
        DataInfo(
            13,
            60,
            norms=rng.standard_normal((2, 13)).astype("<f8"),
            lengths=np.array([20, 40], dtype="<i8"),
        ),
        FramesWanted("cannot read /data/train.pfile"),
        SliceState(2, 5, 7, rng.standard_normal(9).astype("<f4"), np.zeros(9, dtype="<f4")),
        NpBunch(
            8,
            7,
            0.25,
            3,
            False,
            np.arange(3, dtype="<i8"),
            rng.standard_normal((3, 2)).astype("<f4"),
        ),
        PartialOutputs(8, 0.001, rng.standard_normal((3, 10)).astype("<f4")),
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
