"""Sequential training in one process, without a server: the reference the parallel modes
are measured against (``snet train``, bench/convergence.py).

It uses the very pieces the service uses: the server's ``LeaseBook`` for the frame order
(the same epochs, chunks and cache shuffle a one-worker server run would lease), the
worker's ``BunchNetwork`` for the gradients, the server's ``UpdateRule`` for the step,
the same schedules and the same hooks. Only the network between them is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from snet.client.network import BunchNetwork
from snet.data.corpus import load_corpus
from snet.protocol.hooks import BunchEvent, EpochEvent, HookSet, RunInfo
from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout, initial_weights
from snet.protocol.schedule import make_schedule
from snet.server.leases import LeaseBook
from snet.server.update_rule import UpdateRule


@dataclass
class SequentialResult:
    """Per-epoch figures and the final weights of a sequential run."""

    weights: np.ndarray
    epochs: list[dict[str, float | int | bool]] = field(default_factory=list)


def train_sequential(
    job: JobSpec,
    hooks: HookSet | None = None,
    weights: np.ndarray | None = None,
    progress: Callable[[dict[str, float | int | bool]], None] | None = None,
) -> SequentialResult:
    """Train ``job`` with one bunch of ``bunch_size`` patterns per step, epoch by epoch."""
    hooks = hooks or HookSet([])
    spec = job.network
    corpus = load_corpus(job.data, spec.output_size, spec.input_size)
    network = BunchNetwork(spec, max(job.bunch_size, 1024))
    rule = UpdateRule(initial_weights(spec, job.seed) if weights is None else weights, job.momentum)
    gradient = ElementLayout.for_network(spec).allocate()
    book = LeaseBook(
        corpus.train_frames,
        corpus.bounds.total_frames,
        job.chunk_frames,
        job.seed,
        cache_frames=job.bunch_size * job.shuffle_cache_bunches,
        sequential=job.frame_order == "sequential",
    )
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
    version = 0
    for epoch in range(job.epochs):
        hooks.call("before_epoch", epoch, rate)
        book.start_epoch(epoch)
        patterns = correct = 0
        while (lease := book.grant(0)) is not None:
            for offset in range(0, len(lease.indices), job.bunch_size):
                frames = lease.indices[offset : offset + job.bunch_size]
                x = corpus.windows(frames)
                loss, right = network.gradient(rule.weights, x, corpus.labels_of(frames), gradient)
                rule.step([gradient], len(frames), rate)
                book.record_applied(book.accept(0, lease.lease_id, offset, len(frames)))
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
