"""The update rule: summed worker gradients in, a momentum step on the master weights out.

::

    g = (sum of the received gradient sums) / (patterns they cover)
    v = momentum * v - learning_rate * g
    w = w + v

Updates that already carry their worker's momentum (momentum-corrected codecs such as
``topk``, protocol 8.8) are the ``direct`` ones: they are scaled the same way but added to
the weights as they are, outside v (``w = w + v - learning_rate * g_direct``); without
them the step is exactly the one above.

Dividing by the pattern count makes the step independent of how the patterns were split:
a synchronous step over N workers of b patterns each equals one sequential step on a
bunch of N*b patterns. Runs in a worker thread; the event loop only ever reads the
immutable ``snapshot`` the coordinator publishes after each step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from snet.protocol.network import ELEMENT_DTYPE


class UpdateRule:
    """Master weights and momentum, updated in place, with a published snapshot."""

    def __init__(self, weights: np.ndarray, momentum: float) -> None:
        self.weights = np.array(weights, dtype=ELEMENT_DTYPE)
        self.weights.flags.writeable = False
        self.velocity = np.zeros_like(self.weights)
        self._gradient = np.zeros_like(self.weights)
        self.momentum = momentum
        self.snapshot: np.ndarray = self.weights

    def step(
        self,
        gradients: Sequence[np.ndarray],
        patterns: int,
        learning_rate: float,
        direct: Sequence[np.ndarray] = (),
    ) -> np.ndarray | None:
        """Apply one step for gradient sums covering ``patterns`` patterns in total.

        ``direct`` updates (which carry their worker's momentum) bypass the velocity.
        Returns the new weights (read-only); the caller publishes them as ``snapshot``
        together with the new version number, so the two always agree. Returns None, and
        changes nothing, when the gradients contain NaN or Inf (or their sum overflows).
        """
        if patterns < 1 or not (gradients or direct):
            raise ValueError("a step needs at least one pattern")
        scale = np.float32(-learning_rate / patterns)
        total = self._scaled_sum(gradients, scale, self._gradient)
        bypass = self._scaled_sum(direct, scale, None)
        # NaN and Inf survive summation, so one check of each sum covers every update.
        for part in (total, bypass):
            if part is not None and not np.isfinite(part.sum(dtype=np.float64)):
                return None
        self.velocity *= np.float32(self.momentum)
        if total is not None:
            self.velocity += total
        # The new weights go to a fresh buffer, which is the snapshot: no separate copy,
        # and buffers still being sent to workers are never written again.
        weights = np.add(self.weights, self.velocity)
        if bypass is not None:
            weights += bypass
        weights.flags.writeable = False
        self.weights = weights
        return weights

    @staticmethod
    def _scaled_sum(
        gradients: Sequence[np.ndarray], scale: np.float32, out: np.ndarray | None
    ) -> np.ndarray | None:
        """``scale`` times the sum of ``gradients`` (into ``out`` if given); None if none."""
        if not gradients:
            return None
        total: np.ndarray
        if len(gradients) == 1:
            total = np.multiply(gradients[0], scale, out=out)
            return total
        total = np.add(gradients[0], gradients[1], out=out)
        for gradient in gradients[2:]:
            total += gradient
        total *= scale
        return total

    def load(self, weights: np.ndarray) -> None:
        """Replace the weights (e.g. to continue training) and reset the momentum."""
        fresh = np.array(weights, dtype=ELEMENT_DTYPE)
        fresh.flags.writeable = False
        self.weights = self.snapshot = fresh
        self.velocity[...] = 0.0
