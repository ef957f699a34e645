"""Bunch-mode forward and backward passes of a fully connected classifier, in float32.

All work buffers are preallocated for the largest bunch and reused; the weight gradient
is written straight into the caller's update element. Gradients are *sums* over the
bunch (the server divides by the pattern count), and nothing is propagated back into the
inputs, which need no gradient.

Speed: outside its five matrix products a step makes as few passes over the
(bunch x hidden) arrays as it can (client/layer_scales.py): the first layer's bias rides
in its matrix products (inputs carry a constant column), a sigmoid unit costs one ``tanh``
pass forward, and its derivative three in-place passes over row blocks that stay in the
core's cache. The other per-step work is on (bunch x outputs) arrays and small vectors.

Denormal numbers make float32 arithmetic up to 200x slower on x86. The compute thread
flushes them to zero (protocol/fpu.py), and values are also kept out of that range, for
BLAS threads the switch does not reach: sigmoid is computed through tanh, which
saturates without overflow, and softmax exponents are clipped to >= -30 (a probability
floor of 9e-14, so that tiny output deltas times saturated-unit derivatives stay normal).

With numba installed the same step runs as compiled kernels (client/fused.py): at bunch
12-256 the forty-odd numpy calls of the passes below cost as much as the matrix products.
``BunchNetwork`` hands its work to them unless told otherwise (``kernels``,
``SNET_KERNELS=numpy``) or given another backend's products; trainers ask for them only
for a job large enough to pay for loading them (client/kernel_choice.py).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np

from snet.data.corpus import Corpus, DenseStore
from snet.protocol.network import ELEMENT_DTYPE, SOFTMAX_FLOOR, ElementLayout, NetworkSpec

from .kernel_choice import fused_steps
from .layer_scales import layer_scales

# Rows per block of the derivative's passes: ~256 kB per array, so the three arrays a
# block touches stay in the core's 2 MB L2 cache between passes.
_BLOCK_FLOATS = 65536
# From this bunch size on, the softmax layer's weight gradient is computed transposed and
# copied (its product is a quarter faster that way here; the copy costs more for small bunches).
_TRANSPOSED_GRADIENT_FROM = 128
# From this bunch size on, a fused derivative kernel (the torch backend's) replaces the
# blocked passes; below it its per-call cost (~15 us for torch here) exceeds theirs.
_FUSED_DERIVATIVE_FROM = 64
MIN_ROWS = 1024  # rows a trainer's BunchNetwork holds at least (memory estimates count them)


MatMul = Callable[[np.ndarray, np.ndarray, np.ndarray], object]
"""``matmul(a, b, out)`` writes the float32 product ``a @ b`` into ``out`` (C-contiguous;
``a`` and ``b`` may be transposed views)."""


Derivative = Callable[[str, np.ndarray, np.ndarray], object]
"""``derivative(kind, delta, stored)`` multiplies ``delta`` in place by ``1 - stored^2``
(``kind`` sigmoid or tanh, see ``BunchNetwork._back_into``) or by ``stored > 0`` (relu)."""

P = ParamSpec("P")
R = TypeVar("R")


def quiet_overflow(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` without numpy's RuntimeWarnings for overflow and NaN: a diverging job's
    infinite activations are its caller's to judge from what it returns (the server
    refuses such updates and stops a run that makes nothing else; ``snet train`` stops),
    not a warning on stderr from whichever line of the arithmetic met them first."""

    @functools.wraps(method)
    def quiet(*args: P.args, **kwargs: P.kwargs) -> R:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return method(*args, **kwargs)

    return quiet


def _numpy_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> object:
    return np.matmul(a, b, out=out)


class ElementViews:
    """[first layer's (fan_in + 1, fan_out) weights-and-bias matrix, W1, b1, W2, ...] as
    views of an element, cached per array object: workers reuse a few buffers, and
    building views costs more than a small bunch's arithmetic."""

    def __init__(self, layout: ElementLayout) -> None:
        self.layout = layout
        self._cache: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}

    def __call__(self, flat: np.ndarray) -> list[np.ndarray]:
        entry = self._cache.get(id(flat))
        # An entry keeps its array alive, so no other array can have that id meanwhile.
        if entry is None or entry[0] is not flat:
            if len(self._cache) > 16:
                self._cache.clear()
            parts = self.layout.views(flat)
            first = flat[: parts[0].size + parts[1].size].reshape(-1, parts[0].shape[1])
            entry = self._cache[id(flat)] = (flat, [first, *parts[2:]])
        return entry[1]


class BunchNetwork:
    """Computes summed gradients and scores for one network shape with reused buffers."""

    def __init__(
        self,
        spec: NetworkSpec,
        max_bunch: int,
        matmul: MatMul | None = None,
        derivative: Derivative | None = None,
        kernels: str = "auto",
    ) -> None:
        """``matmul`` and ``derivative`` replace numpy's matrix product and the blocked
        derivative passes (the torch backend brings fused kernels). ``kernels``: "numba"
        runs the step as the compiled kernels of client/fused.py, "numpy" as numpy passes,
        "auto" (the default) the kernels when numba is installed and neither ``matmul``
        nor ``derivative`` is given, unless ``SNET_KERNELS=numpy`` is set. A trainer
        passes what ``kernel_choice.job_kernels`` says for its job."""
        self.spec = spec
        self._matmul = matmul or _numpy_matmul
        self._derivative = derivative
        self.layout = ElementLayout.for_network(spec)
        self.max_bunch = max_bunch
        self._element_views = ElementViews(self.layout)
        self._fused = fused_steps(spec, max_bunch, kernels, matmul or derivative)
        self.kernels = "numpy" if self._fused is None else "numba"
        self._scorer: BunchNetwork | None = None  # numpy's passes for ``evaluate``, if fused
        if self._fused is not None:
            return  # the kernels keep buffers of their own; the numpy passes' are not made
        self._scales = layer_scales(spec)
        self._kinds = [*spec.activations, "softmax"]
        sizes = spec.sizes
        # The inputs, scaled by the first layer's ``pre``, and a column of ``pre`` that
        # multiplies the first layer's bias row.
        self._inputs = np.empty((max_bunch, sizes[0] + 1), dtype=ELEMENT_DTYPE)
        self._inputs[:, -1] = self._scales[0].pre
        # _outputs[l]: the stored output of hidden layer l, (bunch, units). The softmax
        # layer's logits are computed as (bunch, outputs), the faster product here, and
        # copied transposed to (outputs, bunch): its per-pattern maxima and sums are then
        # reductions across rows, which numpy vectorises, not along rows of a few floats.
        self._outputs = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:-1]]
        self._logit_rows = np.empty((max_bunch, sizes[-1]), dtype=ELEMENT_DTYPE)
        self._logits = np.empty((sizes[-1], max_bunch), dtype=ELEMENT_DTYPE)
        # The softmax layer's weight gradient, transposed (the faster product here).
        self._last_gradient = np.empty((sizes[-1], sizes[-2]), dtype=ELEMENT_DTYPE)
        self._deltas = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:-1]]
        self._biases = [np.empty(n, dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        # True activations of hidden layers, for bunches smaller than the next layer.
        self._plain = [
            np.empty((min(max_bunch, above), n), dtype=ELEMENT_DTYPE)
            for n, above in itertools.pairwise(sizes[1:])
        ]
        widest = max(sizes[1:])
        self._scratch = np.empty(max(_BLOCK_FLOATS, widest), dtype=ELEMENT_DTYPE)
        self._top = np.empty(max_bunch, dtype=ELEMENT_DTYPE)
        self._total = np.empty(max_bunch, dtype=ELEMENT_DTYPE)
        self._rows = np.arange(max_bunch)
        # The logits as one flat array, where a pattern's label entry is one index: a
        # ``take`` there costs a quarter of indexing the 2-D array with (labels, rows).
        self._flat_logits = self._logits.reshape(-1)
        self._picks = np.empty(max_bunch, dtype=np.int64)
        self._ones = np.ones(max(sizes), dtype=ELEMENT_DTYPE)  # column sums as a product
        self._block_cache: dict[tuple[int, int], list[tuple[np.ndarray, ...]]] = {}

    # -- views

    def _views(self, flat: np.ndarray) -> list[np.ndarray]:
        return self._element_views(flat)

    def _blocks(self, layer: int, n: int) -> list[tuple[np.ndarray, ...]]:
        """(delta, stored output, scratch) row blocks of hidden layer ``layer``."""
        blocks = self._block_cache.get((layer, n))
        if blocks is None:
            if len(self._block_cache) > 16:
                self._block_cache.clear()
            width = self.spec.sizes[layer + 1]
            step = max(1, _BLOCK_FLOATS // width)
            blocks = []
            for start in range(0, n, step):
                rows = slice(start, min(start + step, n))
                scratch = self._scratch[: (rows.stop - start) * width].reshape(-1, width)
                blocks.append((self._deltas[layer][rows], self._outputs[layer][rows], scratch))
            self._block_cache[(layer, n)] = blocks
        return blocks

    # -- passes

    def _load(self, x: np.ndarray) -> int:
        """Copy the bunch into the input buffer (scaled by the first layer's ``pre``)."""
        n = int(x.shape[0])
        np.multiply(x, self._scales[0].pre, out=self._inputs[:n, :-1])
        return n

    def _forward(self, views: list[np.ndarray], n: int, labels: np.ndarray) -> tuple[float, int]:
        """Every layer's stored output for the loaded bunch; returns (summed loss, correct)."""
        below = self._inputs[:n]
        for layer, kind in enumerate(self._kinds[:-1]):
            out = self._outputs[layer][:n]
            self._pre_activations(views, layer, below, out)
            if kind == "relu":
                np.maximum(out, 0.0, out=out)
            else:  # tanh, or sigmoid stored as tanh(z / 2)
                np.tanh(out, out=out)
            below = out
        rows = self._logit_rows[:n]
        self._pre_activations(views, len(self._kinds) - 1, below, rows)
        logits = self._logits[:, :n]
        np.copyto(logits, rows.T)
        return self._softmax_scores(logits, labels)

    def _pre_activations(
        self, views: list[np.ndarray], layer: int, below: np.ndarray, out: np.ndarray
    ) -> None:
        """``out`` = pre * z of ``layer``, from ``below``: the stored outputs of the layer
        below, or for the first layer the loaded inputs (their constant column carries the
        bias)."""
        if layer == 0:
            self._matmul(below, views[0], out)  # pre * (x W + b) at once
            return
        n = below.shape[0]
        w = views[2 * layer - 1]
        plain = self._uses_plain(layer, n)
        if plain:
            scales = self._scales[layer]
            below = np.multiply(below, scales.in_mul, out=self._plain[layer - 1][:n])
            below += scales.in_add
        self._matmul(below, w, out)
        self._add_bias(layer, w, views[2 * layer], out, plain)

    def _uses_plain(self, layer: int, n: int) -> bool:
        """Whether ``layer`` multiplies the true activations of the layer below rather than
        the stored ones: for bunches smaller than the layer's width, making them costs
        less than the passes over the weights that using the stored ones needs."""
        return self._scales[layer].in_add != 0.0 and n < self.spec.sizes[layer + 1]

    def _add_bias(
        self, layer: int, w: np.ndarray, b: np.ndarray, out: np.ndarray, plain: bool
    ) -> None:
        """out (= input @ W) becomes pre * z of this layer."""
        scales = self._scales[layer]
        in_mul, in_add = (1.0, 0.0) if plain else (scales.in_mul, scales.in_add)
        if scales.pre * in_mul != 1.0:
            out *= scales.pre * in_mul
        bias = b
        if in_add != 0.0:
            bias = self._biases[layer]
            # ones @ W: a fifth of the time of np.add.reduce(w, axis=0) on 512 x 10 here
            np.matmul(self._ones[: w.shape[0]], w, out=bias)
            bias *= in_add
            bias += b
        if scales.pre != 1.0:
            bias = np.multiply(bias, scales.pre, out=self._biases[layer])
        out += bias

    def _softmax_scores(self, z: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """Logits ``z`` (outputs, bunch) become the softmax probabilities; returns (summed
        loss, correct) of the bunch."""
        n = z.shape[1]
        picks = self._picks[:n]  # the flat index of each pattern's label entry
        np.multiply(labels, self.max_bunch, out=picks)
        picks += self._rows[:n]
        top = self._top[:n]
        np.maximum.reduce(z, axis=0, out=top)
        z -= top
        # The label's logit is the pattern's maximum exactly when it is 0 now (a tie with
        # another class also counts as correct; argmax would pick the first).
        correct = int(np.count_nonzero(self._flat_logits.take(picks) == 0.0))
        np.maximum(z, SOFTMAX_FLOOR, out=z)
        np.exp(z, out=z)
        total = self._total[:n]
        np.add.reduce(z, axis=0, out=total)
        z /= total
        picked = self._flat_logits.take(picks)
        # picked >= e^-30 / outputs (the floor above), so its logarithm is finite.
        loss = float(-np.log(picked, dtype=np.float64).sum())
        return loss, correct

    def _back_into(self, layer: int, n: int, above: np.ndarray, w: np.ndarray) -> None:
        """delta of hidden layer ``layer`` = (above @ w.T) * g(stored output), where g is
        1 - t^2 for sigmoid and tanh (constant factors are in LayerScales.back) and the
        step function for relu. The derivative's passes run over row blocks that stay in
        cache between them (measured: a third faster than whole-array passes here;
        blocking the matrix product too was slower)."""
        self._matmul(above, w.T, self._deltas[layer][:n])
        if self._derivative is not None and n >= _FUSED_DERIVATIVE_FROM:
            self._derivative(self._kinds[layer], self._deltas[layer][:n], self._outputs[layer][:n])
            return
        relu = self._kinds[layer] == "relu"
        for delta, stored, scratch in self._blocks(layer, n):
            if relu:
                np.greater(stored, 0.0, out=scratch)
            else:
                np.square(stored, out=scratch)
                np.subtract(1.0, scratch, out=scratch)
            delta *= scratch

    @quiet_overflow
    def gradient(
        self, weights: np.ndarray, x: np.ndarray, labels: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """Write the summed gradient of the cross-entropy over the bunch into ``out``.

        Returns (summed loss, correctly classified patterns) of the bunch, measured with
        the weights before the update.
        """
        if self._fused is not None:
            return self._fused.gradient(weights, self._fused.load(x), labels, out)
        if x.shape[0] > self.max_bunch:
            raise ValueError(f"bunch of {x.shape[0]} is larger than the {self.max_bunch} prepared")
        views = self._views(weights)
        grads = self._views(out)
        n = self._load(x)
        loss, correct = self._forward(views, n, labels)
        picks = self._picks[:n]  # as _softmax_scores left them
        self._flat_logits.put(picks, self._flat_logits.take(picks) - 1.0)
        delta = self._logits[:, :n].T  # (bunch, outputs), column-major
        for layer in range(len(self._kinds) - 1, 0, -1):
            scales = self._scales[layer]
            plain = self._uses_plain(layer, n)
            below = (self._plain if plain else self._outputs)[layer - 1][:n]
            w, gw, gb = views[2 * layer - 1], grads[2 * layer - 1], grads[2 * layer]
            if layer == len(self._kinds) - 1 and n >= _TRANSPOSED_GRADIENT_FROM:
                self._matmul(delta.T, below, self._last_gradient)
                np.copyto(gw, self._last_gradient.T)
            else:
                self._matmul(below.T, delta, gw)
            np.add.reduce(delta, axis=0, out=gb)
            if not plain:
                # dW = in_mul * (stored.T @ delta) + in_add * (bias gradient)
                if scales.in_mul != 1.0:
                    gw *= scales.in_mul
                if scales.in_add != 0.0:
                    gw += np.multiply(gb, scales.in_add, out=self._biases[layer])
            if scales.back != 1.0:
                delta *= scales.back
            self._back_into(layer - 1, n, delta, w)
            delta = self._deltas[layer - 1][:n]
        self._matmul(self._inputs[:n].T, delta, grads[0])  # weights and bias at once
        return loss, correct

    def gradient_of_frames(
        self, weights: np.ndarray, corpus: Corpus, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """``gradient`` over the patterns centred on ``frames`` of ``corpus``: with the
        kernels and the frames in memory the windows are cut straight into the input
        buffer, with no pattern array in between."""
        labels = corpus.labels_of(frames)
        if self._fused is not None and isinstance(corpus.store, DenseStore):
            frames_held = corpus.store.frames
            starts = corpus.bounds.starts
            n = self._fused.load_windows(frames_held, starts, frames, corpus.context)
            return self._fused.gradient(weights, n, labels, out)
        return self.gradient(weights, corpus.windows(frames), labels, out)

    @quiet_overflow
    def evaluate(self, weights: np.ndarray, x: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """(summed loss, correct) of the weights on all of ``x``, in bunches.

        Always with numpy's passes, whichever step trains: a CV figure is then the same
        from every numpy-backend worker of a run, `snet train` and `snet eval`, whatever
        step each took (client/kernel_choice.py) or could have (a worker without numba);
        a torch worker's products round otherwise. Scoring is
        forward only, a few per cent of an epoch's arithmetic, where the compiled step
        gains least; its buffers are made at the first evaluation."""
        if self._fused is not None:
            if self._scorer is None:
                self._scorer = BunchNetwork(self.spec, self.max_bunch, kernels="numpy")
            return self._scorer.evaluate(weights, x, labels)
        views = self._views(weights)
        loss_total, correct_total = 0.0, 0
        for start in range(0, len(x), self.max_bunch):
            stop = min(start + self.max_bunch, len(x))
            n = self._load(x[start:stop])
            loss, correct = self._forward(views, n, labels[start:stop])
            loss_total += loss
            correct_total += correct
        return loss_total, correct_total
