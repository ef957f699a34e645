"""``EpochControl``: epoch boundaries, the learning-rate schedule and weight roll-back.

With the fixed list of rates the next epoch starts as soon as the last one is trained,
and its cross-validation runs on one worker while the others train on (async) or wait
for the next round (sync). With **newbob** the next epoch's rate depends on this epoch's
CV error, and an epoch that made CV worse is rolled back, so the server waits at the
epoch boundary for the CV result (no leases are granted meanwhile: every update of the
epoch has been applied, so nothing is in flight), then applies the decision. This is
exactly qnstrn's sequence; the price is one CV pass per epoch during which the workers
idle (0.1 s on the default data). See docs/schedules.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from snet.protocol.hooks import EpochEvent
from snet.protocol.messages import EvalResult
from snet.protocol.schedule import make_schedule

if TYPE_CHECKING:
    from .training import Coordinator

log = logging.getLogger("snet.server")


class EpochControl:
    """Decides when the next epoch starts, at which rate, and when training is over."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.job = coordinator.job
        self.newbob = make_schedule(self.job)
        self.rate = self.newbob.rate if self.newbob else self.job.learning_rate(0)
        self.waiting_for_cv = False
        self.best_weights: np.ndarray | None = None
        self.kept: dict[int, bool] = {}

    def begin(self, epoch: int) -> None:
        self.start_epoch(epoch)

    def epoch_trained(self, epoch: int) -> None:
        """Every frame of ``epoch`` is applied; its CV evaluation is being assigned."""
        if self.newbob is not None:
            self.waiting_for_cv = True
        elif epoch + 1 < self.job.epochs:
            self.rate = self.job.learning_rate(epoch + 1)
            self.start_epoch(epoch + 1)

    def cv_result(self, epoch: int, weights: np.ndarray, result: EvalResult) -> None:
        """An epoch's CV result is in: apply the schedule, maybe finish."""
        coordinator = self.coordinator
        error = 100.0 * (1.0 - result.correct / max(result.frames, 1))
        kept = True
        next_rate = 0.0
        if self.newbob is not None:
            decision = self.newbob.after_epoch(error)
            kept = not decision.restore_best
            if kept:
                self.best_weights = weights  # a published snapshot: never written again
            elif self.best_weights is not None:
                log.info("epoch %d made CV worse (%.2f%% error): weights rolled back", epoch, error)
                self.restore_weights(self.best_weights)
            next_rate = decision.next_rate
        self.kept[epoch] = kept
        record = coordinator.stats.record_of(epoch)
        record.kept = kept
        coordinator.hooks.call(
            "after_epoch",
            EpochEvent(
                epoch,
                record.learning_rate,
                record.train_patterns,
                record.train_correct,
                result.frames,
                result.correct,
                result.loss_sum,
                kept,
            ),
        )
        if self.newbob is not None:
            self.waiting_for_cv = False
            if next_rate == 0.0:
                log.info("newbob: training stops after epoch %d", epoch)
                self.finish()
            else:
                self.rate = next_rate
                self.start_epoch(epoch + 1)
        elif len(self.kept) == self.job.epochs:
            self.finish()

    def start_epoch(self, epoch: int) -> None:
        """Shuffle and lease the frames of ``epoch``."""
        coordinator = self.coordinator
        coordinator.epoch = epoch
        coordinator.book.start_epoch(epoch)
        coordinator.stats.start_epoch(epoch, self.rate)
        coordinator.hooks.call("before_epoch", epoch, self.rate)
        if coordinator.sessions:
            coordinator.fill_leases()

    def restore_weights(self, weights: np.ndarray) -> None:
        """Roll back to earlier weights: a new version, sent to every worker."""
        coordinator = self.coordinator
        coordinator.rule.load(weights)
        coordinator.version += 1
        for session in coordinator.sessions.values():
            coordinator.send_weights(session)

    def finish(self) -> None:
        """Every epoch trained and cross-validated (or the schedule stopped)."""
        coordinator = self.coordinator
        coordinator.hooks.call("after_training")
        coordinator.finished.set()
        if coordinator.on_finished is not None:
            coordinator.on_finished()
