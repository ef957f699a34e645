"""Codecs that keep every value but spend fewer bits on it: none, fp16, int8, sign.

Stated error bounds (per value x, decoded as d; tests check each):

- ``none``: float32, exact (d == x).
- ``fp16``: IEEE half precision, |x - d| <= 2**-11 |x| for 2**-14 <= |x| <= 65504, and
  <= 2**-25 below; values beyond +-65504 are clipped there (error feedback keeps the rest).
- ``int8``: blocks of 256 values share a float32 scale s = max|x| / 127 and each value is
  round(x / s) in [-127, 127], so |x - d| <= s / 2 (about 4x fewer bytes).
- ``sign``: one bit per value (its sign, 0 counting as positive) and a float32 scale per
  block of 512 values, the block's mean |x|, as in 1-bit SGD; d = +-s. The block's squared
  error is exactly sum(x**2) - n * s**2 <= sum(x**2) (about 28x fewer bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import CodecError
from .base import FLOAT32_MAX, ElementCodec, PartSpec, blocks_of, require_finite

FP16_MAX = 65504.0
INT8_BLOCK = 256
SIGN_BLOCK = 512


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape))


# Byte value -> its 8 bits as -1.0 / +1.0, least significant bit first (sign decoding).
_SIGNS = (
    2.0 * np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") - 1.0
).astype(np.float32)


def _per_value(scales: np.ndarray, block: int, size: int) -> np.ndarray:
    """Each block's scale repeated for its values (the last block may be short)."""
    return np.repeat(scales, block)[:size]


def _scale_blocks(flat: np.ndarray, scales: np.ndarray, block: int) -> None:
    """Multiply each block of ``flat`` by its scale, in place (no per-value copy)."""
    full = flat.size // block
    if full:
        flat[: full * block].reshape(full, block)[...] *= scales[:full, None]
    if flat.size % block:
        flat[full * block :] *= scales[full]


class NoneCodec(ElementCodec):
    """float32, as the element is: the reference and the exact case."""

    family = "none"
    lossy = False
    dtype = "<f4"

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        return (PartSpec(self.dtype, (_size(shape),)),)

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        return (segment.reshape(-1).copy(),)

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        require_finite(self.name, "values", parts[0])

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        out.reshape(-1)[...] = parts[0]


class Fp16Codec(NoneCodec):
    """IEEE half precision (2x fewer bytes), clipped to its range."""

    family = "fp16"
    lossy = True
    dtype = "<f2"

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        clipped = np.clip(segment.reshape(-1), -FP16_MAX, FP16_MAX)
        return (clipped.astype("<f2"),)


class _BlockScaledCodec(ElementCodec):
    """Codecs whose parts are a float32 scale per block of ``block`` values, then the
    values in units of their block's scale."""

    block = 1
    largest_unit = 1.0  # the largest |value| in units of its scale (int8: 127)

    def units(self, values: np.ndarray, size: int) -> np.ndarray:
        """The segment's ``size`` values in units of their scale, from the second part."""
        raise NotImplementedError

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        scales = parts[0]
        require_finite(self.name, "scales", scales)
        if scales.size and scales.min() < 0:
            raise CodecError(f"{self.name}: negative scale {float(scales.min())}")
        # a finite scale whose product overflows would still put Inf into the element
        if scales.size and float(scales.max()) * self.largest_unit > FLOAT32_MAX:
            raise CodecError(f"{self.name}: scale {float(scales.max()):.3g} overflows float32")

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        flat = out.reshape(-1)
        np.copyto(flat, self.units(parts[1], flat.size))
        _scale_blocks(flat, parts[0], self.block)


class Int8Codec(_BlockScaledCodec):
    """Blockwise int8: a float32 scale per block of ``INT8_BLOCK`` values."""

    family = "int8"
    block = INT8_BLOCK
    largest_unit = 127.0

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        size = _size(shape)
        return (PartSpec("<f4", (blocks_of(size, INT8_BLOCK),)), PartSpec("|i1", (size,)))

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        values = segment.reshape(-1)
        starts = np.arange(0, values.size, INT8_BLOCK)
        peaks = np.maximum.reduceat(np.abs(values), starts)
        scales = (peaks / np.float32(127.0)).astype("<f4")
        divisor = _per_value(np.where(scales > 0, scales, np.float32(1.0)), INT8_BLOCK, values.size)
        quantized = np.clip(np.rint(values / divisor), -127, 127).astype("|i1")
        return scales, quantized

    def units(self, values: np.ndarray, size: int) -> np.ndarray:
        return values


class SignCodec(_BlockScaledCodec):
    """One bit per value and the block's mean magnitude (1-bit SGD's scaled sign)."""

    family = "sign"
    block = SIGN_BLOCK

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        size = _size(shape)
        return (
            PartSpec("<f4", (blocks_of(size, SIGN_BLOCK),)),
            PartSpec("|u1", (blocks_of(size, 8),)),
        )

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        values = segment.reshape(-1)
        starts = np.arange(0, values.size, SIGN_BLOCK)
        counts = np.diff(np.append(starts, values.size))
        sums = np.add.reduceat(np.abs(values), starts, dtype=np.float64)
        scales = (sums / counts).astype("<f4")
        bits = np.packbits(values >= 0, bitorder="little")
        return scales, bits

    def units(self, values: np.ndarray, size: int) -> np.ndarray:
        signs: np.ndarray = _SIGNS[values].reshape(-1)  # byte j, bit i: value 8 j + i, as +-1
        return signs[:size]
