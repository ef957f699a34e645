"""``TorchBackend``: the numpy backend's arithmetic with PyTorch's matrix products (MKL).

Optional: used when ``torch`` is installed (``pip install 'snet[torch]'``) and chosen with
``--backend torch`` (or ``auto``, the default, which prefers it when importable). The
matrix products are nearly all of a step's work, and MKL's were the fastest measured here
(docs/benchmarks.md), and so is its fused ``tanh_backward`` (one pass over the hidden
deltas where numpy needs three). Everything else is ``BunchNetwork``'s numpy code: its
``tanh`` pass measured faster than torch's, and its calls cost a third of torch's per-call
overhead, which dominates small bunches. Torch works on the very same memory:
``torch.from_numpy`` shares the numpy buffers, and results are written in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from snet.protocol.job import JobSpec

from .backend import NumpyBackend
from .data import Corpus, DenseStore


class TorchBackend(NumpyBackend):
    """float32 bunch-mode training with torch's CPU matrix products."""

    name = "torch"

    def __init__(self, threads: int = 1) -> None:
        import torch

        super().__init__()
        self.torch = torch
        self.threads = threads
        share, product = torch.from_numpy, torch.mm
        tanh_backward = torch.ops.aten.tanh_backward.grad_input
        relu_backward = torch.ops.aten.threshold_backward.grad_input

        def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Any:
            return product(share(a), share(b), out=share(out))

        def derivative(kind: str, delta: np.ndarray, stored: np.ndarray) -> Any:
            # One fused pass (delta * (1 - stored^2), or delta where stored > 0), in place.
            grad = share(delta)
            if kind == "relu":
                return relu_backward(grad, share(stored), 0.0, grad_input=grad)
            return tanh_backward(grad, share(stored), grad_input=grad)

        self.matmul = matmul
        self.derivative = derivative

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        self.torch.set_num_threads(self.threads)
        self.torch.set_flush_denormal(True)
        super().prepare(job, corpus)
        self._runs = self._window_runs(corpus)

    def _window_runs(self, corpus: Corpus) -> Any:
        """For frames held in memory: a tensor whose row r is the window of frame
        r + context (a strided view, no copy), or None."""
        if not isinstance(corpus.store, DenseStore):
            return None
        frames = corpus.store.frames
        if frames.dtype != np.float32 or not frames.flags.c_contiguous:
            return None
        count, features = frames.shape
        width = 2 * corpus.context + 1
        runs = np.lib.stride_tricks.as_strided(
            frames, shape=(max(count - width + 1, 0), width * features), strides=frames.strides
        )
        return self.torch.from_numpy(runs) if len(runs) else None

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """As ``NumpyBackend.gradient``, with the windows copied straight into the
        network's input rows: a window inside its utterance is one row of the strided
        view, and ``index_select`` copies those rows in one pass (three times faster
        here than cutting windows and copying them)."""
        assert self._corpus is not None and self._network is not None
        corpus, network, n = self._corpus, self._network, len(frames)
        rows = network.input_rows(n)
        if self._runs is None:
            np.multiply(corpus.windows(frames), network.input_scale, out=rows)
        else:
            share = self.torch.from_numpy
            first = np.clip(frames.astype(np.int64) - corpus.context, 0, len(self._runs) - 1)
            target = share(rows)
            self.torch.index_select(self._runs, 0, share(first), out=target)
            target.mul_(network.input_scale)
            edges = ~corpus.bounds.inside(frames, corpus.context)
            if edges.any():
                rows[edges] = corpus.windows(frames[edges]) * network.input_scale
        return network.gradient_of_loaded(weights, n, corpus.labels_of(frames), out)
