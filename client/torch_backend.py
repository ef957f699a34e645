"""``TorchBackend``: the numpy backend's arithmetic with PyTorch's matrix products (MKL).

Optional: used when ``torch`` is installed (``pip install 'snet-train[torch]'``) and chosen with
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
from .data import Corpus


class TorchBackend(NumpyBackend):
    """float32 bunch-mode training with torch's CPU matrix products."""

    name = "torch"

    def __init__(self, threads: int = 1) -> None:
        import torch

        super().__init__(kernels="numpy")  # numpy's passes around torch's products
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
