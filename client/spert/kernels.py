"""The network arithmetic the board's T0 runs: forward, backward and the weight update,
all in the fixed-point formats of ``fixedpoint`` (see its table).

Weights are held as 32-bit words (the 16+16-bit variant Quicknet used because 16 bits
were too few for training): the forward and backward passes use only the high half, the
update is added into all 32 bits. The learning rate is a power-of-two shift ``k``: a
bunch changes each 32-bit weight by ``-(sum of gradients) * 2**-k``, rounded to the
weight's last place and saturated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from snet.protocol.network import NetworkSpec

from .fixedpoint import (
    ACTIVATION_FRACTION,
    EXP_TABLE,
    SIGMOID_TABLE,
    TANH_TABLE,
    Saturations,
    block_to_16,
    matmul_accumulate,
    rescale,
    saturate,
    saturating_add,
)

ONE = 1 << ACTIVATION_FRACTION  # 1.0 in Q0.15 (one more than the largest Q0.15 word)


@dataclass
class BoardMatrix:
    """A weight matrix or bias vector in board memory: 32-bit words with ``fraction + 16``
    fraction bits; the high half (int16) has ``fraction`` fraction bits."""

    words: np.ndarray  # int32
    fraction: int

    def high_half(self) -> np.ndarray:
        return (self.words >> 16).astype(np.int16)


@dataclass
class Block:
    """16-bit words of one bunch's activations or deltas, with their shared exponent."""

    words: np.ndarray  # int16, (patterns, units)
    fraction: int


@dataclass
class Block32:
    """A bunch's 32-bit accumulator values (net inputs) with their fraction bits."""

    words: np.ndarray  # int32
    fraction: int


class FixedPointNetwork:
    """Forward, backward and update passes of one network shape on 16/32-bit words."""

    def __init__(self, spec: NetworkSpec) -> None:
        self.spec = spec
        self.sat = Saturations()

    # ------------------------------------------------------------ forward

    def _net_input(self, below: Block, weights: BoardMatrix, bias: BoardMatrix) -> Block32:
        acc, shift = matmul_accumulate(below.words, weights.high_half(), sat=self.sat)
        fraction = below.fraction + weights.fraction - shift
        b = rescale(bias.high_half(), bias.fraction - fraction, 32, self.sat)
        return Block32(saturating_add(acc, b[None, :], 32, self.sat), fraction)

    def _hidden(self, kind: str, z: Block32) -> Block:
        if kind == "sigmoid":
            return Block(SIGMOID_TABLE.lookup(z.words, z.fraction), ACTIVATION_FRACTION)
        if kind == "tanh":
            return Block(TANH_TABLE.lookup(z.words, z.fraction), ACTIVATION_FRACTION)
        positive = np.maximum(z.words, 0)
        words, fraction = block_to_16(positive, z.fraction, self.sat)
        return Block(words, fraction)

    @staticmethod
    def _softmax(z: Block32) -> np.ndarray:
        """Q0.15 probabilities: exp from the table, one integer divide per pattern."""
        shifted = z.words.astype(np.int64) - z.words.max(axis=1, keepdims=True)
        e = EXP_TABLE.lookup(shifted, z.fraction).astype(np.int64)
        total = e.sum(axis=1, keepdims=True)  # >= 32767: the largest entry is e^0
        return saturate((e * ONE + total // 2) // total, 16)

    def forward(self, weights: list[BoardMatrix], x: Block) -> tuple[list[Block], np.ndarray]:
        """Activations of every hidden layer and the output probabilities (Q0.15)."""
        hidden: list[Block] = []
        below = x
        layers = len(weights) // 2
        for layer in range(layers):
            z = self._net_input(below, weights[2 * layer], weights[2 * layer + 1])
            if layer == layers - 1:
                return hidden, self._softmax(z)
            below = self._hidden(self.spec.activations[layer], z)
            hidden.append(below)
        raise AssertionError("a network has at least one layer")

    # ------------------------------------------------------------ backward

    @staticmethod
    def _derivative(kind: str, h: np.ndarray) -> np.ndarray:
        """f'(z) in Q0.15, from the unit's output h (Q0.15 for sigmoid and tanh)."""
        wide = h.astype(np.int64)
        if kind == "sigmoid":
            return saturate((wide * (ONE - wide) + (ONE >> 1)) >> ACTIVATION_FRACTION, 16)
        if kind == "tanh":
            return saturate(ONE - ((wide * wide + (ONE >> 1)) >> ACTIVATION_FRACTION), 16)
        return saturate(np.where(wide > 0, ONE, 0), 16)

    def _update(
        self, matrix: BoardMatrix, gradient: np.ndarray, fraction: int, rate_shift: int
    ) -> np.ndarray:
        """The matrix's 32-bit words after ``-= gradient * 2**-rate_shift``."""
        step = rescale(gradient, fraction + rate_shift - (matrix.fraction + 16), 32, self.sat)
        return saturating_add(matrix.words, -step.astype(np.int64), 32, self.sat)

    def train(
        self, weights: list[BoardMatrix], x: Block, labels: np.ndarray, rate_shift: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """One bunch: forward, backward with the high halves, update into all 32 bits.

        Returns the updated 32-bit words of every matrix (the loaded ones are left as
        they are) and the output probabilities before the update (Q0.15).
        """
        hidden, probs = self.forward(weights, x)
        n = len(labels)
        rows = np.arange(n)
        delta_words = probs.astype(np.int32)
        delta_words[rows, labels] -= ONE  # p - t covers [-1, 1): fits Q0.15
        delta = Block(delta_words.astype(np.int16), ACTIVATION_FRACTION)
        ones = np.ones((1, n), dtype=np.int16)
        updated: list[np.ndarray] = [np.empty(0, dtype=np.int32)] * len(weights)
        for layer in range(len(weights) // 2 - 1, -1, -1):
            w, b = weights[2 * layer], weights[2 * layer + 1]
            below = x if layer == 0 else hidden[layer - 1]
            grad, shift = matmul_accumulate(below.words.T, delta.words, sat=self.sat)
            updated[2 * layer] = self._update(
                w, grad, below.fraction + delta.fraction - shift, rate_shift
            )
            grad_b, shift_b = matmul_accumulate(ones, delta.words, sat=self.sat)
            updated[2 * layer + 1] = self._update(
                b, grad_b[0], delta.fraction - shift_b, rate_shift
            )
            if layer == 0:
                break
            back, shift = matmul_accumulate(delta.words, w.high_half().T, sat=self.sat)
            back16, back_fraction = block_to_16(back, delta.fraction + w.fraction - shift, self.sat)
            derivative = self._derivative(self.spec.activations[layer - 1], below.words)
            product = back16.astype(np.int64) * derivative  # 16 x 16 -> 32 bits, exact
            words, fraction = block_to_16(product, back_fraction + ACTIVATION_FRACTION, self.sat)
            delta = Block(words, fraction)
        return updated, probs
