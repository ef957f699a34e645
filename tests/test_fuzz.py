"""A seeded fuzz harness (issue 12): the frame decoder and the codecs, fed what a hostile
or broken peer might send. Each either yields what was meant, or refuses with snet's own
error (``ProtocolError`` for frames, ``CodecError`` for encoded elements): never another
exception, never an allocation beyond the stated limits, never a non-finite element.

The generator is seeded, so a failure is reproducible: the seed and the case number are
in the assertion message. ``SNET_FUZZ_CASES`` raises the number of cases for a longer run.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest

from snet.protocol.codecs import parse_codec
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import CodecError, ProtocolError
from snet.protocol.framing import FrameLimits, encode_bytes
from snet.protocol.messages import Encoded, Message
from snet.protocol.network import ElementLayout, NetworkSpec

from protocol_samples import sample_messages

CASES = int(os.environ.get("SNET_FUZZ_CASES", "400"))
LIMITS = FrameLimits(max_payload_bytes=1 << 20)
LAYOUT = ElementLayout.for_network(NetworkSpec.parse("6:5:3"))
CODECS = ("none", "fp16", "int8", "sign", "topk:0.2", "powersgd:2")


def _mutations(rng: np.random.Generator) -> list[Callable[[bytes], bytes]]:
    def flip(frame: bytes) -> bytes:
        data = bytearray(frame)
        for _ in range(int(rng.integers(1, 6))):
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        return bytes(data)

    def truncate(frame: bytes) -> bytes:
        return frame[: int(rng.integers(len(frame)))]

    def splice(frame: bytes) -> bytes:
        cut = int(rng.integers(len(frame)))
        return frame[:cut] + rng.bytes(int(rng.integers(1, 64))) + frame[cut:]

    def garbage(frame: bytes) -> bytes:
        return rng.bytes(int(rng.integers(1, 300)))

    def header_length(frame: bytes) -> bytes:  # lie about H or P
        data = bytearray(frame)
        at = int(rng.choice([4, 8, 12, 15]))
        data[at] = int(rng.integers(256))
        return bytes(data)

    return [flip, truncate, splice, garbage, header_length]


def _feed(decoder: FrameDecoder, data: bytes, rng: np.random.Generator) -> list[Message]:
    """Feed in random pieces (one byte at a time, now and then), as TCP may deliver it."""
    messages: list[Message] = []
    position = 0
    while position < len(data):
        size = 1 if rng.random() < 0.2 else int(rng.integers(1, 97))
        messages += decoder.feed(data[position : position + size])
        position += size
    return messages


@pytest.mark.parametrize("seed", [1, 2])
def test_the_decoder_refuses_mutated_frames_with_its_own_errors(seed: int) -> None:
    rng = np.random.default_rng(seed)
    frames = [encode_bytes(message) for message in sample_messages()]
    mutations = _mutations(rng)
    refused = decoded = 0
    for case in range(CASES):
        frame = frames[int(rng.integers(len(frames)))]
        mutated = mutations[int(rng.integers(len(mutations)))](frame)
        decoder = FrameDecoder(LIMITS)
        try:
            _feed(decoder, mutated, rng)
            decoded += 1
        except ProtocolError:
            refused += 1
        except Exception as exc:  # pragma: no cover - the failure this test looks for
            raise AssertionError(f"seed {seed} case {case}: {exc!r} for {mutated.hex()}") from exc
    assert refused > CASES // 4 and decoded > 0  # the mutations did reach both outcomes


def test_intact_frames_decode_one_byte_at_a_time() -> None:
    rng = np.random.default_rng(7)
    messages = sample_messages()
    decoder = FrameDecoder(LIMITS)
    stream = b"".join(encode_bytes(message) for message in messages)
    got = _feed(decoder, stream, rng)
    assert [m.TYPE for m in got] == [m.TYPE for m in messages]


def _mutate_parts(encoded: Encoded, rng: np.random.Generator) -> Encoded:
    parts = [np.array(part) for part in encoded.parts]
    index = int(rng.integers(len(parts)))
    part = parts[index]
    choice = int(rng.integers(5))
    if choice == 0 and part.size:  # a value changed bit by bit
        raw = np.ascontiguousarray(part).reshape(-1).view(np.uint8).copy()
        raw[int(rng.integers(raw.size))] ^= 1 << int(rng.integers(8))
        parts[index] = raw.view(part.dtype).reshape(part.shape)
    elif choice == 1:  # a part of another length
        parts[index] = np.resize(part, max(part.size + int(rng.integers(-3, 4)), 0))
    elif choice == 2:  # another dtype
        parts[index] = part.astype(rng.choice(["<f4", "<f2", "<i1", "<u1", "<i8"]))
    elif choice == 3 and part.size:  # a poisoned value
        flat = part.astype("<f8").ravel()
        flat[int(rng.integers(flat.size))] = rng.choice([np.nan, np.inf, 1e300, -1])
        with np.errstate(all="ignore"):
            parts[index] = flat.astype(part.dtype).reshape(part.shape)
    else:  # a part missing, or one too many
        if len(parts) > 1 and rng.random() < 0.5:
            parts.pop(index)
        else:
            parts.append(part)
    return Encoded(encoded.codec, tuple(parts))


@pytest.mark.parametrize("codec_name", CODECS)
def test_codecs_decode_or_refuse_never_anything_else(codec_name: str) -> None:
    rng = np.random.default_rng(list(codec_name.encode()))
    codec = parse_codec(codec_name)
    out = np.empty(LAYOUT.size, np.float32)
    refused = 0
    for case in range(CASES // 4):
        flat = rng.standard_normal(LAYOUT.size).astype(np.float32)
        encoded = _mutate_parts(codec.encode(LAYOUT, flat), rng)
        out[...] = 0.0
        try:
            codec.decode(LAYOUT, encoded, out)
        except CodecError:
            refused += 1
            continue
        except Exception as exc:  # pragma: no cover - the failure this test looks for
            raise AssertionError(f"{codec_name} case {case}: {exc!r}") from exc
        # what decodes is finite: a poisoned scale or index must never reach the weights
        assert np.isfinite(out).all(), f"{codec_name} case {case} decoded non-finite values"
    assert refused > 0
