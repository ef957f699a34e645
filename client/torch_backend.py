"""``TorchBackend``: the same bunch arithmetic as ``BunchNetwork``, on PyTorch's CPU kernels.

Optional: used when ``torch`` is installed (``pip install 'snet[torch]'``) and chosen with
``--backend torch`` (or ``auto``, the default, which prefers it when importable). It is a
hand-written step, not autograd: every buffer is preallocated, the weights and the update
element are numpy arrays shared with torch without copies (``torch.from_numpy``), and
nothing is propagated back into the inputs. Results equal the numpy backend's to float32
rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout

from .data import Corpus

_SOFTMAX_FLOOR = -30.0


class TorchBackend:
    """float32 bunch-mode training with torch's CPU kernels (MKL where available)."""

    name = "torch"

    def __init__(self, threads: int = 1) -> None:
        import torch

        self.torch = torch
        self.threads = threads
        self._corpus: Corpus | None = None

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        torch = self.torch
        torch.set_num_threads(self.threads)
        torch.set_flush_denormal(True)
        self._corpus = corpus
        self._spec = job.network
        self._layout = ElementLayout.for_network(job.network)
        self._max = max(job.bunch_size, 1024)
        sizes = job.network.sizes
        self._acts = [torch.empty(self._max, n) for n in sizes[1:]]
        self._deltas = [torch.empty(self._max, n) for n in sizes[1:]]
        self._scratch = [torch.empty(self._max, n) for n in sizes[1:]]
        self._x = np.empty((self._max, corpus.pattern_size), dtype=np.float32)
        aten = torch.ops.aten
        self._backward = {
            "sigmoid": lambda g, h, out: aten.sigmoid_backward.grad_input(g, h, grad_input=out),
            "tanh": lambda g, h, out: aten.tanh_backward.grad_input(g, h, grad_input=out),
            "relu": lambda g, h, out: aten.threshold_backward.grad_input(g, h, 0.0, grad_input=out),
        }
        self._cv_x: np.ndarray | None = None  # cut at the first evaluation (inline frames)

    def _views(self, flat: np.ndarray) -> list[Any]:
        return [self.torch.from_numpy(v) for v in self._layout.views(flat)]

    def _forward(self, weights: list[Any], x: Any) -> list[Any]:
        torch = self.torch
        n = x.shape[0]
        outputs = []
        current = x
        last = len(weights) // 2 - 1
        for layer in range(last + 1):
            out = self._acts[layer][:n]
            torch.addmm(weights[2 * layer + 1], current, weights[2 * layer], out=out)
            if layer == last:
                out.sub_(out.max(dim=1, keepdim=True).values)
                out.clamp_(min=_SOFTMAX_FLOOR).exp_()
                out.div_(out.sum(dim=1, keepdim=True))
            else:
                # No clipping needed: torch's kernels saturate without overflow, and
                # flush-to-zero (set in prepare) keeps denormals out.
                kind = self._spec.activations[layer]
                if kind == "relu":
                    out.relu_()
                elif kind == "tanh":
                    out.tanh_()
                else:
                    out.sigmoid_()
            outputs.append(out)
            current = out
        return outputs

    def _score(self, probs: Any, labels: Any) -> tuple[float, int]:
        torch = self.torch
        rows = torch.arange(len(labels))
        picked = probs[rows, labels].clamp(min=1e-30)
        loss = float(-torch.log(picked.double()).sum())
        correct = int((probs.argmax(dim=1) == labels).sum())
        return loss, correct

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        assert self._corpus is not None
        torch = self.torch
        n = len(frames)
        x = torch.from_numpy(self._corpus.windows(frames, out=self._x[:n]))
        labels = torch.from_numpy(self._corpus.labels_of(frames))
        views, grads = self._views(weights), self._views(out)
        acts = self._forward(views, x)
        loss, correct = self._score(acts[-1], labels)
        delta = self._deltas[-1][:n]
        delta.copy_(acts[-1])
        delta[torch.arange(n), labels] -= 1.0
        for layer in range(len(acts) - 1, -1, -1):
            below = x if layer == 0 else acts[layer - 1]
            torch.mm(below.t(), delta, out=grads[2 * layer])
            torch.sum(delta, dim=0, out=grads[2 * layer + 1])
            if layer > 0:
                back = self._deltas[layer - 1][:n]
                slope = self._scratch[layer - 1][:n]
                torch.mm(delta, views[2 * layer].t(), out=slope)
                # One fused pass: back = slope * f'(z), f' expressed through the output h.
                self._backward[self._spec.activations[layer - 1]](slope, acts[layer - 1], back)
                delta = back
        return loss, correct

    def evaluate(self, weights: np.ndarray) -> tuple[int, int, float]:
        assert self._corpus is not None
        torch = self.torch
        if self._cv_x is None:
            self._cv_x = self._corpus.windows(self._corpus.cv_frames)
        labels_all = self._corpus.labels_of(self._corpus.cv_frames)
        views = self._views(weights)
        loss_total, correct_total = 0.0, 0
        for start in range(0, len(labels_all), self._max):
            stop = min(start + self._max, len(labels_all))
            acts = self._forward(views, torch.from_numpy(self._cv_x[start:stop]))
            loss, correct = self._score(acts[-1], torch.from_numpy(labels_all[start:stop]))
            loss_total += loss
            correct_total += correct
        return len(labels_all), correct_total, loss_total

    def report(self) -> dict[str, Any] | None:
        return None
