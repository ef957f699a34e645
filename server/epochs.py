"""``EpochControl``: epoch boundaries, the learning-rate schedule and weight roll-back.

With the fixed list of rates the next epoch starts as soon as the last one is trained,
and its cross-validation runs on one worker while the others train on (async) or wait
for the next round (sync). With **newbob** the next epoch's rate depends on this epoch's
CV error, and an epoch that made CV worse is rolled back, so the server waits at the
epoch boundary for the CV result (no leases are granted meanwhile: every update of the
epoch has been applied, so nothing is in flight), then applies the decision. This is
exactly qnstrn's sequence; the price is one CV pass per epoch during which the workers
idle (0.1 s on the default data). See docs/schedules.md.

This part owns the epoch number, the rate and the schedule's state, and only decides: it
returns what is to happen (an ``EpochDecision``) and the coordinator carries it out
(leases, weights, hooks), so nothing here writes another part's state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.messages import EvalResult
from snet.protocol.numbering import shown_epoch
from snet.protocol.schedule import make_schedule

log = logging.getLogger("snet.server")


@dataclass(frozen=True)
class EpochDecision:
    """What an epoch's CV result means for training."""

    kept: bool  # the epoch's weights stand (newbob may reject them)
    restore: np.ndarray | None = None  # roll the weights back to these
    next_epoch: int | None = None  # start this epoch now (at ``EpochControl.rate``)
    finish: bool = False  # training is over


class EpochControl:
    """Decides when the next epoch starts, at which rate, and when training is over."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.newbob = make_schedule(job)
        self.rate = self.newbob.rate if self.newbob else job.learning_rate(0)
        self.epoch = 0
        self.waiting_for_cv = False
        self.best_weights: np.ndarray | None = None
        self.kept: dict[int, bool] = {}

    def checkpoint_state(self) -> dict[str, Any]:
        """The epoch, the rate in force and the schedule's state (plain data)."""
        newbob = self.newbob.state() if self.newbob is not None else None
        return {
            "epoch": self.epoch,
            "rate": self.rate,
            "waiting_for_cv": self.waiting_for_cv,
            "best_weights": self.best_weights,
            "kept": {str(epoch): kept for epoch, kept in self.kept.items()},
            "newbob": newbob,
        }

    def restore_checkpoint(self, state: dict[str, Any]) -> None:
        """Continue from ``checkpoint_state()``: the same epoch, rate and schedule."""
        self.epoch, self.rate = int(state["epoch"]), float(state["rate"])
        self.waiting_for_cv = bool(state["waiting_for_cv"])
        self.best_weights = state["best_weights"]
        self.kept = {int(epoch): bool(kept) for epoch, kept in state["kept"].items()}
        saved = state["newbob"]
        if (saved is None) != (self.newbob is None):
            raise ValueError("the checkpoint's schedule is not the job's")
        if self.newbob is not None and saved is not None:
            self.newbob.restore(saved)

    def start(self, epoch: int) -> None:
        """``epoch`` begins (the coordinator shuffles and leases its frames)."""
        self.epoch = epoch

    def epoch_trained(self, epoch: int) -> int | None:
        """Every frame of ``epoch`` is applied. Returns the epoch to start now (the fixed
        list of rates goes straight on), or None (newbob waits for the CV result; or it was
        the last epoch)."""
        if self.newbob is not None:
            self.waiting_for_cv = True
            return None
        if epoch + 1 < self.job.epochs:
            self.rate = self.job.learning_rate(epoch + 1)
            return epoch + 1
        return None

    def cv_result(self, epoch: int, weights: np.ndarray, result: EvalResult) -> EpochDecision:
        """An epoch's CV result is in (``weights`` are the ones it scored)."""
        error = 100.0 * (1.0 - result.correct / max(result.frames, 1))
        if self.newbob is None:
            self.kept[epoch] = True
            return EpochDecision(kept=True, finish=len(self.kept) == self.job.epochs)
        decision = self.newbob.after_epoch(error)
        kept = not decision.restore_best
        restore = None
        if kept:
            self.best_weights = weights  # a published snapshot: never written again
        elif self.best_weights is not None:
            log.info("epoch %d made CV worse (%.2f%% error): weights rolled back",
                     shown_epoch(epoch), error)  # fmt: skip
            restore = self.best_weights
        self.kept[epoch] = kept
        self.waiting_for_cv = False
        if decision.next_rate == 0.0:
            log.info("newbob: training stops after epoch %d", shown_epoch(epoch))
            return EpochDecision(kept, restore, finish=True)
        self.rate = decision.next_rate
        return EpochDecision(kept, restore, next_epoch=epoch + 1)
