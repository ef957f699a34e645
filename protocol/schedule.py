"""Learning-rate schedules, applied by the server after each epoch's cross-validation.

- the fixed list (``JobSpec.learning_rate``): ``learning_rates[epoch]``, the last one
  repeated; it never stops early and never rolls back.
- ``NewbobSchedule``: Quicknet's qnstrn "newbob" (QN_RateSchedule_NewBoB). Errors are CV
  frame error percentages; the best error so far starts at 100. After each epoch, with
  ``gain = best error so far - this epoch's error``:

  * not yet ramping: if ``gain < ramp`` start ramping and multiply the rate by ``scale``;
  * ramping: if ``gain < stop`` stop training, else multiply the rate by ``scale``;
  * after ``max_epochs`` epochs stop anyway.

  And as qnstrn's trainer does: the weights of an epoch whose CV error is worse than the
  last kept epoch's are not kept; training goes on from the best weights so far.

The schedule is pure arithmetic; the server (``server/epochs.py``) and the sequential
trainer call ``after_epoch`` with each CV error and apply the ``Decision``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .job import JobSpec


@dataclass(frozen=True)
class Decision:
    """What to do after an epoch: the next rate (0: stop) and whether to roll back."""

    next_rate: float
    restore_best: bool

    @property
    def stop(self) -> bool:
        return self.next_rate == 0.0


class NewbobSchedule:
    """Quicknet's newbob rule with qnstrn's roll-back of epochs that made CV worse."""

    def __init__(
        self, initial_rate: float, scale: float, ramp: float, stop: float, max_epochs: int
    ) -> None:
        self.rate = initial_rate
        self.scale = scale
        self.ramp = ramp
        self.stop = stop
        self.max_epochs = max_epochs
        self.ramping = False
        self.lowest_error = 100.0  # qnstrn's "initial error": nothing is worse
        self.kept_error = 100.0  # CV error of the weights kept last
        self.epoch = 0

    def state(self) -> dict[str, Any]:
        """What it has learnt so far, as plain data (a checkpoint's)."""
        names = ("rate", "ramping", "epoch", "lowest_error", "kept_error")
        return {name: getattr(self, name) for name in names}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state()``."""
        self.rate, self.ramping = float(state["rate"]), bool(state["ramping"])
        self.epoch = int(state["epoch"])
        self.lowest_error = float(state["lowest_error"])
        self.kept_error = float(state["kept_error"])

    def after_epoch(self, cv_error: float) -> Decision:
        """``cv_error`` in percent (100 - CV frame accuracy in percent)."""
        restore = cv_error > self.kept_error
        if not restore:
            self.kept_error = cv_error
        self.epoch += 1
        if self.epoch >= self.max_epochs:
            self.rate = 0.0
            return Decision(0.0, restore)
        gain = self.lowest_error - cv_error
        self.lowest_error = min(self.lowest_error, cv_error)
        if self.ramping:
            self.rate = 0.0 if gain < self.stop else self.rate * self.scale
        elif gain < self.ramp:
            self.ramping = True
            self.rate *= self.scale
        return Decision(self.rate, restore)


def make_schedule(job: JobSpec) -> NewbobSchedule | None:
    """The job's newbob schedule, or None for the fixed list."""
    if job.schedule != "newbob":
        return None
    return NewbobSchedule(
        job.learning_rates[0], job.newbob_scale, job.newbob_ramp, job.newbob_stop, job.epochs
    )


def stopped_early(job: JobSpec, epochs_trained: int) -> str:
    """The line that says newbob ended a trained run before its ``job.epochs`` ("" when it
    did not): it showed 7 epochs of 20 and the weights, and no word why."""
    if job.schedule != "newbob" or epochs_trained >= job.epochs:
        return ""
    return (f"newbob stopped training after epoch {epochs_trained} of at most {job.epochs}: "
            f"its CV gained less than --newbob-stop ({job.newbob_stop:g} points) once the "
            "rate ramped down")  # fmt: skip
