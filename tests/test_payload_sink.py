"""The decoder's payload sink: payloads land in the sink's buffers, abandoned frames give
their token back (the server's element pool and the worker's weights box use it)."""

from __future__ import annotations

import numpy as np
import pytest

from snet.protocol.decoder import Decoded, FrameDecoder
from snet.protocol.errors import MalformedFrame
from snet.protocol.framing import ArrayInfo, encode_bytes
from snet.protocol.messages import Goodbye, Weights

from protocol_samples import raw_frame, weights_header


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
    decoded: list[Decoded] = []
    for i in range(len(frame)):  # byte by byte, so the payload is written piecewise
        decoded.extend(decoder.feed_decoded(frame[i : i + 1]))
    assert len(decoded) == 1
    message = decoded[0].message
    assert isinstance(message, Weights)
    assert decoded[0].slot == "token-1"
    assert np.shares_memory(message.element, sink.buffers[0])
    np.testing.assert_array_equal(sink.buffers[0], np.arange(6))
    assert sink.calls[0][0] == "weights"
    assert sink.calls[0][1] == (ArrayInfo("<f4", (6,), "none", 24),)
    assert sink.calls[0][2] == 24
    # the sink is asked for every frame with a payload; a refusal means a private buffer
    other = Weights(5, 1, 0.2, 3, element=np.arange(4, dtype="<f4"))
    got_decoded = decoder.feed_decoded(encode_bytes(other))[0]
    got = got_decoded.message
    assert isinstance(got, Weights)
    assert got_decoded.slot is None
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
