"""Codecs that send less than every value: ``topk:F`` and the low-rank ``powersgd:R``.

Stated error bounds (tests check each):

- ``topk:F``: the k = ceil(F * size) (at least 1) largest magnitudes of the whole element
  travel exactly, as indices and float32 values per segment, the indices as the varint
  gaps between them (varint.py: about 1.3 bytes each at 1%); the rest decode as 0. So
  every kept value is exact and no dropped value is larger in magnitude than the smallest
  kept one. A worker's first updates keep more (the sparsity warm-up, ``warmup_kept``:
  WARMUP_DENSITY of the values, decaying by e every WARMUP_UPDATES updates, down to k);
  a decoder accepts any count from k to size.
  Updates in ``topk`` are *momentum-corrected* (Lin et al., Deep Gradient Compression):
  the worker accumulates its own momentum before choosing, and the server applies them
  without its momentum (``ElementCodec.momentum_corrected``).
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
from ..messages import Encoded
from ..network import ElementLayout
from .base import FLOAT32_MAX, ElementCodec, PartSpec, require_finite
from .varint import decode_gaps, encode_gaps

MAX_RANK = 64
# topk's sparsity warm-up (as in Deep Gradient Compression, scaled to short runs): update
# number n keeps WARMUP_DENSITY * exp(-(n - 1) / WARMUP_UPDATES) of the values while that
# is more than F. Error feedback starts with nothing to send but whatever is largest, so
# the first updates of 1% carry mostly the output layer and the hidden layer waits for
# tens of updates; the warm-up costs about WARMUP_DENSITY * WARMUP_UPDATES elements per
# worker, once (2% of the bytes of a 10-epoch run on the default job).
WARMUP_DENSITY = 0.2
WARMUP_UPDATES = 20.0


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape))


class TopKCodec(ElementCodec):
    """The largest fraction ``F`` of the element's values, with their indices.

    The selection is over the whole element (all layers compete), then split by segment,
    so a segment may carry anything from none to all of its values; the lengths are in
    the parts' shapes and must add up to ``kept(size)``. (Keeping F of every layer
    separately was measured: it cost 5.8 points of CV accuracy on the default job where
    the whole-element choice costs about 1; see docs/compression.md.)
    """

    family = "topk"
    # With 1% of the values a coordinate travels about once per 100 updates: its residual
    # then arrives in a burst that the server's momentum would smear over the next steps
    # as if it were fresh. Accumulating the velocity on the worker (DGC) avoids that
    # (measured in docs/compression.md).
    momentum_corrected = True

    def __init__(self, fraction: float) -> None:
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ConfigError(f"topk fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction

    @property
    def name(self) -> str:
        return f"topk:{self.fraction:g}"

    def kept(self, size: int) -> int:
        """How many values of an element of ``size`` travel (both sides compute this)."""
        return min(size, max(1, math.ceil(self.fraction * size)))

    def warmup_kept(self, size: int, number: int) -> int:
        """How many values the reference worker keeps in its update ``number`` (1, 2, ...):
        ``kept(size)``, or more during the sparsity warm-up."""
        density = WARMUP_DENSITY * math.exp(-(max(number, 1) - 1) / WARMUP_UPDATES)
        return max(self.kept(size), min(size, math.ceil(density * size)))

    def encode(self, layout: ElementLayout, flat: np.ndarray) -> Encoded:
        return self._encode_largest(layout, flat, self.kept(flat.size))

    def encode_update(self, layout: ElementLayout, flat: np.ndarray, number: int) -> Encoded:
        return self._encode_largest(layout, flat, self.warmup_kept(flat.size, number))

    def _encode_largest(self, layout: ElementLayout, flat: np.ndarray, k: int) -> Encoded:
        """The ``k`` largest magnitudes of ``flat``, by segment."""
        if k == flat.size:
            chosen = np.arange(flat.size)
        else:
            chosen = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :]
            chosen.sort()
        bounds = np.searchsorted(chosen, [*layout.offsets, layout.size])
        parts: list[np.ndarray] = []
        for number, offset in enumerate(layout.offsets):
            local = chosen[bounds[number] : bounds[number + 1]] - offset
            parts += [encode_gaps(local), flat[offset + local].astype("<f4")]
        return Encoded(self.name, tuple(parts))

    def check_parts(
        self, layout: ElementLayout, parts: Sequence[np.ndarray]
    ) -> list[Sequence[np.ndarray]]:
        """Two parts per segment, index bytes and values; the values must add up to at
        least ``kept(layout.size)`` (more during a worker's warm-up).

        Each segment comes back as (indices, values), its varint gaps decoded (and
        checked) here once, for both ``check_values`` and ``decode_segment``."""
        wanted = 2 * len(layout.shapes)
        if len(parts) != wanted:
            raise CodecError(f"{self.name}: {len(parts)} part(s) for a network that needs {wanted}")
        groups = [parts[i : i + 2] for i in range(0, wanted, 2)]
        total = 0
        for number, (indices, values) in enumerate(groups):
            if (
                indices.dtype.str != "|u1"
                or values.dtype.str != "<f4"
                or indices.ndim != 1
                or values.ndim != 1
                or indices.size < values.size
            ):
                raise CodecError(
                    f"{self.name}: segment {number} parts are {indices.dtype.str} "
                    f"{list(indices.shape)} and {values.dtype.str} {list(values.shape)}, "
                    f"expected |u1 [>= k] and <f4 [k]"
                )
            total += values.size
        if not self.kept(layout.size) <= total <= layout.size:
            raise CodecError(
                f"{self.name}: {total} values, expected {self.kept(layout.size)} to {layout.size}"
            )
        return [(decode_gaps(data, values.size, self.name), values) for data, values in groups]

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        indices, values = parts  # indices decoded by check_parts: strictly increasing
        size = _size(shape)
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
        if len(parts) == 2:  # finite factors whose product overflows would still put Inf
            p, q = parts  # into the element: |p q^T| <= rank * max|p| * max|q|
            bound = p.shape[1] * float(np.abs(p).max(initial=0)) * float(np.abs(q).max(initial=0))
            if bound > FLOAT32_MAX:
                raise CodecError(f"{self.name}: factors whose product overflows float32")

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        if len(parts) == 1:
            out.reshape(-1)[...] = parts[0]
            return
        p, q = parts
        np.matmul(p, q.T, out=out)

    def reset(self) -> None:
        """Forget the warm start (e.g. after the worker's residual was dropped)."""
        self._q.clear()
