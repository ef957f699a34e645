"""Sequential training in one process, without a server: the reference the parallel modes
are measured against (``snet train``, bench/convergence.py).

It uses the very pieces the service uses: the worker's ``BunchNetwork`` for the gradients,
the job's schedule and hooks, and, passed in by the caller because the client never
imports the server, the server's ``UpdateRule`` for the step (any ``StepRule``) and the
frame order its ``LeaseBook`` leases to a lone worker (any ``ChunkOrder``: the same
epochs, chunks and cache shuffle). ``snet.cli.offline.train_job`` puts them together.
Only the network between them is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from snet.data.corpus import Corpus
from snet.protocol.errors import DIVERGED_AFTER, TrainingDiverged
from snet.protocol.heap import settle
from snet.protocol.hooks import BunchEvent, EpochEvent, HookSet, RunInfo
from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout
from snet.protocol.numbering import shown_epoch
from snet.protocol.schedule import make_schedule

from .kernel_choice import job_kernels
from .network import MIN_ROWS, BunchNetwork


class StepRule(Protocol):
    """The update rule as the trainer uses it (the server's ``UpdateRule`` is one)."""

    @property
    def weights(self) -> np.ndarray: ...

    def step(
        self, gradients: Sequence[np.ndarray], patterns: int, learning_rate: float
    ) -> np.ndarray | None: ...

    def load(self, weights: np.ndarray) -> None: ...


ChunkOrder = Callable[[int], Iterable[np.ndarray]]
"""Epoch (0-based) -> the training frames of that epoch, chunk by chunk, in lease order."""


@dataclass
class SequentialResult:
    """Per-epoch figures and the final weights of a sequential run."""

    weights: np.ndarray
    epochs: list[dict[str, float | int | bool]] = field(default_factory=list)


def train_sequential(
    job: JobSpec,
    corpus: Corpus,
    rule: StepRule,
    chunks: ChunkOrder,
    hooks: HookSet | None = None,
    progress: Callable[[dict[str, float | int | bool]], None] | None = None,
) -> SequentialResult:
    """Train ``job`` with one bunch of ``bunch_size`` patterns per step, epoch by epoch,
    starting from ``rule``'s weights and taking each epoch's frames from ``chunks``."""
    hooks = hooks or HookSet([])
    spec = job.network
    kernels = job_kernels("auto", job, len(corpus.train_frames))  # as a worker's backend
    network = BunchNetwork(spec, max(job.bunch_size, MIN_ROWS), kernels=kernels)
    gradient = ElementLayout.for_network(spec).allocate()
    cv_x, cv_labels = corpus.windows(corpus.cv_frames), corpus.labels_of(corpus.cv_frames)
    newbob = make_schedule(job)
    rate = newbob.rate if newbob else job.learning_rate(0)
    best = rule.weights.copy()
    result = SequentialResult(rule.weights)
    hooks.call(
        "before_training",
        RunInfo(
            spec.describe(), spec.connections, "sequential", job.epochs, len(corpus.train_frames)
        ),
    )
    version = refused = 0
    settle()  # the data and the compiled step, out of the collector's sight (protocol/heap.py)
    for epoch in range(job.epochs):
        hooks.call("before_epoch", epoch, rate)
        patterns = correct = 0
        for chunk in chunks(epoch):
            for offset in range(0, len(chunk), job.bunch_size):
                frames = chunk[offset : offset + job.bunch_size]
                loss, right = network.gradient_of_frames(rule.weights, corpus, frames, gradient)
                refused = refused + 1 if rule.step([gradient], len(frames), rate) is None else 0
                if refused >= DIVERGED_AFTER:
                    raise TrainingDiverged(
                        f"training diverged in epoch {shown_epoch(epoch)}: the gradients of the "
                        f"last {refused} bunches were not finite (loss {loss:g}), so no step "
                        "could be taken; a lower learning rate may train"
                    )
                version += 1
                patterns, correct = patterns + len(frames), correct + right
                hooks.call(
                    "after_bunch", BunchEvent(epoch, version, 1, len(frames), right, loss, rate)
                )
        cv_loss, cv_correct = network.evaluate(rule.weights, cv_x, cv_labels)
        kept, next_rate = True, job.learning_rate(epoch + 1)
        if newbob is not None:
            decision = newbob.after_epoch(100.0 * (1 - cv_correct / len(cv_labels)))
            kept, next_rate = not decision.restore_best, decision.next_rate
            if kept:
                best = rule.weights.copy()
            else:
                rule.load(best)
        hooks.call(
            "after_epoch",
            EpochEvent(epoch, rate, patterns, correct, len(cv_labels), cv_correct, cv_loss, kept),
        )
        row: dict[str, float | int | bool] = {
            "epoch": epoch,
            "learning_rate": rate,
            "train_accuracy": correct / max(patterns, 1),
            "cv_accuracy": cv_correct / len(cv_labels),
            "kept": kept,
        }
        result.epochs.append(row)
        if progress is not None:
            progress(row)
        if newbob is not None and next_rate == 0.0:
            break
        rate = next_rate
    hooks.call("after_training")
    result.weights = rule.weights.copy()
    return result
