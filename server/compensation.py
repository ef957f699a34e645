"""What the staleness policies do to a stale update's gradient before the update rule.

An update arrives as the *sum* ``G`` of the gradients of its ``n`` patterns, computed on
the weights ``W_base`` of its base version; the server's weights are ``W_now``, ``t``
versions later (``protocol/staleness.py`` names the policies):

- staleness-aware rate: ``G / max(t, 1)``;
- DC-ASGD (constant lambda): the mean gradient ``g = G / n`` is compensated as
  ``g + lambda * g * g * (W_now - W_base)``, so ``G + lambda * (G * G / n) * (W_now -
  W_base)``;
- Gap-Aware: ``G / max(1, |W_now - W_base| / C)`` value by value, ``C`` the running mean
  of the size of each weight's steps (``StepSizes``).

Both of the last two need ``W_base``: ``WeightHistory`` keeps the published weights of the
last ``HISTORY_VERSIONS`` versions, as references to the read-only snapshots the update
rule made anyway (no copies; at most that many networks' worth of memory, and only while
such a policy is in force). An update whose base is older than that is applied as it came,
and counted. Everything here runs in the step thread, never on the event loop.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from snet.protocol.network import ELEMENT_DTYPE

HISTORY_VERSIONS = 8  # weight versions kept for DC-ASGD and Gap-Aware (memory: 8 networks)
STEP_SIZE_DECAY = 0.9  # Gap-Aware: weight of the past in the running mean step size


def staleness_scaled(gradient: np.ndarray, staleness: int) -> np.ndarray:
    """The staleness-aware rate's gradient: ``gradient / max(staleness, 1)``."""
    if staleness <= 1:
        return gradient
    scaled: np.ndarray = np.multiply(gradient, np.float32(1.0 / staleness), dtype=ELEMENT_DTYPE)
    return scaled


def delay_compensated(
    gradient_sum: np.ndarray, patterns: int, now: np.ndarray, base: np.ndarray, factor: float
) -> np.ndarray:
    """DC-ASGD: ``G + factor * (G * G / patterns) * (now - base)`` for a gradient sum ``G``
    of ``patterns`` patterns (the compensation of the mean gradient, times ``patterns``)."""
    correction: np.ndarray = np.subtract(now, base, dtype=ELEMENT_DTYPE)
    correction *= gradient_sum
    correction *= gradient_sum
    correction *= np.float32(factor / patterns)
    correction += gradient_sum
    return correction


def gap_penalised(
    gradient: np.ndarray, now: np.ndarray, base: np.ndarray, step_size: np.ndarray
) -> np.ndarray:
    """Gap-Aware: each value divided by ``max(1, |now - base| / step_size)``."""
    gap: np.ndarray = np.subtract(now, base, dtype=ELEMENT_DTYPE)
    np.abs(gap, out=gap)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap /= step_size  # a weight that never moved (size 0) and moved now: inf: no step
    np.nan_to_num(gap, copy=False, nan=0.0, posinf=float(np.finfo(np.float32).max))
    np.maximum(gap, np.float32(1.0), out=gap)
    penalised: np.ndarray = np.divide(gradient, gap, dtype=ELEMENT_DTYPE)
    return penalised


class WeightHistory:
    """The published weights of the last ``limit`` versions, by version."""

    def __init__(self, limit: int = HISTORY_VERSIONS) -> None:
        self.limit = limit
        self._weights: OrderedDict[int, np.ndarray] = OrderedDict()
        self.misses = 0  # updates whose base was no longer kept (applied uncompensated)

    def add(self, version: int, weights: np.ndarray) -> None:
        self._weights[version] = weights
        while len(self._weights) > self.limit:
            self._weights.popitem(last=False)

    def get(self, version: int, count: bool = True) -> np.ndarray | None:
        """The weights of ``version``, or None (counted as a miss unless ``count`` is off)."""
        weights = self._weights.get(version)
        if weights is None and count:
            self.misses += 1
        return weights

    def clear(self) -> None:
        """Forget everything (the weights were replaced: roll-back, restore)."""
        self._weights.clear()

    def __len__(self) -> int:
        return len(self._weights)


class StepSizes:
    """Gap-Aware's ``C``: a running mean of ``|W_after - W_before|`` per weight."""

    def __init__(self, decay: float = STEP_SIZE_DECAY) -> None:
        self.decay = np.float32(decay)
        self.mean: np.ndarray | None = None

    def observe(self, before: np.ndarray, after: np.ndarray) -> None:
        size: np.ndarray = np.subtract(after, before, dtype=ELEMENT_DTYPE)
        np.abs(size, out=size)
        if self.mean is None or self.mean.shape != size.shape:
            self.mean = size
            return
        self.mean *= self.decay
        size *= np.float32(1.0) - self.decay
        self.mean += size

    def clear(self) -> None:
        self.mean = None
