"""``StepRunner``: applies steps with the update rule (in the step thread), NaN-safe.

The one part that runs numpy off the event loop, or on it while a pass takes less than
``inline_step_seconds`` of CPU (transport/inline.py: the hand-off to the thread cost as much
as the default job's step). One pass runs at a time, wherever it runs. It is handed groups
of queued updates (consecutive steps, as a policy chose them) and returns what became of
each: the new weights and the groups applied, and the updates refused with the reason. It
publishes nothing, sends nothing and knows no worker: the coordinator does that with the
result.

Each update's norm is checked first (server/plausible.py: one BLAS dot; NaN, Inf, zeros
and norms far from the running mean of accepted updates are refused). Overflow is caught
once, on the result of a pass (one BLAS dot per block in the update rule): only when a pass
finds one are the groups applied one at a time, the updates that carry one found and
refused, and the step taken with the rest (all are refused if only their sum overflows
float32). Steps that queued behind a running one
are applied together in one fused pass (``UpdateRule.steps``) with exactly the result of
applying them one by one, so a busy server spends less per update, not more.

A staleness policy that changes gradients (``protocol/staleness.py``) is applied here too,
to each update as its step is taken (server/compensation.py): with ``none`` (the default)
the gradients go to the update rule untouched and nothing else is done. DC-ASGD and
Gap-Aware need the weights each update was computed on: the runner keeps the last few
versions (``WeightHistory``) while one of them is in force, and the coordinator hands it
one step per pass then, so every version's weights exist.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snet.protocol.digest import weights_digest
from snet.protocol.hooks import BunchEvent
from snet.protocol.messages import Update
from snet.protocol.staleness import StalenessSetting
from snet.transport.inline import InlineChoice, timed

from .compensation import (
    StepSizes,
    WeightHistory,
    delay_compensated,
    gap_penalised,
    staleness_scaled,
)
from .plausible import NormBounds
from .pool import ElementLoan, is_finite
from .session import WorkerSession
from .update_rule import StepRule

OVERFLOW = "the sum of these updates overflows float32"  # each finite, their step is not
NOT_FINITE = "update contains NaN or infinite values"
NORMS_EVERY = 1.0  # seconds between two copies of the norm figures taken after a pass


@dataclass
class PendingUpdate:
    """A received update waiting for its step. It owns its pooled element (if any) from
    the moment it is queued until the step queue releases it, after its step or when a
    refusal takes it out of the queue (server/stepqueue.py ``_free``)."""

    session: WorkerSession
    message: Update
    frames: np.ndarray
    element: ElementLoan | None  # owned: the step releases it

    @property
    def gradient(self) -> np.ndarray:
        """The float32 element to apply: the pooled one (received into or decoded into)."""
        return self.element.flat if self.element is not None else self.message.element

    @property
    def patterns(self) -> int:
        return self.message.patterns

    @property
    def kind(self) -> tuple[bool, str]:
        """What its norm is compared with: updates of the same codec and momentum."""
        ledger = self.session.ledger
        return self.session.momentum_corrected, ledger.update_codec if ledger else "none"


@dataclass
class StepOutcome:
    """What became of the groups handed to ``StepRunner.run``."""

    snapshot: np.ndarray | None = None  # the weights after the last applied group
    applied: list[list[PendingUpdate]] = field(default_factory=list)  # one list per version
    refused: list[tuple[PendingUpdate, str]] = field(default_factory=list)
    seconds: float = 0.0
    digest: str = ""  # of ``snapshot`` (computed with the step, by the pass)


class StepRunner:
    """Runs the update rule over groups of pending updates in the step thread (a pass
    expected to take under ``inline_seconds`` of CPU on the event loop)."""

    def __init__(
        self, rule: StepRule, executor: Executor, inline_seconds: float = 0.0, momentum: float = 0.0
    ) -> None:
        """``momentum``: the job's (how much larger a momentum-carrying update may be)."""
        self.rule = rule
        self.executor = executor
        self.inline = InlineChoice(inline_seconds)  # passes this short run on the loop
        # only ever used by the pass that runs (one at a time)
        self.bounds = NormBounds(momentum=momentum)
        # their figures as /status last read them between passes (a pass changes them in
        # the step thread): what it shows while one runs (``norm_figures``)
        self._norms: tuple[list[dict[str, Any]], dict[int, float]] = ([], {})
        self._norms_due = 0.0
        # The staleness policy's state, used by the running pass only (plain attributes).
        self.setting = StalenessSetting()
        self.version = 0  # the version the next applied group is applied to
        self.history = WeightHistory()
        self.step_sizes = StepSizes()

    async def run(
        self,
        groups: list[list[PendingUpdate]],
        rate: float,
        version: int = 0,
        setting: StalenessSetting | None = None,
    ) -> StepOutcome:
        """Apply ``groups`` as consecutive steps at ``rate`` to the weights of ``version``
        with the staleness ``setting`` (default: none); refuse what cannot be applied."""
        started = time.perf_counter()
        self.setting = setting or StalenessSetting()
        self.version = version
        if not self.setting.needs_base_weights:
            self.history.clear()  # nothing to compare with: keep no old networks alive
            self.step_sizes.clear()
        elif self.history.get(version, count=False) is None:  # e.g. just switched to it
            self.history.add(version, self.rule.weights)
        outcome = StepOutcome()
        loop = asyncio.get_running_loop()
        # One trip to the step thread per pass (the digest comes with the step): each
        # trip costs the event loop a thread hand-off, more than a small step itself; so
        # a pass that takes less than the inline limit runs on the loop instead.
        updates = sum(len(group) for group in groups)
        if self.inline.chosen_for(updates):
            screened, cpu = timed(self._screened_steps, groups, rate)
        else:
            screened, cpu = await loop.run_in_executor(
                self.executor, timed, self._screened_steps, groups, rate
            )
        self.inline.measured(cpu, updates)
        if started >= self._norms_due:  # here, on the loop, no pass runs: a busy server's
            self._norms, self._norms_due = self.bounds.view(), started + NORMS_EVERY  # (a
            # /status read rarely falls between two of its passes: figures stayed empty)
        snapshot, digest, groups, outcome.refused = screened
        if snapshot is not None or not groups:
            outcome.snapshot, outcome.applied, outcome.digest = snapshot, list(groups), digest
        else:
            # A NaN or Inf somewhere (nothing was changed): group by group, refusing the
            # updates that carry one.
            for group in groups:
                await self._run_checked(group, rate, outcome)
            if outcome.snapshot is not None:
                outcome.digest = await loop.run_in_executor(
                    self.executor, weights_digest, outcome.snapshot
                )
        outcome.seconds = time.perf_counter() - started
        return outcome

    def norm_figures(self, between_steps: bool) -> tuple[list[dict[str, Any]], dict[int, float]]:
        """The norm check's figures (``NormBounds.view``, which changes nothing): fresh
        ``between_steps``, else the copy taken between passes (at most ``NORMS_EVERY``
        seconds old while steps run). Never computed in a pass: the pass changes them."""
        if between_steps:
            self._norms = self.bounds.view()
        return self._norms

    def forget_weights(self) -> None:
        """The weights were replaced (roll-back): old versions compare with nothing now."""
        self.history.clear()
        self.step_sizes.clear()

    async def _run_checked(
        self, group: list[PendingUpdate], rate: float, outcome: StepOutcome
    ) -> None:
        snapshot = await self._apply([group], rate)
        if snapshot is None:
            loop = asyncio.get_running_loop()
            finite = await loop.run_in_executor(
                self.executor, lambda: [is_finite(p.gradient) for p in group]
            )
            # by position, not ``p in bad``: a dataclass compare would reach the arrays
            bad = [p for p, ok in zip(group, finite, strict=True) if not ok]
            good = [p for p, ok in zip(group, finite, strict=True) if ok] if bad else []
            reason = NOT_FINITE if bad else OVERFLOW
            outcome.refused += [(pending, reason) for pending in bad or group]
            group = good
            snapshot = await self._apply([group], rate) if group else None
            if snapshot is None:
                outcome.refused += [(pending, OVERFLOW) for pending in group]
                return
        outcome.snapshot = snapshot
        outcome.applied.append(group)

    def _screened_steps(
        self, groups: list[list[PendingUpdate]], rate: float
    ) -> tuple[np.ndarray | None, str, list[list[PendingUpdate]], list[tuple[PendingUpdate, str]]]:
        """The pass (step thread or loop): refuse the updates whose norm is implausible
        (NaN and Inf among them), then one fused pass of the update rule over the rest;
        the new weights with their digest."""
        refused: list[tuple[PendingUpdate, str]] = []
        kept_groups: list[list[PendingUpdate]] = []
        for group in groups:
            kept = []
            for pending in group:
                problem = self.bounds.problem(pending.kind, pending.gradient, pending.patterns,
                                              pending.session.worker_id)  # fmt: skip
                if problem:
                    refused.append((pending, problem))
                else:
                    kept.append(pending)
            if kept:
                kept_groups.append(kept)
        if not kept_groups:
            return None, "", [], refused
        snapshot = self._steps(kept_groups, rate)
        digest = weights_digest(snapshot) if snapshot is not None else ""
        return snapshot, digest, kept_groups, refused

    def _steps(self, groups: list[list[PendingUpdate]], rate: float) -> np.ndarray | None:
        """The pass: the update rule over consecutive ``groups`` (with the staleness
        policy's gradients, if it changes them)."""
        if not self.setting.changes_gradients:
            gradients, patterns, direct = self._arguments(groups)
            return self.rule.steps(gradients, patterns, rate, direct)
        before = self.rule.weights
        gradients, patterns, direct = self._arguments(groups, self._compensated)
        snapshot = self.rule.steps(gradients, patterns, rate, direct)
        if snapshot is not None:
            self.version += len(groups)
            if self.setting.needs_base_weights:
                self.history.add(self.version, snapshot)
                if self.setting.policy == "gap":
                    self.step_sizes.observe(before, snapshot)
        return snapshot

    def _compensated(self, pending: PendingUpdate, index: int) -> np.ndarray:
        """The pass: an update's gradient as the staleness policy has it, applied in
        the ``index``-th of the steps of this pass."""
        base_version = pending.message.base_version
        staleness = self.version + index - base_version
        setting = self.setting
        if setting.policy == "rate":
            return staleness_scaled(pending.gradient, staleness)
        if staleness <= 0:
            return pending.gradient
        base = self.history.get(base_version)
        if base is None:  # older than the history (or the policy just came into force)
            return pending.gradient
        now = self.rule.weights
        if setting.policy == "dcasgd":
            return delay_compensated(
                pending.gradient, pending.patterns, now, base, setting.dc_lambda
            )
        if self.step_sizes.mean is None:
            return pending.gradient
        return gap_penalised(pending.gradient, now, base, self.step_sizes.mean)

    @staticmethod
    def _arguments(
        groups: list[list[PendingUpdate]],
        gradient_of: Callable[[PendingUpdate, int], np.ndarray] | None = None,
    ) -> tuple[list[list[np.ndarray]], list[int], list[list[np.ndarray]]]:
        """The update rule's arguments. Updates that carry their worker's momentum
        (protocol 8.8) are applied outside the server's."""

        def gradient(p: PendingUpdate, index: int) -> np.ndarray:
            return p.gradient if gradient_of is None else gradient_of(p, index)

        gradients = [
            [gradient(p, i) for p in g if not p.session.momentum_corrected]
            for i, g in enumerate(groups)
        ]
        direct = [
            [gradient(p, i) for p in g if p.session.momentum_corrected]
            for i, g in enumerate(groups)
        ]
        patterns = [sum(p.patterns for p in g) for g in groups]
        return gradients, patterns, direct

    async def _apply(self, groups: list[list[PendingUpdate]], rate: float) -> np.ndarray | None:
        """The update rule over ``groups`` (consecutive steps) in the step thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._steps, groups, rate)


def trace_record(
    batch: list[PendingUpdate], version: int, epoch: int, rate: float, digest: str | None = None
) -> dict[str, Any]:
    """One line of the trace file: the step's version and which frames each update covered
    (``bench/replay.py`` replays a run from these), and the digest of the weights it made
    (None for a step fused with later ones: its weights never existed on their own)."""
    updates = [
        {"worker": p.session.name, "base_version": p.message.base_version,
         "frames": p.frames.tolist()}
        for p in batch
    ]  # fmt: skip
    return {"version": version, "epoch": epoch, "learning_rate": rate, "digest": digest,
            "updates": updates}  # fmt: skip


def bunch_event(batch: list[PendingUpdate], version: int, epoch: int, rate: float) -> BunchEvent:
    """The step as the ``after_bunch`` hooks see it: its updates' patterns and figures."""
    patterns = sum(p.patterns for p in batch)
    correct = sum(p.message.correct for p in batch)
    loss = sum(p.message.loss_sum for p in batch)
    return BunchEvent(epoch, version, len(batch), patterns, correct, loss, rate)
