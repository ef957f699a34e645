"""``SliceTrainer``: a network-parallel worker's share of the network and its arithmetic.

In ``np`` mode (docs/network-parallel.md) a worker holds a contiguous range of hidden
units (``HiddenSlice``): their input weights and biases and their outgoing weights, with
the momentum of each (protocol/slices.py gives the flat layout). For every bunch it

1. ``forward``: reads the bunch's patterns ``x``, computes its units' activations
   ``h = f(x W1 + b1)`` and its share of the output pre-activations ``h W2`` (the
   server sums the shares of all workers and adds the output biases);
2. ``backward``: given the output error ``delta = softmax - one-hot`` (summed form, one
   row per pattern) the server sends back, computes its slice's gradient sums
   (``h^T delta`` for W2; ``x^T dh`` and ``sum dh`` with ``dh = (delta W2^T) f'(h)``
   for W1 and b1) and steps its slice with the rule the server applies to whole
   elements (server/update_rule.py)::

       v = momentum * v - rate * g / patterns;   w = w + v

So without pipelining the slices evolve exactly as the corresponding parts of the
sequential network. With pipelining the forward pass of the next bunch runs before this
bunch's error is back: ``forward`` keeps each bunch's ``x`` and ``h`` until its
``backward`` (at most ``MAX_PENDING``), and the backward pass uses the W2 of that moment,
as Quicknet did on MultiSpert.

All work runs in the worker's compute thread, in float32 like the other backends.
"""

from __future__ import annotations

import numpy as np

from snet.protocol.errors import ProtocolError
from snet.protocol.network import ELEMENT_DTYPE, NetworkSpec
from snet.protocol.slices import HiddenSlice, slice_size, slice_views

from .network import quiet_overflow

MAX_PENDING = 4  # forwards whose error is not back yet (pipelining keeps one or two)


def _activate(kind: str, z: np.ndarray) -> None:
    """``z`` becomes the activation of the hidden units, in place."""
    if kind == "relu":
        np.maximum(z, 0.0, out=z)
    elif kind == "tanh":
        np.tanh(z, out=z)
    else:  # sigmoid, through tanh: no overflow, no denormals
        z *= 0.5
        np.tanh(z, out=z)
        z += 1.0
        z *= 0.5


def _derivative(kind: str, h: np.ndarray) -> np.ndarray:
    """f'(z) from the stored activation ``h``."""
    if kind == "relu":
        return (h > 0.0).astype(ELEMENT_DTYPE)
    if kind == "tanh":
        out: np.ndarray = 1.0 - h * h
        return out
    return h * (1.0 - h)


class SliceTrainer:
    """One worker's hidden units: their weights, momentum and the bunches in flight."""

    def __init__(self, spec: NetworkSpec, momentum: float) -> None:
        self.spec = spec
        self.kind = spec.activations[0]
        self.momentum = np.float32(momentum)
        self.part = HiddenSlice(0, 0)
        self.weights = np.zeros(0, dtype=ELEMENT_DTYPE)
        self.velocity = np.zeros(0, dtype=ELEMENT_DTYPE)
        self.last_bunch = -1  # the last bunch whose error was applied
        self._pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # bunch -> (x, h)

    def load(
        self, part: HiddenSlice, weights: np.ndarray, velocity: np.ndarray, bunch: int
    ) -> None:
        """Take over ``part`` with its weights and momentum, as of bunch ``bunch``."""
        size = slice_size(self.spec, part)
        if weights.shape != (size,) or velocity.shape != (size,):
            raise ProtocolError(
                f"slice {part.start}:{part.stop} needs {size} values, got "
                f"{weights.shape} weights and {velocity.shape} velocity"
            )
        self.part = part
        self.weights = np.array(weights, dtype=ELEMENT_DTYPE)
        self.velocity = np.array(velocity, dtype=ELEMENT_DTYPE)
        self.last_bunch = bunch
        self._pending.clear()

    @quiet_overflow  # a diverged slice's NaN goes to the server, which stops the run
    def forward(self, bunch: int, x: np.ndarray) -> np.ndarray:
        """This slice's share of the output pre-activations of ``x``: (patterns, outputs)."""
        if len(self._pending) >= MAX_PENDING:
            raise ProtocolError(f"more than {MAX_PENDING} bunches forwarded without an error")
        w1, b1, w2 = slice_views(self.spec, self.part, self.weights)
        x = np.ascontiguousarray(x, dtype=ELEMENT_DTYPE)
        h = x @ w1
        h += b1
        _activate(self.kind, h)
        self._pending[bunch] = (x, h)
        partial: np.ndarray = h @ w2
        return partial

    @quiet_overflow
    def backward(self, bunch: int, delta: np.ndarray, patterns: int, rate: float) -> None:
        """Apply the output error of ``bunch`` (forwarded before) to this slice."""
        entry = self._pending.pop(bunch, None)
        if entry is None:
            raise ProtocolError(f"an error for bunch {bunch}, which was not forwarded here")
        x, h = entry
        if delta.shape != (len(x), self.spec.sizes[2]):
            raise ProtocolError(f"error of shape {delta.shape} for a bunch of {len(x)} patterns")
        gradient = np.empty_like(self.weights)
        g1, gb, g2 = slice_views(self.spec, self.part, gradient)
        w2 = slice_views(self.spec, self.part, self.weights)[2]
        np.matmul(h.T, delta, out=g2)
        dh = delta @ w2.T  # with the W2 before this step's change, as the sequential pass
        dh *= _derivative(self.kind, h)
        np.matmul(x.T, dh, out=g1)
        np.add.reduce(dh, axis=0, out=gb)
        gradient *= np.float32(rate / max(patterns, 1))
        self.velocity *= self.momentum
        self.velocity -= gradient
        self.weights += self.velocity
        self.last_bunch = bunch

    def drop_pending(self) -> None:
        """Forget forwarded bunches whose error will not come (the server re-sliced)."""
        self._pending.clear()
