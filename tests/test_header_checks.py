"""The header's strict checks that protocol/README.md states: array descriptors with
exactly the spec's keys (section 3), and how deep a header may nest (section 5)."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import MalformedFrame
from snet.protocol.framing import (
    DESCRIPTOR_KEYS,
    HEADER_DEPTH,
    PREFIX,
    PREFIX_SIZE,
    encode,
    parse_header,
)
from snet.protocol.messages import Weights

from protocol_samples import array_entry, assert_refuses_further_use, raw_frame, weights_header


@pytest.mark.parametrize(
    "entry",
    [
        array_entry(x=1),  # the audit's: the four keys and one more
        {"dtype": "<f4", "shape": [3], "nbytes": 12, "x": 1},  # codec left out (allowed)
        array_entry(codec="topk:0.5", note="part"),  # on an encoded element too
    ],
    ids=["four-and-one", "no-codec", "encoded"],
)
def test_an_array_descriptor_with_an_unknown_key_is_malformed(entry: dict[str, Any]) -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrame, match="unknown key"):
        decoder.feed(raw_frame(weights_header(arrays=[entry]), b"\0" * 12))
    assert_refuses_further_use(decoder)


def test_the_encoder_sends_exactly_the_descriptor_keys() -> None:
    frame = b"".join(bytes(piece) for piece in encode(Weights(1, 0, 0.5, 0, np.zeros(3, "<f4"))))
    header_length = PREFIX.unpack_from(frame)[3]
    _, header = parse_header(frame[PREFIX_SIZE : PREFIX_SIZE + header_length])
    assert [set(entry) for entry in header["arrays"]] == [set(DESCRIPTOR_KEYS)]


def _nested(depth: int) -> bytes:
    """A worker_report header ``depth`` maps deep, the header itself the first."""
    packed = msgpack.packb({})
    for _ in range(depth - 2):
        packed = b"\x81\xa1a" + packed  # {"a": <the rest>}
    head = msgpack.packb({"type": "worker_report"})[1:]  # the map's one entry
    return b"\x82" + head + msgpack.packb("report") + packed


def test_a_header_nested_beyond_the_stated_depth_is_malformed() -> None:
    assert parse_header(_nested(HEADER_DEPTH))[0] == "worker_report"
    with pytest.raises(MalformedFrame, match=f"nested deeper than {HEADER_DEPTH} levels"):
        parse_header(_nested(HEADER_DEPTH + 1))
    assert HEADER_DEPTH == 1024  # the number protocol/README.md gives
