"""``Coordinator``: the server's training loop in both modes, driven by worker events.

It is called from the connections (on the event loop) and runs every numpy step in a
single worker thread, so receiving never waits behind computing.

- **sync**: a step is taken once every worker that holds frames has delivered one update
  against the current version; workers that leave or hold no frames are not waited for.
- **async**: a step is taken whenever ``updates_per_step`` updates (default: one per live
  worker) are queued, whoever sent them; each update's staleness (current version minus
  its base version) is recorded. In both modes the queue is flushed as soon as no other
  worker could still contribute (the tail of an epoch, a worker gone).

After each step every worker is sent the new weights. After each epoch the weights are
sent to one worker for cross-validation while the others go on (with newbob the next
epoch waits for it: ``server/epochs.py``). Workers that cannot read the data get their
frames inline (``server/inline.py``); hooks (``protocol/hooks.py``) see every step.
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
from snet.protocol.hooks import BunchEvent, HookSet, RunInfo
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    TRAINING_COMPLETE,
    ErrorMessage,
    EvalResult,
    Evaluate,
    FramesWanted,
    Goodbye,
    Lease,
    Update,
    Weights,
    Welcome,
)
from snet.protocol.network import ElementLayout, initial_weights

from .dataplan import DataPlan
from .epochs import EpochControl
from .inline import InlineFrames
from .leases import LeaseBook
from .pool import ElementPool, PooledElement, is_finite
from .session import WorkerSession
from .stats import TrainingStats
from .update_rule import UpdateRule

log = logging.getLogger("snet.server")

LEASES_PER_WORKER = 2  # the next chunk is always at hand, so no worker idles between chunks


@dataclass
class PendingUpdate:
    session: WorkerSession
    message: Update
    frames: np.ndarray
    element: PooledElement | None


@dataclass
class EvalJob:
    epoch: int
    version: int
    weights: np.ndarray
    worker_id: int | None = None


class Coordinator:
    """Holds the network and decides when to step, whom to lease frames and who scores."""

    def __init__(
        self,
        job: JobSpec,
        plan: DataPlan,
        executor: Executor,
        pool_size: int,
        trace: Callable[[dict[str, Any]], None] | None = None,
        hooks: HookSet | None = None,
        weights: np.ndarray | None = None,
        min_workers: int = 1,
    ) -> None:
        self.job = job
        # No frames are leased before this many workers have joined (then never again
        # held back), so that a fixed set of workers starts together.
        self.min_workers = min_workers
        self._quorum = min_workers <= 1
        self.plan = plan
        self.layout = ElementLayout.for_network(job.network)
        self.connections = job.network.connections
        start = initial_weights(job.network, job.seed) if weights is None else weights
        self.rule = UpdateRule(start, job.momentum)
        self.pool = ElementPool(self.layout, pool_size)
        self.book = LeaseBook(
            plan.train_frames,
            plan.total_frames,
            job.chunk_frames,
            job.seed,
            cache_frames=job.bunch_size * job.shuffle_cache_bunches,
            sequential=job.frame_order == "sequential",
        )
        self.inline = InlineFrames(plan, job.data.context)
        self.hooks = hooks or HookSet([])
        self.executor = executor
        self.trace = trace
        self.stats = TrainingStats(job.epochs)
        self.sessions: dict[int, WorkerSession] = {}
        self.departed: list[WorkerSession] = []
        self.version = 0
        self.epoch = 0
        self._received: deque[PendingUpdate] = deque()
        self._applying = False
        self._evals: dict[int, EvalJob] = {}
        self.finished = asyncio.Event()
        self.closed = False  # set at shutdown: no new steps
        self.on_finished: Callable[[], None] | None = None
        self.epochs = EpochControl(self)
        info = RunInfo(
            job.network.describe(), self.connections, job.mode, job.epochs, len(plan.train_frames)
        )
        self.hooks.call("before_training", info)
        self.epochs.begin(0)

    # ------------------------------------------------------------ workers

    @property
    def learning_rate(self) -> float:
        return self.epochs.rate

    @property
    def received_queue(self) -> int:
        return len(self._received)

    def add_worker(self, session: WorkerSession) -> None:
        """A worker passed the handshake: send it the job, the weights and its frames."""
        self.sessions[session.worker_id] = session
        log.info("worker %s (%s, %s) joined", session.name, session.backend, session.address)
        session.send(Welcome(session.worker_id, self.job.to_dict()))
        session.send(self.plan.data_info())
        self.send_weights(session)
        if self.finished.is_set():  # a latecomer (e.g. a restarted pod): nothing left to do
            session.send(Goodbye(TRAINING_COMPLETE))
            session.close(TRAINING_COMPLETE)
            return
        self.fill_leases()
        self._assign_evals()

    def remove_worker(self, session: WorkerSession, reason: str) -> None:
        """A worker left (goodbye, lost connection, timeout): requeue its frames."""
        if self.sessions.pop(session.worker_id, None) is None:
            return
        session.state, session.left_reason = "gone", reason
        self.departed.append(session)
        returned = self.book.worker_gone(session.worker_id)
        self.inline.forget(session.worker_id)
        log.info("worker %s left (%s); %d frames back in the queue", session.name, reason, returned)
        for job in self._evals.values():
            if job.worker_id == session.worker_id:
                job.worker_id = None
        self.fill_leases()
        self._assign_evals()
        self._maybe_step()

    def send_weights(self, session: WorkerSession) -> None:
        session.weights_version_sent = self.version
        session.send(
            Weights(
                self.version,
                self.epoch,
                self.learning_rate,
                session.updates_settled,
                self.rule.snapshot,
            )
        )

    def fill_leases(self) -> None:
        if self.epochs.waiting_for_cv:
            return
        if not self._quorum:
            if len(self.sessions) < self.min_workers:
                log.info("%d of %d workers joined; waiting", len(self.sessions), self.min_workers)
                return
            self._quorum = True
        for session in list(self.sessions.values()):
            while len(self.book.held_by(session.worker_id)) < LEASES_PER_WORKER:
                lease = self.book.grant(session.worker_id)
                if lease is None:
                    return
                self.inline.send(session, lease.chunk)
                session.send(Lease(lease.lease_id, lease.epoch, lease.chunk.astype("<i8")))

    def on_frames_wanted(self, session: WorkerSession, message: FramesWanted) -> None:
        """The worker cannot read the data: send its frames inline from now on."""
        chunks = [lease.chunk for lease in self.book.held_by(session.worker_id)]
        evaluating = any(job.worker_id == session.worker_id for job in self._evals.values())
        self.inline.begin(session, message.reason, chunks, evaluating)

    # ------------------------------------------------------------ updates

    def on_update(self, session: WorkerSession, message: Update) -> None:
        """Check an update; queue it for the next step or refuse it (raises RejectedUpdate)."""
        element = message.slot if isinstance(message.slot, PooledElement) else None
        try:
            frames = self._check_update(session, message, element)
        except RejectedUpdate:
            if element is not None:
                self.pool.release(element)
            session.updates_rejected += 1
            session.updates_settled += 1
            self.stats.updates_rejected += 1
            self.send_weights(session)  # tells the worker the update is settled
            self._maybe_step()
            raise
        session.updates_sent += 1
        session.patterns += message.patterns
        session.compute_seconds += message.compute_seconds
        self.stats.record_train(message.patterns, message.correct, message.loss_sum)
        self._received.append(PendingUpdate(session, message, frames, element))
        if len(self.book.held_by(session.worker_id)) < LEASES_PER_WORKER:
            self.fill_leases()
        self._maybe_step()

    def _check_update(
        self, session: WorkerSession, message: Update, element: PooledElement | None
    ) -> np.ndarray:
        reason = ""
        if element is None:  # the pool only takes payloads of exactly the element's layout
            reason = (
                f"update element has shape {tuple(message.element.shape)} "
                f"{message.element.dtype}, the network needs ({self.layout.size},) float32"
            )
        elif not 0 <= message.base_version <= self.version:
            reason = f"update names unknown weights version {message.base_version}"
        elif self.job.mode == "sync" and message.base_version != self.version:
            reason = f"sync mode: update on version {message.base_version}, round is {self.version}"
        if reason:
            # The lease moves past these frames and they are queued again: nothing is lost.
            # (skip() itself refuses a claim on frames the worker does not hold.)
            self.book.skip(session.worker_id, message.lease_id, message.offset, message.patterns)
            self.fill_leases()
            raise RejectedUpdate(reason)
        return self.book.accept(
            session.worker_id, message.lease_id, message.offset, message.patterns
        )

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
                    self.executor, lambda: [is_finite(p.message.element) for p in batch]
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
        elements = [p.message.element for p in batch]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.rule.step, elements, patterns, rate)

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
        session.send(ErrorMessage(RejectedUpdate.code, reason, False))
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

    # ------------------------------------------------------------ epochs

    def _end_epoch(self) -> None:
        ledger = self.book.ledger.summary()
        self.stats.end_epoch(self.epoch, self.version, ledger)
        accuracy = 100 * self.stats.train_accuracy(self.epoch)
        log.info("epoch %d done at version %d: train accuracy %.2f%%", self.epoch, self.version,
                 accuracy)  # fmt: skip
        self._evals[self.epoch] = EvalJob(self.epoch, self.version, self.rule.snapshot)
        self.epochs.epoch_trained(self.epoch)
        self._assign_evals()

    def _assign_evals(self) -> None:
        for job in self._evals.values():
            if job.worker_id is not None or not self.sessions:
                continue
            # Prefer a worker with the fewest frames to train on, so training goes on.
            session = min(
                self.sessions.values(), key=lambda s: self.book.remaining_frames(s.worker_id)
            )
            job.worker_id = session.worker_id
            session.evaluations += 1
            self.inline.send(session, self.plan.cv_frames)
            session.send(Evaluate(job.version, job.epoch, job.weights))

    def on_eval_result(self, session: WorkerSession, message: EvalResult) -> None:
        job = self._evals.get(message.epoch)
        if job is None or job.version != message.version or job.worker_id != session.worker_id:
            raise RejectedUpdate(f"no evaluation of epoch {message.epoch} was asked of you")
        del self._evals[message.epoch]
        self.stats.record_cv(message.epoch, message.frames, message.correct, message.loss_sum)
        log.info(
            "epoch %d cross-validation: %.2f%% of %d frames",
            message.epoch,
            100 * message.correct / max(message.frames, 1),
            message.frames,
        )
        self.epochs.cv_result(message.epoch, job.weights, message)
