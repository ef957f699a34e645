"""Bunch-mode forward and backward passes of a fully connected classifier, in float32.

All work buffers are preallocated for the largest bunch and reused; the weight gradient
is written straight into the caller's update element. Gradients are *sums* over the
bunch (the server divides by the pattern count), and nothing is propagated back into the
inputs, which need no gradient.

Denormal numbers make float32 arithmetic up to 200x slower on x86. The compute thread
flushes them to zero (protocol/fpu.py), and values are also kept out of that range, for
BLAS threads the switch does not reach: sigmoid is computed through tanh, whose outputs
are 0 or at least 3e-8, and softmax exponents are clipped to >= -30 (a probability floor
of 9e-14, so that tiny output deltas times saturated-unit derivatives stay normal floats).
"""

from __future__ import annotations

import numpy as np

from snet.protocol.network import ELEMENT_DTYPE, ElementLayout, NetworkSpec

_SOFTMAX_FLOOR = -30.0


class BunchNetwork:
    """Computes summed gradients and scores for one network shape with reused buffers."""

    def __init__(self, spec: NetworkSpec, max_bunch: int) -> None:
        self.spec = spec
        self.layout = ElementLayout.for_network(spec)
        self.max_bunch = max_bunch
        sizes = spec.sizes
        # activations[l] is the output of layer l (l = 0 is the input, not stored here)
        self._acts = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        self._deltas = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        self._scratch = [np.empty((max_bunch, n), dtype=ELEMENT_DTYPE) for n in sizes[1:]]
        self._view_cache: dict[tuple[int, int], list[np.ndarray]] = {}
        self._rows = np.arange(max_bunch)

    # -- passes

    def _views(self, flat: np.ndarray) -> list[np.ndarray]:
        """Per-layer views of an element, cached per buffer: workers reuse a few buffers,
        and building views costs more than a small bunch's arithmetic."""
        key = (flat.__array_interface__["data"][0], flat.size)
        views = self._view_cache.get(key)
        # The cached views keep their buffer alive, so an address cannot be reused by
        # another buffer while its entry exists: address and size identify the memory.
        if views is None:
            if len(self._view_cache) > 16:
                self._view_cache.clear()
            views = self._view_cache[key] = self.layout.views(flat)
        return views

    def _forward(self, weights: np.ndarray, x: np.ndarray) -> list[np.ndarray]:
        """Activations of every layer for the bunch ``x``; the last is the softmax output."""
        views = self._views(weights)
        n = x.shape[0]
        outputs: list[np.ndarray] = []
        current = x
        last = len(views) // 2 - 1
        for layer in range(last + 1):
            w, b = views[2 * layer], views[2 * layer + 1]
            out = self._acts[layer][:n]
            np.matmul(current, w, out=out)
            out += b
            if layer == last:
                out -= out.max(axis=1, keepdims=True)
                np.maximum(out, _SOFTMAX_FLOOR, out=out)
                np.exp(out, out=out)
                out /= out.sum(axis=1, keepdims=True)
            else:
                self._activate(self.spec.activations[layer], out)
            outputs.append(out)
            current = out
        return outputs

    @staticmethod
    def _activate(kind: str, z: np.ndarray) -> None:
        if kind == "relu":
            np.maximum(z, 0.0, out=z)
        elif kind == "tanh":
            np.tanh(z, out=z)  # saturates at +-1: no overflow, no denormals
        else:
            # sigmoid(z) = (1 + tanh(z / 2)) / 2: numpy's tanh is vectorised and this is
            # 40% faster here than 1 / (1 + e^-z); it never overflows, and its outputs are
            # 0 or at least 3e-8, never denormal.
            z *= 0.5
            np.tanh(z, out=z)
            z *= 0.5
            z += 0.5

    @staticmethod
    def _derivative_times(kind: str, h: np.ndarray, delta: np.ndarray, scratch: np.ndarray) -> None:
        """delta *= f'(z), expressed through the unit's output h (no temporaries)."""
        if kind == "relu":
            np.greater(h, 0.0, out=scratch)
        elif kind == "tanh":
            np.multiply(h, h, out=scratch)
            np.subtract(1.0, scratch, out=scratch)
        else:
            np.subtract(1.0, h, out=scratch)
            scratch *= h
        delta *= scratch

    def _score(self, probs: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        rows = self._rows[: len(labels)]
        picked = probs[rows, labels]
        loss = float(-np.log(np.maximum(picked, 1e-30), dtype=np.float64).sum())
        correct = int((probs.argmax(axis=1) == labels).sum())
        return loss, correct

    def gradient(
        self, weights: np.ndarray, x: np.ndarray, labels: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """Write the summed gradient of the cross-entropy over the bunch into ``out``.

        Returns (summed loss, correctly classified patterns) of the bunch, measured with
        the weights before the update.
        """
        n = x.shape[0]
        if n > self.max_bunch:
            raise ValueError(f"bunch of {n} is larger than the {self.max_bunch} prepared")
        views = self._views(weights)
        grads = self._views(out)
        acts = self._forward(weights, x)
        loss, correct = self._score(acts[-1], labels)
        delta = self._deltas[-1][:n]
        np.copyto(delta, acts[-1])
        delta[self._rows[:n], labels] -= 1.0
        for layer in range(len(acts) - 1, -1, -1):
            below = x if layer == 0 else acts[layer - 1]
            np.matmul(below.T, delta, out=grads[2 * layer])
            np.sum(delta, axis=0, out=grads[2 * layer + 1])
            if layer > 0:
                back = self._deltas[layer - 1][:n]
                np.matmul(delta, views[2 * layer].T, out=back)
                scratch = self._scratch[layer - 1][:n]
                self._derivative_times(
                    self.spec.activations[layer - 1], acts[layer - 1], back, scratch
                )
                delta = back
        return loss, correct

    def evaluate(self, weights: np.ndarray, x: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """(summed loss, correct) of the weights on all of ``x``, in bunches."""
        loss_total, correct_total = 0.0, 0
        for start in range(0, len(x), self.max_bunch):
            stop = min(start + self.max_bunch, len(x))
            acts = self._forward(weights, x[start:stop])
            loss, correct = self._score(acts[-1], labels[start:stop])
            loss_total += loss
            correct_total += correct
        return loss_total, correct_total
