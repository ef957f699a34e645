"""Codecs that send less than every value: ``topk:F`` and the low-rank ``powersgd:R``.

Stated error bounds (tests check each):

- ``topk:F``: in each segment of n values the k = ceil(F * n) (at least 1) largest in
  magnitude travel exactly, as (index, float32 value) pairs with indices strictly
  increasing (uint16 when n <= 65536, else uint32); the rest decode as 0. So every kept
  value is exact and no dropped value is larger in magnitude than the smallest kept one.
- ``powersgd:R``: a weight matrix M (m x n) travels as P (m x r) and Q (n x r), r =
  min(R, m, n), from one step of subspace iteration warm-started from the previous Q
  (Vogels et al., PowerSGD): P = orthonormalise(M Q_prev), Q = M^T P; it decodes as
  P Q^T = P P^T M, the projection of M onto span(P), so ||M - d||_F <= ||M||_F, and a
  matrix of rank <= r decodes exactly. Bias vectors travel uncompressed (float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import CodecError, ConfigError
from .base import ElementCodec, PartSpec, require_finite

UINT16_INDEX_LIMIT = 65536
MAX_RANK = 64


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape))


class TopKCodec(ElementCodec):
    """The largest fraction ``F`` of each segment's values, with their indices."""

    family = "topk"

    def __init__(self, fraction: float) -> None:
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ConfigError(f"topk fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction

    @property
    def name(self) -> str:
        return f"topk:{self.fraction:g}"

    def kept(self, size: int) -> int:
        """How many values of a segment of ``size`` travel (both sides compute this)."""
        return min(size, max(1, math.ceil(self.fraction * size)))

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        size = _size(shape)
        index_dtype = "<u2" if size <= UINT16_INDEX_LIMIT else "<u4"
        k = self.kept(size)
        return PartSpec(index_dtype, (k,)), PartSpec("<f4", (k,))

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        values = segment.reshape(-1)
        k = self.kept(values.size)
        if k == values.size:
            chosen = np.arange(values.size)
        else:
            chosen = np.argpartition(np.abs(values), values.size - k)[values.size - k :]
            chosen.sort()
        index_dtype = self.part_specs(segment.shape)[0].dtype
        return chosen.astype(index_dtype), values[chosen].astype("<f4")

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        indices, values = parts
        size = _size(shape)
        if indices.size > 1 and not (np.diff(indices.astype(np.int64)) > 0).all():
            raise CodecError(f"{self.name}: indices are not strictly increasing")
        if indices.size and int(indices[-1]) >= size:  # increasing: the last is the largest
            raise CodecError(
                f"{self.name}: index {int(indices[-1])} out of range for {size} values"
            )
        require_finite(self.name, "values", values)

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        indices, values = parts
        flat = out.reshape(-1)
        flat[...] = 0.0
        flat[indices] = values


class PowerSgdCodec(ElementCodec):
    """Rank-``R`` factors of each weight matrix, warm-started; biases as float32.

    The encoder keeps each matrix's last Q (its state); the decoder needs none. The first
    Q of every matrix is drawn from a fixed seed, so runs are reproducible.
    """

    family = "powersgd"

    def __init__(self, rank: int) -> None:
        if not 1 <= rank <= MAX_RANK:
            raise ConfigError(f"powersgd rank must be in 1..{MAX_RANK}, got {rank}")
        self.rank = rank
        self._q: dict[int, np.ndarray] = {}

    @property
    def name(self) -> str:
        return f"powersgd:{self.rank}"

    def _rank_for(self, shape: tuple[int, ...]) -> int:
        return min(self.rank, shape[0], shape[1])

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        if len(shape) != 2:
            return (PartSpec("<f4", (_size(shape),)),)
        rank = self._rank_for(shape)
        return PartSpec("<f4", (shape[0], rank)), PartSpec("<f4", (shape[1], rank))

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        if segment.ndim != 2:
            return (segment.reshape(-1).astype("<f4"),)
        columns = segment.shape[1]
        rank = self._rank_for(segment.shape)
        q = self._q.get(index)
        if q is None or q.shape != (columns, rank):
            q = np.random.default_rng(index).standard_normal((columns, rank)).astype("<f4")
        p, _ = np.linalg.qr(segment @ q)
        p = np.ascontiguousarray(p, dtype="<f4")
        q = np.ascontiguousarray(segment.T @ p, dtype="<f4")
        if not np.isfinite(q).all():  # a non-finite input: start afresh next time
            self._q.pop(index, None)
        else:
            self._q[index] = q
        return p, q

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        for part in parts:
            require_finite(self.name, "factors" if len(shape) == 2 else "biases", part)

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        if len(parts) == 1:
            out.reshape(-1)[...] = parts[0]
            return
        p, q = parts
        np.matmul(p, q.T, out=out)

    def reset(self) -> None:
        """Forget the warm start (e.g. after the worker's residual was dropped)."""
        self._q.clear()
