"""``TrainingStats``: the figures /status, /metrics and the demo report."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from snet.protocol.hooks import EpochEvent
from snet.protocol.numbering import shown_epoch

log = logging.getLogger("snet.server")


@dataclass
class EpochRecord:
    """What happened in one epoch."""

    epoch: int
    learning_rate: float
    started: float = field(default_factory=time.time)
    # its first lease: an epoch's seconds count from here, not from the wait for the
    # workers that the first epoch began with (27.8 s shown for a 1.5 s epoch)
    leased: float | None = None
    ended: float | None = None
    end_version: int | None = None
    train_patterns: int = 0
    train_correct: int = 0
    train_loss: float = 0.0
    cv_frames: int = 0
    cv_correct: int = 0
    cv_loss: float = 0.0
    ledger: dict[str, Any] = field(default_factory=dict)
    kept: bool | None = None  # newbob: False when the epoch's weights were rolled back

    def as_dict(self) -> dict[str, Any]:
        # nothing leased yet: no training time (the wait for workers had shown as 10, 17 s)
        waiting = self.leased is None and self.ended is None
        return {
            "epoch": self.epoch,
            "learning_rate": self.learning_rate,
            "seconds": 0.0
            if waiting
            else round((self.ended or time.time()) - (self.leased or self.started), 3),
            "end_version": self.end_version,
            "train_patterns": self.train_patterns,
            "train_accuracy": _ratio(self.train_correct, self.train_patterns),
            "train_loss": _ratio(self.train_loss, self.train_patterns),
            "cv_frames": self.cv_frames,
            "cv_accuracy": _ratio(self.cv_correct, self.cv_frames),
            "cv_loss": _ratio(self.cv_loss, self.cv_frames),
            "ledger": self.ledger,
            "kept": self.kept,
        }


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 6) if denominator else None


@dataclass(frozen=True)
class BunchFigures:
    """What one step's bunch counted: its updates (np: slice holders' answers), patterns,
    correct classifications and loss sum."""

    updates: int
    patterns: int
    correct: int
    loss: float


@dataclass
class TrainingStats:
    """Counters of the whole run and a record per epoch."""

    epochs_planned: int
    started: float = field(default_factory=time.time)
    epochs: list[EpochRecord] = field(default_factory=list)
    epochs_done: int = 0
    steps: int = 0
    updates_applied: int = 0
    updates_rejected: int = 0
    leases_revoked: int = 0  # async: leases of late workers given to the others
    leases_handed_over: int = 0  # async: an epoch's last leases, from far slower workers
    workers_dropped_late: int = 0  # sync: workers that missed the round deadline
    patterns_applied: int = 0
    staleness_max: int = 0
    staleness_sum: int = 0
    staleness_count: int = 0
    staleness_histogram: dict[int, int] = field(default_factory=dict)
    step_seconds: float = 0.0
    step_passes: int = 0  # passes of the update rule: fewer than steps when steps were fused
    # the version of the weights ``weights_cv_accuracy`` scored: a kept epoch's end, or
    # the weights a roll-back restored (None: none scored); older: trained on since
    scored_version: int | None = None

    def start_epoch(self, epoch: int, learning_rate: float) -> None:
        self.epochs.append(EpochRecord(epoch, learning_rate))

    def leasing(self, leased: bool) -> None:
        """Whether the current epoch's frames are leased: its training time runs from the
        first time they are."""
        if leased and self.epochs and self.epochs[-1].leased is None:
            self.epochs[-1].leased = time.time()

    def record_of(self, epoch: int) -> EpochRecord:
        return next(r for r in self.epochs if r.epoch == epoch)

    def mark_kept(self, epoch: int, kept: bool, version: int) -> EpochEvent:
        """Whether the schedule kept the epoch's weights (newbob may roll them back: the
        weights restored are then ``version``); the epoch as the ``after_epoch`` hooks see
        it (its CV result recorded)."""
        record = self.record_of(epoch)
        record.kept = kept
        self.scored_version = record.end_version if kept else version
        return EpochEvent(epoch, record.learning_rate, record.train_patterns,
                          record.train_correct, record.cv_frames, record.cv_correct,
                          record.cv_loss, kept)  # fmt: skip

    def record_train(self, patterns: int, correct: int, loss_sum: float) -> None:
        current = self.epochs[-1]
        current.train_patterns += patterns
        current.train_correct += correct
        current.train_loss += loss_sum

    def record_staleness(self, staleness: int) -> None:
        self.staleness_max = max(self.staleness_max, staleness)
        self.staleness_sum += staleness
        self.staleness_count += 1
        self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1

    def record_step(self, updates: int, patterns: int, seconds: float) -> None:
        self.steps += 1
        self.updates_applied += updates
        self.patterns_applied += patterns
        self.step_seconds += seconds
        log.debug("step %d: %d updates, %d patterns, %.2f ms applying it", self.steps,
                  updates, patterns, 1000 * seconds)  # fmt: skip

    def record_late(self, leases_revoked: int = 0, dropped: bool = False) -> None:
        """A late worker's leases were taken back (async), or it was dropped (sync)."""
        self.leases_revoked += leases_revoked
        self.workers_dropped_late += int(dropped)

    def record_handed_over(self, leases: int) -> None:
        """A far slower worker's leases went to idle workers at an epoch's end (async)."""
        self.leases_handed_over += leases

    def record_pass(self) -> None:
        self.step_passes += 1

    def record_refused(self) -> None:
        """An update was refused (at intake or at its step)."""
        self.updates_rejected += 1

    def end_epoch(self, epoch: int, version: int, ledger: dict[str, Any]) -> None:
        record = self.record_of(epoch)
        record.ended, record.end_version, record.ledger = time.time(), version, ledger
        self.epochs_done += 1
        accuracy = self.train_accuracy(epoch)
        log.info(
            "epoch %d done at version %d: train accuracy %.2f%%",
            shown_epoch(epoch), version, 100 * accuracy,
            extra={"epoch": shown_epoch(epoch), "version": version, "train_accuracy": accuracy},
        )  # fmt: skip

    def record_cv(self, epoch: int, frames: int, correct: int, loss_sum: float) -> None:
        record = self.record_of(epoch)
        record.cv_frames, record.cv_correct, record.cv_loss = frames, correct, loss_sum
        accuracy = correct / max(frames, 1)
        log.info(
            "epoch %d cross-validation: %.2f%% of %d frames", shown_epoch(epoch), 100 * accuracy,
            frames, extra={"epoch": shown_epoch(epoch), "cv_accuracy": accuracy, "frames": frames},
        )  # fmt: skip

    def train_accuracy(self, epoch: int) -> float:
        record = self.record_of(epoch)
        return record.train_correct / record.train_patterns if record.train_patterns else 0.0

    def latest(self, key: str) -> float | None:
        """The newest epoch's value of ``train_accuracy`` or ``cv_accuracy`` that exists."""
        for record in reversed(self.epochs):
            value = record.as_dict()[key]
            if value is not None:
                return float(value)
        return None

    def weights_cv_accuracy(self) -> float | None:
        """The CV accuracy of the weights the server holds: the newest scored epoch's that
        the schedule did not roll back (newbob rolls back an epoch that made CV worse;
        that epoch's score is then no longer the weights'). Between epochs the weights
        have trained on since (``scored_version``)."""
        record = self.weights_cv_record()
        return None if record is None else float(record.as_dict()["cv_accuracy"])

    def weights_cv_record(self) -> EpochRecord | None:
        """The epoch whose score ``weights_cv_accuracy`` is (None: none scored)."""
        for record in reversed(self.epochs):
            if record.as_dict()["cv_accuracy"] is not None and record.kept is not False:
                return record
        return None

    def checkpoint_state(
        self,
        not_applied: Iterable[tuple[int, int, float]] = (),
        not_in_weights: Iterable[BunchFigures] = (),
    ) -> dict[str, Any]:
        """Every counter and epoch record, as plain data. ``not_applied``: (patterns,
        correct, loss) of updates counted but not in the weights; they are trained again
        after a restore, so they are left out of the current epoch's figures.
        ``not_in_weights``: steps counted whose effect the weights saved do not hold (np's
        bunches after its last report), left out of the counts of steps, updates and
        patterns too (a restart trained them again and counted them twice: 149,149
        patterns processed of 145,437)."""
        state = dataclasses.asdict(self)
        state["staleness_histogram"] = {str(k): v for k, v in self.staleness_histogram.items()}
        lost = list(not_in_weights)
        for bunch in lost:
            state["steps"] -= 1
            state["step_passes"] -= 1
            state["updates_applied"] -= bunch.updates
            state["patterns_applied"] -= bunch.patterns
        if state["epochs"]:
            current = state["epochs"][-1]
            figures = [*not_applied, *((b.patterns, b.correct, b.loss) for b in lost)]
            for patterns, correct, loss in figures:
                current["train_patterns"] -= patterns
                current["train_correct"] -= correct
                current["train_loss"] -= loss
        return state

    def restore_checkpoint(self, state: dict[str, Any]) -> None:
        """Continue counting from ``checkpoint_state()``."""
        for name in (f.name for f in dataclasses.fields(self)):
            if name not in ("epochs", "staleness_histogram") and name in state:
                setattr(self, name, state[name])
        self.staleness_histogram = {int(k): v for k, v in state["staleness_histogram"].items()}
        known = {f.name for f in dataclasses.fields(EpochRecord)}
        self.epochs = [EpochRecord(**{k: v for k, v in r.items() if k in known})
                       for r in state["epochs"]]  # fmt: skip

    @property
    def staleness_mean(self) -> float:
        return self.staleness_sum / self.staleness_count if self.staleness_count else 0.0
