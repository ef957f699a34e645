"""Fixed-point words and primitives of the emulated Spert-II board (T0 vector unit).

The T0 multiplies 16-bit by 16-bit into 32-bit products and adds them into 32-bit
accumulators that *saturate* at the range limits instead of wrapping round. Every
quantity on the board is a signed integer word with an implied binary point: a value
``v`` with ``f`` fraction bits is stored as ``round(v * 2**f)``. The fraction bits are
chosen per matrix (one exponent per weight matrix, bias vector or activation block), as
Quicknet did; a 16-bit word with ``f`` fraction bits has ``15 - f`` integer bits and a
sign bit.

Formats (I = integer bits, F = fraction bits, excluding the sign bit):

=====================  ========  ==============================================================
quantity               word      I.F
=====================  ========  ==============================================================
input features x       int16     (15-fx).fx, fx from the largest training frame: 3.12 for
                                 the normalised default data
weight W (32-bit)      int32     (15-fw).(fw+16): the 16+16-bit variant, updated in all 32 bits
weight high half       int16     (15-fw).fw = W32 >> 16, used for forward and backward passes;
                                 fw per matrix: the most that keeps one spare bit above the
                                 largest weight at load time, at most 14 (range +-2)
bias b                 as W      its own exponent (a bias vector is a matrix of its own)
accumulator            int32     F = sum of the operands' F minus the pre-shift (below)
sigmoid / tanh output  int16     0.15 (from a lookup table)
relu output            int16     per block: the most F that holds the bunch's largest value
table index            -         net input rounded to 8 fraction bits, clamped to the table
softmax output p       int16     0.15 (exp from a lookup table, one divide per pattern)
output delta p - t     int16     0.15 (covers -1 exactly)
unit derivative f'(z)  int16     0.15
hidden delta           int16     per block (one exponent per bunch), like relu outputs
=====================  ========  ==============================================================

A dot product of K terms is accumulated with a *pre-shift* ``s``: each 32-bit product is
scaled by 2**-s so that K of the largest products cannot leave the 32-bit range (the
T0's multiply-shift-round instructions do this). The emulator computes the exact sum
(in float64, exact for integers below 2**53) and rounds and saturates the scaled sum
once; the board rounds each product before adding, so the two can differ by at most
K/2 units in the accumulator's last place, far below the 16-bit words it feeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ACTIVATION_FRACTION = 15  # Q0.15: sigmoid, tanh, softmax outputs, deltas at the output
TABLE_INPUT_FRACTION = 8  # lookup tables are indexed with 8 fraction bits of the net input
MAX_WEIGHT_FRACTION = 14  # a high half never covers less than +-2
_WORD_DTYPES = {16: np.int16, 32: np.int32}


@dataclass
class Saturations:
    """How many values were clipped to a word's range (the board saturates, never wraps)."""

    count: int = 0


def word_range(bits: int) -> tuple[int, int]:
    """Smallest and largest value of a signed ``bits``-bit word."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def fraction_bits_for(max_abs: float, bits: int = 16, headroom: int = 0, limit: int = 30) -> int:
    """The most fraction bits (at most ``limit``) with which ``max_abs * 2**headroom``
    still fits a signed ``bits``-bit word: the per-matrix exponent of a block of values."""
    if not math.isfinite(max_abs) or max_abs <= 0.0:
        return limit
    top = word_range(bits)[1]
    fraction = math.floor(math.log2(top / max_abs)) - headroom
    while max_abs * 2.0 ** (fraction + headroom) > top:  # guard log2 rounding
        fraction -= 1
    return min(fraction, limit)


def saturate(values: np.ndarray, bits: int, sat: Saturations | None = None) -> np.ndarray:
    """Integer (or integral float) ``values`` clipped to a ``bits``-bit word, as that word."""
    low, high = word_range(bits)
    if sat is not None:
        sat.count += int(np.count_nonzero((values < low) | (values > high)))
    words: np.ndarray = np.clip(values, low, high).astype(_WORD_DTYPES[bits])
    return words


def quantise(
    values: np.ndarray, fraction: int, bits: int = 16, sat: Saturations | None = None
) -> np.ndarray:
    """Real ``values`` as ``bits``-bit words with ``fraction`` fraction bits (rounded)."""
    scaled = np.rint(np.asarray(values, dtype=np.float64) * 2.0**fraction)
    return saturate(scaled, bits, sat)


def dequantise(words: np.ndarray, fraction: int) -> np.ndarray:
    """The real values (float64) that ``words`` with ``fraction`` fraction bits stand for."""
    return np.asarray(words, dtype=np.float64) * 2.0**-fraction


def rescale(
    values: np.ndarray, shift: int, bits: int, sat: Saturations | None = None
) -> np.ndarray:
    """Arithmetic shift right by ``shift`` (left if negative), rounding half up, then
    saturate to ``bits``: how the board moves a value to fewer (or more) fraction bits."""
    wide = np.asarray(values).astype(np.int64)
    if shift > 0:
        wide = (wide + (1 << (shift - 1))) >> shift
    elif shift < 0:
        left = -shift
        # clip first so that the int64 shift cannot overflow; the result saturates anyway
        bound = 1 << max(62 - left, 0)
        wide = np.clip(wide, -bound, bound) << min(left, 62)
    return saturate(wide, bits, sat)


def saturating_add(
    a: np.ndarray, b: np.ndarray, bits: int = 32, sat: Saturations | None = None
) -> np.ndarray:
    """``a + b`` in a ``bits``-bit accumulator that saturates."""
    return saturate(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64), bits, sat)


def headroom_shift(a: np.ndarray, b: np.ndarray, terms: int) -> int:
    """The pre-shift that keeps a sum of ``terms`` products of ``a`` and ``b`` entries
    inside 32 bits, from the largest magnitudes actually present."""
    largest = int(np.abs(a.astype(np.int64)).max(initial=0)) * int(
        np.abs(b.astype(np.int64)).max(initial=0)
    )
    bound = terms * largest
    return max(0, bound.bit_length() - 31)


def matmul_accumulate(
    a: np.ndarray,
    b: np.ndarray,
    pre_shift: int | None = None,
    sat: Saturations | None = None,
) -> tuple[np.ndarray, int]:
    """``a @ b`` of 16-bit words in 32-bit saturating accumulators.

    Returns the int32 result and the pre-shift used (the result has the operands'
    fraction bits added, minus the pre-shift). Without ``pre_shift`` the smallest one
    that cannot overflow is chosen (see ``headroom_shift``).
    """
    terms = a.shape[-1]
    if pre_shift is None:
        pre_shift = headroom_shift(a, b, terms)
    if terms >= 1 << 22:
        raise ValueError(f"a dot product of {terms} terms is too long to emulate exactly")
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))  # exact integers
    return rescale(exact.astype(np.int64), pre_shift, 32, sat), pre_shift


def block_to_16(
    values: np.ndarray, fraction: int, sat: Saturations | None = None
) -> tuple[np.ndarray, int]:
    """32-bit values with ``fraction`` fraction bits as 16-bit words sharing one exponent
    (the most fraction bits that hold the block's largest value): (words, fraction)."""
    largest = float(np.abs(values.astype(np.int64)).max(initial=0)) * 2.0**-fraction
    target = fraction_bits_for(largest, 16, limit=fraction + 15)
    return rescale(values, fraction - target, 16, sat), target


class LookupTable:
    """A function tabulated on [low, high] at steps of 2**-8, entries in Q0.15, as the
    board computes sigmoid, tanh and the softmax's exponential."""

    def __init__(self, function: Callable[[np.ndarray], np.ndarray], low: int, high: int):
        self.low, self.high = low, high
        steps = (high - low) << TABLE_INPUT_FRACTION
        points = low + np.arange(steps + 1, dtype=np.float64) * 2.0**-TABLE_INPUT_FRACTION
        self.entries = quantise(function(points), ACTIVATION_FRACTION)
        self.entries_float = self.entries.astype(np.float64)

    @property
    def nbytes(self) -> int:
        return int(self.entries.nbytes)

    def lookup(self, values: np.ndarray, fraction: int) -> np.ndarray:
        """Table entries (int16, Q0.15) for ``values`` with ``fraction`` fraction bits; the
        index is the value rounded to 8 fraction bits and clamped to the table."""
        index = rescale(values, fraction - TABLE_INPUT_FRACTION, 32).astype(np.int64)
        index -= self.low << TABLE_INPUT_FRACTION
        np.clip(index, 0, len(self.entries) - 1, out=index)
        return self.entries[index]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    result: np.ndarray = 1.0 / (1.0 + np.exp(-x))
    return result


SIGMOID_TABLE = LookupTable(_sigmoid, -16, 16)
TANH_TABLE = LookupTable(np.tanh, -8, 8)
EXP_TABLE = LookupTable(np.exp, -16, 0)  # the softmax's e^(z - max z), arguments <= 0
