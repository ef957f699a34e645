"""``Stepping``: when the coordinator takes a step, and what taking one involves.

A mixin of ``Coordinator`` (server/training.py), kept apart because it is the one piece
that runs numpy off the event loop: the update rule runs in the step thread, NaN and Inf
are caught once on the result (the updates that carry them are then found and refused,
their frames queued again), and a finished step is published with its version, recorded
in the ledger and the statistics, and sent to every worker. Steps that queue up behind a
running one are applied together in one fused pass (``UpdateRule.steps``), each still
with its own version, so a loaded server spends less per update, not more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from snet.protocol.errors import RejectedUpdate
from snet.protocol.hooks import BunchEvent, HookSet
from snet.protocol.job import JobSpec
from snet.protocol.messages import ErrorMessage, Update

from .leases import LeaseBook
from .pool import ElementLoan, ElementPool, is_finite
from .session import WorkerSession
from .stats import TrainingStats
from .update_rule import UpdateRule

log = logging.getLogger("snet.server")

MAX_FUSED_STEPS = 16  # steps applied in one pass when updates pile up (bounds latency)
OVERFLOW = "the sum of these updates overflows float32"  # each finite, their step is not


@dataclass
class PendingUpdate:
    session: WorkerSession
    message: Update
    frames: np.ndarray
    element: ElementLoan | None  # owned: the step releases it

    @property
    def gradient(self) -> np.ndarray:
        """The float32 element to apply: the pooled one (received into or decoded into)."""
        return self.element.flat if self.element is not None else self.message.element


class Stepping:
    """Step scheduling and application; the state it uses is the Coordinator's."""

    job: JobSpec
    sessions: dict[int, WorkerSession]
    book: LeaseBook
    pool: ElementPool
    rule: UpdateRule
    stats: TrainingStats
    hooks: HookSet
    executor: Executor
    trace: Callable[[dict[str, Any]], None] | None
    version: int
    epoch: int
    closed: bool
    _applying: bool
    _received: deque[PendingUpdate]

    @property
    def learning_rate(self) -> float:
        raise NotImplementedError

    def send_weights(self, session: WorkerSession) -> None:
        raise NotImplementedError

    def fill_leases(self) -> None:
        raise NotImplementedError

    def _end_epoch(self) -> None:
        raise NotImplementedError

    def _waiting_for(self) -> int:
        """Workers that hold undelivered frames and have no update in the queue."""
        pending = {p.session.worker_id for p in self._received}
        return sum(
            1
            for worker_id in self.sessions
            if worker_id not in pending and self.book.remaining_frames(worker_id) > 0
        )

    def _maybe_step(self) -> None:
        if self._applying or not self._received or self.closed:
            return
        groups = self._take_groups()
        if groups:
            self._applying = True
            asyncio.get_running_loop().create_task(self._step(groups))

    def _take_groups(self) -> list[list[PendingUpdate]]:
        """The steps that are ready, each a group of queued updates, taken off the queue.

        Sync: one step over every update of the round, once nobody else is expected.
        Async: a step per ``updates_per_step`` updates (default: one per worker), or
        over what is queued when no other worker is still computing. When updates pile
        up while a step runs, the steps waiting behind it are all taken (up to
        ``MAX_FUSED_STEPS``) and applied in one fused pass with exactly the result of
        applying them one after another, so a busy server does less work per update.
        """
        received = self._received
        if self.job.mode == "sync":
            if self._waiting_for() > 0:
                return []
            group = list(received)
            received.clear()
            return [group]
        wanted = self.job.updates_per_step or max(len(self.sessions), 1)
        groups: list[list[PendingUpdate]] = []
        while len(received) >= wanted and len(groups) < MAX_FUSED_STEPS:
            groups.append([received.popleft() for _ in range(wanted)])
        if received and len(groups) < MAX_FUSED_STEPS and self._waiting_for() == 0:
            groups.append(list(received))
            received.clear()
        return groups

    async def _step(self, groups: list[list[PendingUpdate]]) -> None:
        rate = self.learning_rate
        started = time.perf_counter()
        try:
            snapshot = await self._apply(groups, rate)
            if snapshot is not None:
                self._publish(groups, snapshot, rate, time.perf_counter() - started)
            else:
                # A NaN or Inf somewhere (nothing was changed): step group by group,
                # refusing the updates that carry one.
                for group in groups:
                    await self._step_checked(group, rate)
        finally:
            for group in groups:
                for pending in group:
                    if pending.element is not None:
                        pending.element.release()
            self._applying = False
        self._maybe_step()

    async def _step_checked(self, batch: list[PendingUpdate], rate: float) -> None:
        """One step, refusing the updates that carry NaN or Inf (all, if only the sum
        overflows float32), and stepping with the rest."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        snapshot = await self._apply([batch], rate)
        if snapshot is None:
            finite = await loop.run_in_executor(
                self.executor, lambda: [is_finite(p.gradient) for p in batch]
            )
            # by position, not ``p in bad``: a dataclass compare would reach the arrays
            bad = [p for p, ok in zip(batch, finite, strict=True) if not ok]
            good = [p for p, ok in zip(batch, finite, strict=True) if ok] if bad else []
            reason = "update contains NaN or infinite values" if bad else OVERFLOW
            for pending in bad or batch:
                self._refuse_accepted(pending, reason)
            batch = good
            snapshot = await self._apply([batch], rate) if batch else None
            if snapshot is None:
                for pending in batch:
                    self._refuse_accepted(pending, OVERFLOW)
                return
        self._publish([batch], snapshot, rate, time.perf_counter() - started)

    @staticmethod
    def _gradients(batch: list[PendingUpdate]) -> list[np.ndarray]:
        return [p.gradient for p in batch if not p.session.momentum_corrected]

    @staticmethod
    def _direct(batch: list[PendingUpdate]) -> list[np.ndarray]:
        """The updates that carry their worker's momentum (protocol 8.8): applied outside
        the server's."""
        return [p.gradient for p in batch if p.session.momentum_corrected]

    @staticmethod
    def _patterns(batch: list[PendingUpdate]) -> int:
        return sum(p.message.patterns for p in batch)

    async def _apply(self, groups: list[list[PendingUpdate]], rate: float) -> np.ndarray | None:
        """The update rule over ``groups`` (consecutive steps) in the step thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, self.rule.steps, [self._gradients(g) for g in groups],
            [self._patterns(g) for g in groups], rate, [self._direct(g) for g in groups],
        )  # fmt: skip

    def _publish(
        self, groups: list[list[PendingUpdate]], snapshot: np.ndarray, rate: float,
        seconds: float,
    ) -> None:  # fmt: skip
        """Steps are done: a version each (staleness, ledger, hooks), weights to workers."""
        self.rule.snapshot = snapshot  # published with its version, on the event loop
        self.stats.record_pass()
        for batch in groups:
            base = self.version
            self.version += 1
            for pending in batch:
                staleness = base - pending.message.base_version
                pending.session.record_staleness(staleness)
                pending.session.updates_settled += 1
                self.stats.record_staleness(staleness)
                self.book.record_applied(pending.frames)
            patterns = self._patterns(batch)
            self.stats.record_step(len(batch), patterns, seconds / len(groups))
            correct = sum(p.message.correct for p in batch)
            loss = sum(p.message.loss_sum for p in batch)
            event = BunchEvent(self.epoch, self.version, len(batch), patterns, correct, loss,
                               rate)  # fmt: skip
            self.hooks.call("after_bunch", event)
            if self.trace is not None:
                self.trace(self._trace_record(batch, rate))
        for session in self.sessions.values():
            self.send_weights(session)
        if self.book.epoch_complete:
            self._end_epoch()

    def _refuse_accepted(self, pending: PendingUpdate, reason: str) -> None:
        """Refuse a queued update at step time: its frames go back, the worker is told."""
        session, message = pending.session, pending.message
        self.book.unaccept(pending.frames)
        self.stats.record_train(-message.patterns, -message.correct, -message.loss_sum)
        session.updates_rejected += 1
        session.updates_settled += 1
        self.stats.updates_rejected += 1
        log.warning("refused update from %s: %s", session.name, reason)
        session.send(
            ErrorMessage(RejectedUpdate.code, reason, False, message.lease_id, message.offset)
        )
        self.send_weights(session)
        self.fill_leases()

    def _trace_record(self, batch: list[PendingUpdate], rate: float) -> dict[str, Any]:
        updates = [
            {"worker": p.session.name, "base_version": p.message.base_version,
             "frames": p.frames.tolist()}
            for p in batch
        ]  # fmt: skip
        return {"version": self.version, "epoch": self.epoch, "learning_rate": rate,
                "updates": updates}  # fmt: skip
