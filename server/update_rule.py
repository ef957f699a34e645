"""The update rule: summed worker gradients in, a momentum step on the master weights out.

::

    g = (sum of the received gradient sums) / (patterns they cover)
    v = momentum * v - learning_rate * g
    w = w + v

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
        self.velocity = np.zeros_like(self.weights)
        self._gradient = np.zeros_like(self.weights)
        self.momentum = momentum
        self.snapshot: np.ndarray = self.weights.copy()
        self.snapshot.flags.writeable = False

    def step(
        self, gradients: Sequence[np.ndarray], patterns: int, learning_rate: float
    ) -> np.ndarray:
        """Apply one step for gradient sums covering ``patterns`` patterns in total.

        Returns a read-only copy of the new weights; the caller publishes it as
        ``snapshot`` together with the new version number, so the two always agree.
        """
        if patterns < 1 or not gradients:
            raise ValueError("a step needs at least one pattern")
        np.copyto(self._gradient, gradients[0])
        for gradient in gradients[1:]:
            self._gradient += gradient
        self._gradient *= np.float32(learning_rate / patterns)
        self.velocity *= np.float32(self.momentum)
        self.velocity -= self._gradient
        self.weights += self.velocity
        snapshot = self.weights.copy()
        snapshot.flags.writeable = False
        return snapshot

    def load(self, weights: np.ndarray) -> None:
        """Replace the weights (e.g. to continue training) and reset the momentum."""
        np.copyto(self.weights, weights)
        self.velocity[...] = 0.0
        snapshot = self.weights.copy()
        snapshot.flags.writeable = False
        self.snapshot = snapshot
