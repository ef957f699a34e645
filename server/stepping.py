"""``Stepping``: when the coordinator takes a step, and what taking one involves.

A mixin of ``Coordinator`` (server/training.py), kept apart because it is the one piece
that runs numpy off the event loop: the update rule runs in the step thread, NaN and Inf
are caught once on the sum (the updates that carry them are then found and refused, their
frames queued again), and a finished step is published with its version, recorded in the
ledger and the statistics, and sent to every worker.
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
from .pool import ElementPool, PooledElement, is_finite
from .session import WorkerSession
from .stats import TrainingStats
from .update_rule import UpdateRule

log = logging.getLogger("snet.server")


@dataclass
class PendingUpdate:
    session: WorkerSession
    message: Update
    frames: np.ndarray
    element: PooledElement | None

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
        if self.job.mode == "sync":
            ready = self._waiting_for() == 0
            count = len(self._received)
        else:
            wanted = self.job.updates_per_step or max(len(self.sessions), 1)
            ready = len(self._received) >= wanted or self._waiting_for() == 0
            count = min(wanted, len(self._received))
        if ready:
            batch = [self._received.popleft() for _ in range(count)]
            self._applying = True
            asyncio.get_running_loop().create_task(self._step(batch))

    async def _step(self, batch: list[PendingUpdate]) -> None:
        rate = self.learning_rate
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        everything = list(batch)
        try:
            snapshot = await self._apply(batch, rate)
            if snapshot is None:
                # A NaN or Inf is in the sum: refuse the updates that carry one (or all, if
                # each is finite and only their sum overflowed) and step with the rest.
                finite = await loop.run_in_executor(
                    self.executor, lambda: [is_finite(p.gradient) for p in batch]
                )
                bad = [p for p, ok in zip(batch, finite, strict=True) if not ok] or batch
                reason = (
                    "update contains NaN or infinite values"
                    if bad is not batch
                    else ("the sum of these updates overflows float32")
                )
                for pending in bad:
                    self._refuse_accepted(pending, reason)
                batch = [p for p in batch if p not in bad]
                snapshot = await self._apply(batch, rate) if batch else None
                if snapshot is None:
                    for pending in batch:
                        self._refuse_accepted(pending, "the sum of these updates overflows")
                    batch = []
        finally:
            for pending in everything:
                if pending.element is not None:
                    self.pool.release(pending.element)
            self._applying = False
        if snapshot is not None:
            self._publish(batch, snapshot, rate, time.perf_counter() - started)
        self._maybe_step()

    async def _apply(self, batch: list[PendingUpdate], rate: float) -> np.ndarray | None:
        patterns = sum(p.message.patterns for p in batch)
        # Updates that carry their worker's momentum (protocol 8.8) bypass the server's.
        direct = [p.gradient for p in batch if p.session.momentum_corrected]
        elements = [p.gradient for p in batch if not p.session.momentum_corrected]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, self.rule.step, elements, patterns, rate, direct
        )

    def _publish(
        self, batch: list[PendingUpdate], snapshot: np.ndarray, rate: float, seconds: float
    ) -> None:
        """A step is done: new version, staleness, ledger, weights to every worker."""
        base = self.version
        self.version += 1
        self.rule.snapshot = snapshot  # published with its version, on the event loop
        for pending in batch:
            staleness = base - pending.message.base_version
            pending.session.record_staleness(staleness)
            pending.session.updates_settled += 1
            self.stats.record_staleness(staleness)
            self.book.record_applied(pending.frames)
        patterns = sum(p.message.patterns for p in batch)
        self.stats.record_step(len(batch), patterns, seconds)
        correct = sum(p.message.correct for p in batch)
        loss = sum(p.message.loss_sum for p in batch)
        event = BunchEvent(self.epoch, self.version, len(batch), patterns, correct, loss, rate)
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
