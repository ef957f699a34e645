"""``BlockFilter``: the server's rule in bmuf mode, block-wise model-update filtering.

BMUF (Chen & Huo, ICASSP 2016): each worker trains a block of bunches on its own copy
with momentum SGD and sends its model delta; the server averages the deltas of a block
into G(t) and filters them with block momentum::

    Δ(t) = η·Δ(t-1) + ζ·G(t),    W(t) = W(t-1) + Δ(t)        (CBM)

With Nesterov block momentum (NBM) the workers start the next block from W(t) + η·Δ(t).
Model averaging (Kaldi's nnet2/3 parallel training) is η = 0, ζ = 1. An outer Nesterov
optimiser on the pseudo-gradient G, as DiLoCo (Douillard et al., 2023) runs it with
PyTorch's SGD (u = μ·u + G, W = W + α·(G + μ·u)), is the same recurrence as NBM with
η = μ and ζ = α whose model *is* the look-ahead point W(t) + η·Δ(t) (by induction on
W(t) + η·Δ(t) - W(t-1) - η·Δ(t-1) = Δ(t) + η·(Δ(t) - Δ(t-1))); so ``nesterov`` is NBM
whose evaluated and saved model is the point the workers start from.

The filter is the momentum update rule with other constants (Δ is its velocity, ζ its
rate with the sign turned), so it runs in the same fused, cache-blocked pass with the
same NaN check. A worker sends ``patterns x (its weights - the block's start)``, the sum
form of a gradient update, so the average over a step's deltas is weighted by the
patterns each covered (the tail of an epoch makes shorter blocks), and with τ = 1, η = 0
and ζ = 1 a synchronous block is exactly a synchronous step of plain SGD. In async
blocks each delta is filtered as it arrives, scaled by 1/N (N: the workers training).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.network import ELEMENT_DTYPE

from .update_rule import UpdateRule

DEFAULT_MOMENTUM = {"average": 0.0, "nesterov": 0.9}  # cbm and nbm: 1 - 1/N
DEFAULT_RATE = {"nesterov": 0.7}  # the others: 1


class BlockFilter:
    """Block momentum over the workers' model deltas; the same interface as ``UpdateRule``."""

    def __init__(self, weights: np.ndarray, job: JobSpec, lanes: int = 2) -> None:
        self.job = job  # the workers' blocks (length, overlap) are shown in /status
        self.kind = job.block_filter
        self.sync = job.block_sync
        self._momentum = job.block_momentum  # negative: the filter's default
        self.rate = job.block_lr if job.block_lr > 0 else DEFAULT_RATE.get(self.kind, 1.0)
        self.lookahead = self.kind in ("nbm", "nesterov")
        self.inner = UpdateRule(weights, 0.0, lanes)
        self.workers = 1  # async: N, the workers training (set by the coordinator)
        self.snapshot: np.ndarray = self.inner.weights  # what the workers start from
        self.model: np.ndarray = self.inner.weights  # what is evaluated and saved
        self._pending_model = self.model
        self.blocks = 0
        # η of the last step, for /status (before the first: what the filter's settings
        # give one worker; a checkpoint keeps it)
        self.last_momentum = self.momentum(self.workers)
        # |Δ| of the published step (a 2 MB dot product per /status read on the event
        # loop otherwise, twice a second for every open dashboard)
        self.delta_norm = self._pending_norm = 0.0

    @property
    def weights(self) -> np.ndarray:
        return self.inner.weights

    def momentum(self, workers: int) -> float:
        """η for a step over ``workers`` workers' blocks. The paper's 1 - 1/N is for
        synchronous blocks; asynchronous ones default to 0 for cbm and nbm: N workers'
        deltas applied one by one on weights they did not start from already carry about
        that much momentum of their own (Mitliagkas et al., "Asynchrony begets momentum",
        2016), and 1 - 1/N on top ended 2 workers' 10 epochs at 88.8 % CV, 0 at 91.9 %.
        So do overlapping blocks, partly computed on the weights before the last step: with
        1 - 1/N, 2 workers on Fashion-MNIST ended anywhere from 73.8 to 88.6 % CV."""
        if self._momentum >= 0:
            return self._momentum
        if (not self.sync or self.job.block_overlap) and self.kind in ("cbm", "nbm"):
            return 0.0
        return DEFAULT_MOMENTUM.get(self.kind, 1.0 - 1.0 / max(workers, 1))

    def set_workers(self, workers: int) -> None:
        self.workers = max(workers, 1)

    def steps(
        self,
        groups: Sequence[Sequence[np.ndarray]],
        patterns: Sequence[int],
        learning_rate: float,
        direct: Sequence[Sequence[np.ndarray]] | None = None,
    ) -> np.ndarray | None:
        """Filter consecutive blocks, one per group of deltas (``learning_rate``, the
        job's rate, is the workers' business). Returns what the workers start from next,
        or None, changing nothing, when a delta holds NaN or Inf."""
        merged = [
            [*group, *(direct[i] if direct else ())] for i, group in enumerate(groups)
        ]  # a worker's own momentum means nothing here: every delta is a delta
        workers = len(merged[0]) if self.sync else self.workers
        eta = self.momentum(workers)
        self.inner.use_momentum(eta)
        self.last_momentum = eta
        scale = self.rate if self.sync else self.rate / self.workers
        weights = self.inner.steps(merged, patterns, -scale)  # v = η v + ζ G; w += v
        if weights is None:
            return None
        self.blocks += len(groups)
        self._pending_model = weights
        velocity = self.inner.velocity  # |Δ| for /status, here in the step thread
        self._pending_norm = float(np.sqrt(np.dot(velocity, velocity)))
        if not self.lookahead:
            return weights
        ahead: np.ndarray = weights + np.float32(eta) * self.inner.velocity
        ahead.flags.writeable = False
        if self.kind == "nesterov":
            self._pending_model = ahead
        return ahead

    def publish(self, snapshot: np.ndarray) -> None:
        """The step's result goes out with its version (on the event loop)."""
        self.snapshot, self.model = snapshot, self._pending_model
        self.delta_norm = self._pending_norm

    def load(self, weights: np.ndarray) -> None:
        """Replace the weights (a newbob roll-back, or continuing training); Δ is reset."""
        self.inner.load(weights)
        self.snapshot = self.model = self._pending_model = self.inner.weights
        self.delta_norm = self._pending_norm = 0.0

    def checkpoint_state(self) -> dict[str, Any]:
        """The filter's weights and Δ (``inner``'s), what the workers start from and the
        model saved (both derived from them with a momentum that depends on the workers,
        so saved as they are), and the blocks counted; only between steps."""
        return {**self.inner.checkpoint_state(), "snapshot": self.snapshot,
                "model": self.model, "blocks": self.blocks,
                "block_momentum": self.last_momentum}  # fmt: skip

    def restore_checkpoint(self, state: dict[str, Any]) -> None:
        """Continue from ``checkpoint_state()``: the same Δ, snapshot and model."""
        self.inner.restore_checkpoint(state)
        arrays = []
        for name in ("snapshot", "model"):
            array = np.array(state[name], dtype=ELEMENT_DTYPE)
            if array.shape != self.inner.weights.shape:
                raise ValueError(f"{name} of shape {array.shape}, need {self.inner.weights.shape}")
            array.flags.writeable = False
            arrays.append(array)
        self.snapshot, self.model = arrays
        self._pending_model = self.model
        self.blocks = int(state["blocks"])
        # checkpoints before session 20 lack it: the settings' value until the next step
        self.last_momentum = float(state.get("block_momentum", self.last_momentum))
        velocity = self.inner.velocity
        self.delta_norm = self._pending_norm = float(np.sqrt(np.dot(velocity, velocity)))

    def figures(self) -> dict[str, float | int | str]:
        """For /status: the filter, its constants and the norm of Δ."""
        return {
            "filter": self.kind,
            "sync": int(self.sync),
            "overlap": int(self.job.block_overlap),
            "block_bunches": self.job.block_bunches,  # tau (a block of seconds: block_seconds)
            "block_seconds": self.job.block_seconds,
            "blocks": self.blocks,
            "block_momentum": round(self.last_momentum, 6),  # as last applied
            "block_lr": self.rate,
            "delta_norm": round(self.delta_norm, 6),
        }
