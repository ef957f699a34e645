"""``LocalTrainer``: a bmuf worker's block of bunches trained on its own copy.

In bmuf mode (server/block_filter.py) a worker starts a block from the weights it was
sent, trains ``block_bunches`` bunches on its own copy with momentum SGD at the job's
rate and momentum (the velocity is the worker's inner optimiser state: it carries over
from block to block, as torchft's LocalSGD and DiLoCo keep theirs), and sends
``patterns x (its weights - the block's start)``: the sum form of an update, so the server
weighs each block by the patterns it covered. A block ends after ``block_bunches``
bunches, after ``block_seconds`` of compute if that is set, or at the end of its lease
(the lease book makes a lease hold whole blocks). Runs in the compute thread.

With ``block_overlap`` the worker does not wait for the filtered weights between blocks
(the exchange is hidden behind compute, as Overlap Local-SGD and streaming DiLoCo hide
theirs): each block after the first starts from its own copy, and its delta is its own
progress over the block. The weights that hold its previous delta move that progress
onto them as soon as they come: ``offer``ed by the event loop, taken at the next bunch's
boundary or the next block's start; or ``rebase`` before the delta is sent, if they come
after the block's end. The copy is then the global weights plus what this worker has not
sent yet, as at a block's start without overlap: a block computes on weights one
exchange old only until that exchange is over.
"""

from __future__ import annotations

import threading
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
        self.overlap = job.block_overlap
        unused = np.empty(0, dtype=self.local.dtype)  # without overlap: never read
        # where the block started, moved with the copy: its progress is local - start
        self.start = layout.allocate() if self.overlap else unused
        # newer weights offered by the event loop for the compute thread to move onto
        self.incoming = layout.allocate() if self.overlap else unused
        self._has_incoming = False
        self._lock = threading.Lock()

    def block(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray, rate: float
    ) -> tuple[float, int, int]:
        """Train on ``frames`` bunch by bunch from ``weights``; ``out`` = patterns x delta.
        Returns (loss sum, correct, patterns used). With overlap every block but a
        connection's first starts from the copy (``weights`` unread), moved first onto
        weights offered since the last block's delta was sent (they hold that delta:
        the copy's start stands for the weights it was sent on plus it), and is
        ``rebase``d before it is sent."""
        if self.overlap:
            with self._lock:
                if self.blocks == 0:  # an offer is no newer than these: dropped
                    np.copyto(self.local, weights)
                    self._has_incoming = False
                np.copyto(self.start, self.local)
                if self._has_incoming:
                    self._move_onto(self.incoming)
            started_from = self.start
        else:
            np.copyto(self.local, weights)
            started_from = weights
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
            if self._has_incoming:  # set by the event loop; taken under the lock
                with self._lock:
                    if self._has_incoming:
                        self._move_onto(self.incoming)
            if self.seconds and time.perf_counter() - started >= self.seconds:
                break
        np.subtract(self.local, started_from, out=out)
        out *= np.float32(used)
        self.blocks += 1
        return loss, correct, used

    def offer(self, weights: np.ndarray) -> None:
        """Overlap, event loop: ``weights`` hold this worker's last sent delta; copied
        (the box reuses its slots), moved onto at the next bunch or block's start."""
        with self._lock:
            np.copyto(self.incoming, weights)
            self._has_incoming = True

    def rebase(self, weights: np.ndarray) -> None:
        """Overlap, between blocks (the compute thread idle: it uses the compute's scratch
        buffer): the copy becomes ``weights`` plus the progress not in them, as its delta
        is about to be sent on them. An offer not yet taken is older than ``weights``:
        dropped."""
        with self._lock:
            self._move_onto(weights)

    def _move_onto(self, weights: np.ndarray) -> None:
        """local += weights - start; start = weights (under the lock)."""
        np.subtract(weights, self.start, out=self.gradient)
        self.local += self.gradient
        np.copyto(self.start, weights)
        self._has_incoming = False
