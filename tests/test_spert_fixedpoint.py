"""The emulated board's fixed-point words and primitives against float references."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from snet.client.data import load_corpus
from snet.client.network import BunchNetwork
from snet.client.spert.backend import weight_matrix
from snet.client.spert.fixedpoint import (
    EXP_TABLE,
    SIGMOID_TABLE,
    TANH_TABLE,
    LookupTable,
    Saturations,
    block_to_16,
    dequantise,
    fraction_bits_for,
    matmul_accumulate,
    quantise,
    rescale,
    saturating_add,
)
from snet.client.spert.kernels import Block, FixedPointNetwork
from snet.protocol.job import DataSpec
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def test_fraction_bits_are_the_most_that_fit() -> None:
    for largest in (0.01, 0.9, 1.0, 3.7, 5.47, 100.0, 3000.0):
        f = fraction_bits_for(largest)
        assert largest * 2**f <= 32767 < largest * 2 ** (f + 1)
        assert fraction_bits_for(largest, headroom=1) == f - 1
        g = fraction_bits_for(largest, bits=32, limit=60)
        assert largest * 2**g <= INT32_MAX < largest * 2 ** (g + 1)
    assert fraction_bits_for(0.0, limit=14) == 14  # an all-zero matrix gets the limit


def test_quantise_rounds_to_half_an_lsb_and_saturates() -> None:
    rng = np.random.default_rng(1)
    values = rng.uniform(-7.9, 7.9, 10_000)
    words = quantise(values, 12)
    assert words.dtype == np.int16
    assert np.abs(dequantise(words, 12) - values).max() <= 2.0**-13
    sat = Saturations()
    clipped = quantise(np.array([9.0, -9.0, 1.0]), 12, sat=sat)  # range is [-8, 8)
    assert list(clipped) == [32767, -32768, 4096]
    assert sat.count == 2


def test_accumulators_saturate_instead_of_wrapping() -> None:
    sat = Saturations()
    a = np.array([INT32_MAX, INT32_MIN, 5, INT32_MAX - 1], dtype=np.int32)
    b = np.array([1, -1, -7, 1], dtype=np.int32)
    result = saturating_add(a, b, 32, sat)
    assert result.dtype == np.int32
    assert list(result) == [INT32_MAX, INT32_MIN, -2, INT32_MAX]
    assert sat.count == 2
    # a dot product whose exact sum leaves the 32-bit range is clipped to it
    big = np.full((1, 4), 32767, dtype=np.int16)
    col = np.full((4, 1), 32767, dtype=np.int16)
    clipped, shift = matmul_accumulate(big, col, pre_shift=0, sat=sat)
    assert shift == 0 and clipped[0, 0] == INT32_MAX  # exact: 4 * 32767**2 > 2**31
    assert matmul_accumulate(-big, col, pre_shift=0)[0][0, 0] == INT32_MIN
    # with the automatic pre-shift the same sum fits: scaled by 2**-s, rounded
    fitted, shift = matmul_accumulate(big, col)
    assert shift == 1 and fitted[0, 0] == round(4 * 32767**2 / 2)


def test_matmul_matches_exact_integers_and_the_float_product() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(-32768, 32768, (16, 117)).astype(np.int16)
    b = rng.integers(-32768, 32768, (117, 40)).astype(np.int16)
    exact = a.astype(object) @ b.astype(object)  # Python integers: no rounding at all
    result, shift = matmul_accumulate(a, b)
    assert 0 < shift <= 8
    error = np.abs(result.astype(object) * 2**shift - exact).max()
    assert error <= 2 ** (shift - 1)  # one rounding of the scaled sum
    # real matrices through the formats: the error is what the words' resolution implies
    x = rng.normal(0, 1.5, (32, 117))
    w = rng.uniform(-0.2, 0.2, (117, 64))
    fx, fw = fraction_bits_for(np.abs(x).max()), fraction_bits_for(np.abs(w).max())
    qx, qw = quantise(x, fx), quantise(w, fw)
    acc, shift = matmul_accumulate(qx, qw)
    got = dequantise(acc, fx + fw - shift)
    bound = (np.abs(x) @ np.full(w.shape, 2.0 ** -(fw + 1))) + (
        np.full(x.shape, 2.0 ** -(fx + 1)) @ (np.abs(w) + 2.0 ** -(fw + 1))
    )
    assert (np.abs(got - x @ w) <= bound + 2.0 ** (shift - fx - fw - 1)).all()


def test_rescale_rounds_half_up_and_block_exponents_fit() -> None:
    values = np.array([5, -5, 6, 7, -6], dtype=np.int32)
    assert list(rescale(values, 1, 16)) == [3, -2, 3, 4, -3]  # 2.5 -> 3, -2.5 -> -2
    assert list(rescale(np.array([3]), -4, 16)) == [48]
    assert list(rescale(np.array([3000]), -4, 16)) == [32767]  # saturates
    rng = np.random.default_rng(3)
    block = rng.integers(-(2**28), 2**28, 500).astype(np.int32)
    words, fraction = block_to_16(block, 20)
    assert np.abs(words).max() > 16383  # the largest value uses the top bit
    assert np.abs(dequantise(words, fraction) - dequantise(block, 20)).max() <= 2.0 ** -(
        fraction + 1
    )


@pytest.mark.parametrize(
    ("table", "reference", "slope", "low", "high"),
    [
        (SIGMOID_TABLE, lambda z: 1 / (1 + np.exp(-z)), 0.25, -16, 16),
        (TANH_TABLE, np.tanh, 1.0, -8, 8),
        (EXP_TABLE, np.exp, 1.0, -16, 0),  # the softmax only asks for arguments <= 0
    ],
)
def test_lookup_tables_are_within_half_a_step(
    table: LookupTable,
    reference: Callable[[np.ndarray], np.ndarray],
    slope: float,
    low: int,
    high: int,
) -> None:
    """Index = net input rounded to 2**-8; entry = value in Q0.15: the error is at most the
    slope times half a step plus half an output LSB; beyond the table, the end entry."""
    fraction = 20
    z = np.linspace(low, high, 20_001)
    words = np.rint(z * 2**fraction).astype(np.int32)
    got = dequantise(table.lookup(words, fraction), 15)
    bound = slope * 2.0**-9 + 2.0**-16 + 2.0**-fraction
    assert np.abs(got - reference(z)).max() <= bound
    outside = np.rint(np.array([low - 3.0, high + 3.0]) * 2**fraction).astype(np.int32)
    ends = np.rint(np.array([low, high]) * 2**fraction).astype(np.int32)
    assert np.array_equal(table.lookup(outside, fraction), table.lookup(ends, fraction))
    assert len(table.entries) == (high - low) * 256 + 1


def test_board_gradient_matches_float_training() -> None:
    """One bunch through the board's arithmetic, expressed as a gradient sum, is within
    a fraction of a percent of numpy's float32 gradient of the same bunch."""
    spec = NetworkSpec.parse("117:64:10")
    corpus = load_corpus(DataSpec(), 10)
    layout = ElementLayout.for_network(spec)
    weights = initial_weights(spec, seed=1)
    frames = np.random.default_rng(4).choice(corpus.train_frames, 128, replace=False)
    x, labels = corpus.windows(frames), corpus.labels[frames]
    expected = layout.allocate()
    BunchNetwork(spec, 128).gradient(weights, x, labels, expected)

    matrices = [weight_matrix(view) for view in layout.views(weights)]
    fx = fraction_bits_for(float(np.abs(corpus.frames).max()))
    network = FixedPointNetwork(spec)
    shift = 9
    updated, probs = network.train(matrices, Block(quantise(x, fx), fx), labels, shift)
    for before, after, want in zip(matrices, updated, layout.views(expected), strict=True):
        assert after.dtype == np.int32
        got = -(after.astype(np.int64) - before.words) * 2.0 ** (shift - before.fraction - 16)
        assert np.linalg.norm(got - want) <= 0.01 * np.linalg.norm(want)
    hidden, forward_probs = network.forward(matrices, Block(quantise(x, fx), fx))
    assert np.array_equal(forward_probs, probs) and hidden[0].fraction == 15
    assert np.abs(dequantise(probs, 15).sum(axis=1) - 1).max() < 5e-3  # softmax in Q0.15
    assert network.sat.count == 0
