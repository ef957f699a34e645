"""``LocalTrainer``: a bmuf worker's block of bunches trained on its own copy.

In bmuf mode (server/block_filter.py) a worker starts a block from the weights it was
sent, trains ``block_bunches`` bunches on its own copy with momentum SGD at the job's
rate and momentum (the velocity is the worker's inner optimiser state: it carries over
from block to block, as torchft's LocalSGD and DiLoCo keep theirs), and sends
``patterns x (its weights - the block's start)``: the sum form of an update, so the server
weighs each block by the patterns it covered. A block ends after ``block_bunches``
bunches, after ``block_seconds`` of compute if that is set, or at the end of its lease
(the lease book makes a lease hold whole blocks). Runs in the compute thread.
"""

from __future__ import annotations

import time

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout

from .backend import ComputeBackend


class LocalTrainer:
    """Trains a block locally and writes its (pattern-weighted) model delta."""

    def __init__(self, backend: ComputeBackend, layout: ElementLayout, job: JobSpec) -> None:
        self.backend = backend
        self.bunch = job.bunch_size
        self.momentum = np.float32(job.momentum)
        self.seconds = job.block_seconds
        self.local = layout.allocate()
        self.velocity = layout.allocate()
        self.velocity[...] = 0.0
        self.gradient = layout.allocate()
        self.blocks = 0

    def block(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray, rate: float
    ) -> tuple[float, int, int]:
        """Train on ``frames`` bunch by bunch from ``weights``; ``out`` = patterns x delta.
        Returns (loss sum, correct, patterns used)."""
        np.copyto(self.local, weights)
        started = time.perf_counter()
        loss, correct, used = 0.0, 0, 0
        for start in range(0, len(frames), self.bunch):
            part = frames[start : start + self.bunch]
            part_loss, part_correct = self.backend.gradient(self.local, part, self.gradient)
            # v = m v - (rate / patterns) g;  w += v   (the server's rule, done locally)
            self.velocity *= self.momentum
            self.gradient *= np.float32(-rate / len(part))
            self.velocity += self.gradient
            self.local += self.velocity
            loss, correct, used = loss + part_loss, correct + part_correct, used + len(part)
            if self.seconds and time.perf_counter() - started >= self.seconds:
                break
        np.subtract(self.local, weights, out=out)
        out *= np.float32(used)
        self.blocks += 1
        return loss, correct, used
