"""``FusedSteps``: ``BunchNetwork``'s arithmetic with its passes fused into compiled kernels.

The same math, layer folding and buffers as client/network.py (whose docstring explains
them), in a handful of calls per step instead of about forty: the windows are cut
straight from the frames into the input buffer, each layer's bias, scaling and product
is one call, the softmax, its loss, its accuracy and its delta one pass over the
(bunch x outputs) logits, and each layer's backward step (gradient product, bias
gradient, propagation and derivative) one call. Only the ``tanh`` passes stay numpy's
(vectorised, ten times a compiled scalar loop here). Used by ``BunchNetwork`` when numba
is installed (client/kernels.py); numpy alone computes the same numbers within float32
rounding.
"""

from __future__ import annotations

import numpy as np

from snet.protocol.network import ELEMENT_DTYPE, SOFTMAX_FLOOR, ElementLayout, NetworkSpec

from . import kernels
from .layer_scales import layer_scales
from .network import ElementViews


class FusedSteps:
    """Gradients and scores of one network shape, for bunches of up to ``max_bunch``."""

    def __init__(self, spec: NetworkSpec, max_bunch: int) -> None:
        self.spec = spec
        self.max_bunch = max_bunch
        self.layout = ElementLayout.for_network(spec)
        self._scales = layer_scales(spec)
        self._kinds = [*spec.activations, "softmax"]
        sizes = spec.sizes
        self._inputs = np.empty((max_bunch, sizes[0] + 1), dtype=ELEMENT_DTYPE)
        self._inputs[:, -1] = self._scales[0].pre  # multiplies the first layer's bias row
        self._outputs = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        self._deltas = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:-1]]
        self._plain = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:-1]]
        self._biases = [np.empty(n, dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        self._views = ElementViews(self.layout)
        # Per layer: bunches below this size make true inputs (``_uses_plain``), and
        # whether the layer below is relu; looked up, not recomputed, at every step.
        self._plain_below = [
            sizes[layer + 1] if self._scales[layer].in_add != 0.0 else 0
            for layer in range(len(self._kinds))
        ]
        self._relu = [kind == "relu" for kind in self._kinds]

    def _check(self, n: int) -> None:
        if n > self.max_bunch:
            raise ValueError(f"bunch of {n} is larger than the {self.max_bunch} prepared")

    def load(self, x: np.ndarray) -> int:
        """Copy patterns into the input buffer (scaled by the first layer's ``pre``)."""
        n = int(x.shape[0])
        self._check(n)
        kernels.load_patterns(x, self._scales[0].pre, self._inputs)
        return n

    def load_windows(
        self, frames: np.ndarray, starts: np.ndarray, centres: np.ndarray, context: int
    ) -> int:
        """Cut the context windows of ``centres`` from ``frames`` into the input buffer."""
        n = len(centres)
        if n > self.max_bunch or frames.shape[1] * (2 * context + 1) != self._inputs.shape[1] - 1:
            self._check(n)
            raise ValueError(f"windows of {frames.shape[1]} features do not fit the network")
        kernels.load_windows(frames, starts, centres, context, self._scales[0].pre, self._inputs)
        return n

    def forward(self, weights: np.ndarray, n: int, labels: np.ndarray) -> tuple[float, int]:
        """Every layer's stored output for the loaded bunch and the softmax; returns
        (summed loss, correct)."""
        views = self._views(weights)
        kernels.matmul(self._inputs, views[0], self._outputs[0], n, 1.0)  # pre * (x W + b)
        for layer in range(1, len(self._kinds)):
            self._activate(layer - 1, self._outputs[layer - 1][:n])
            self._forward_layer(views, layer, n)
        labels = labels.astype(np.int64, copy=False)  # one compiled variant for all
        loss, correct = kernels.softmax_delta(self._outputs[-1], n, labels, SOFTMAX_FLOOR, False)
        return float(loss), int(correct)

    def _forward_layer(self, views: list[np.ndarray], layer: int, n: int) -> None:
        """pre * z of ``layer`` (above the first) from the activated layer below."""
        scales = self._scales[layer]
        kernels.forward_layer(
            self._outputs[layer - 1],
            n,
            views[2 * layer - 1],
            views[2 * layer],
            self._outputs[layer],
            self._plain[layer - 1],
            self._uses_plain(layer, n),
            scales.in_mul,
            scales.in_add,
            scales.pre,
            self._biases[layer],
        )

    def _activate(self, layer: int, out: np.ndarray) -> None:
        if self._relu[layer]:
            np.maximum(out, 0.0, out=out)
        else:  # tanh, or sigmoid stored as tanh(z / 2)
            np.tanh(out, out=out)

    def _uses_plain(self, layer: int, n: int) -> bool:
        """As ``BunchNetwork._uses_plain``: true activations for bunches smaller than the
        layer's width, the column sums of its weights otherwise."""
        return n < self._plain_below[layer]

    def gradient(
        self, weights: np.ndarray, n: int, labels: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """The summed gradient over the loaded bunch of ``n`` patterns into ``out``;
        returns (summed loss, correct) with the weights before the update."""
        views, grads = self._views(weights), self._views(out)
        labels = labels.astype(np.int64, copy=False)  # one compiled variant for all
        top = len(self._kinds) - 1
        kernels.matmul(self._inputs, views[0], self._outputs[0], n, 1.0)  # pre * (x W + b)
        if top == 0:  # no hidden layer: the softmax layer is the first
            loss, correct = kernels.softmax_delta(self._outputs[0], n, labels, SOFTMAX_FLOOR, True)
            kernels.matmul_at(self._inputs, self._outputs[0], grads[0], n, 1.0)
            return float(loss), int(correct)
        for layer in range(1, top):
            self._activate(layer - 1, self._outputs[layer - 1][:n])
            self._forward_layer(views, layer, n)
        below = self._outputs[top - 1]
        self._activate(top - 1, below[:n])
        scales = self._scales[top]
        loss, correct = kernels.output_layer(
            below,
            n,
            views[2 * top - 1],
            views[2 * top],
            self._outputs[top],
            self._plain[top - 1],
            self._uses_plain(top, n),
            scales.in_mul,
            scales.in_add,
            scales.back,
            self._biases[top],
            labels,
            SOFTMAX_FLOOR,
            grads[2 * top - 1],
            grads[2 * top],
            self._deltas[top - 1],
            self._relu[top - 1],
        )
        for layer in range(top - 1, 0, -1):
            scales = self._scales[layer]
            plain = self._uses_plain(layer, n)
            kernels.backward_layer(
                self._deltas[layer],
                n,
                (self._plain if plain else self._outputs)[layer - 1],
                views[2 * layer - 1],
                grads[2 * layer - 1],
                grads[2 * layer],
                1.0 if plain else scales.in_mul,
                0.0 if plain else scales.in_add,
                scales.back,
                self._deltas[layer - 1],
                self._outputs[layer - 1],
                self._relu[layer - 1],
            )
        kernels.matmul_at(self._inputs, self._deltas[0], grads[0], n, 1.0)  # weights and bias
        return loss, correct  # a Python float and int (numba converts its results)


def warm_up() -> None:
    """Load every kernel's compiled code now, for the array types a step passes them.

    Loading (from numba's cache, or compiling on a machine's first run) holds the
    interpreter for about half a second: a worker does it once it has a job that takes
    the compiled step (client/kernel_choice.py), while it opens the data and before its
    first bunch, within the time the server gives a joining worker's first update (sync,
    one there from the start: ``join_seconds``; async, or a sync latecomer: the others'
    pace, at least ``stall_seconds``, after which its first lease may go to them); worker
    groups and the demo's workers do it before they join. ``make`` runs it at set-up, so
    that no worker compiles inside that time."""
    spec = NetworkSpec((3, 2, 2, 2), ("sigmoid", "relu"))  # every kernel of a step
    steps = FusedSteps(spec, 4)
    weights = ElementLayout.for_network(spec).allocate()
    out = ElementLayout.for_network(spec).allocate()
    labels = np.zeros(2, dtype=np.int64)
    frames = np.zeros((4, 1), dtype=ELEMENT_DTYPE)
    shared = frames.copy()
    shared.setflags(write=False)  # as the read-only memory map of the shared data cache
    for held in (frames, shared):
        n = steps.load_windows(held, np.array([0, 4]), np.arange(2, dtype=np.int64), 1)
    steps.gradient(weights, n, labels, out)
    steps.forward(weights, steps.load(np.zeros((2, 3), dtype=ELEMENT_DTYPE)), labels)
