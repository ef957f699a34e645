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
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from snet.protocol.errors import CodecError, RejectedUpdate
from snet.protocol.hooks import HookSet, RunInfo
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    TRAINING_COMPLETE,
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
from .decoding import UpdateDecoder
from .epochs import EpochControl
from .inline import InlineFrames
from .leases import LeaseBook
from .pool import ElementLoan, ElementPool, Received
from .session import WorkerSession
from .stats import TrainingStats
from .stepping import PendingUpdate, Stepping
from .update_rule import UpdateRule

log = logging.getLogger("snet.server")

LEASES_PER_WORKER = 2  # the next chunk is always at hand, so no worker idles between chunks


@dataclass
class EvalJob:
    epoch: int
    version: int
    weights: np.ndarray
    worker_id: int | None = None


class Coordinator(Stepping):
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
        self.decoder = UpdateDecoder(self.layout, self.pool)
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
        codecs = session.ledger.agreed() if session.ledger is not None else {}
        session.send(Welcome(session.worker_id, self.job.to_dict(), codecs))
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

    def on_resync(self, session: WorkerSession, reason: str) -> None:
        """The worker asks for a full float32 copy of the weights: send one now."""
        log.info("worker %s asks for a full copy of the weights: %s", session.name, reason[:100])
        if session.ledger is not None:
            session.ledger.weights.request_full()
        self.send_weights(session)

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

    def on_update(self, session: WorkerSession, received: Received) -> None:
        """Check an update; queue it for the next step or refuse it (raises RejectedUpdate).

        The coordinator owns ``received`` (and its pooled element) from here: a refused
        update is released at once, a queued one by the step that applies it. A
        compressed update is decoded into a free pooled element first, so the update
        rule only ever sees float32 elements; one that does not decode is refused.
        """
        message = received.message
        gaps = self.book.lost_before(session.worker_id, message.lease_id, message.offset)
        if gaps:  # updates lost on the way: settled, so the worker's flow control recovers
            session.updates_settled += sum(-(-frames // self.job.bunch_size) for frames in gaps)
            log.warning("updates of %s were lost: %d frames back in the queue", session.name,
                        sum(gaps))  # fmt: skip
        if session.ledger is not None:
            payload = message.encoded.nbytes if message.encoded else message.element.nbytes
            session.ledger.record_update(payload, self.layout.nbytes)
        try:
            if message.encoded is not None:
                received.adopt(self._decode_update(session, message))
            frames = self._check_update(session, message, received.loan)
        except RejectedUpdate as exc:
            received.release()
            session.updates_rejected += 1
            session.updates_settled += 1
            self.stats.updates_rejected += 1
            self.send_weights(session)  # tells the worker the update is settled
            self._maybe_step()
            # the error frame names the refused update (the worker's error feedback needs it)
            raise RejectedUpdate(str(exc), message.lease_id, message.offset) from exc
        session.updates_sent += 1
        session.patterns += message.patterns
        session.compute_seconds += message.compute_seconds
        self.stats.record_train(message.patterns, message.correct, message.loss_sum)
        self._received.append(PendingUpdate(session, message, frames, received.loan))
        if len(self.book.held_by(session.worker_id)) < LEASES_PER_WORKER:
            self.fill_leases()
        self._maybe_step()

    def _decode_update(self, session: WorkerSession, message: Update) -> ElementLoan:
        """The encoded update decoded into a pooled element (``RejectedUpdate`` if it can't)."""
        assert message.encoded is not None
        agreed = session.ledger.update_codec if session.ledger is not None else "none"
        try:
            return self.decoder.decode(agreed, message.encoded)
        except CodecError as exc:
            if session.ledger is not None:
                session.ledger.undecodable += 1
            self._refuse(session, message, f"undecodable update: {exc}")

    def _refuse(self, session: WorkerSession, message: Update, reason: str) -> NoReturn:
        # The lease moves past these frames and they are queued again: nothing is lost.
        # (skip() itself refuses a claim on frames the worker does not hold.)
        self.book.skip(session.worker_id, message.lease_id, message.offset, message.patterns)
        self.fill_leases()
        raise RejectedUpdate(reason)

    def _check_update(
        self, session: WorkerSession, message: Update, element: ElementLoan | None
    ) -> np.ndarray:
        reason = ""
        if (
            session.ledger is not None
            and message.encoded is None
            and (session.ledger.update_codec != "none")
        ):
            reason = f"update sent as float32, agreed codec is {session.ledger.update_codec}"
        elif element is None:  # the pool only takes payloads of exactly the element's layout
            reason = (
                f"update element has shape {tuple(message.element.shape)} "
                f"{message.element.dtype}, the network needs ({self.layout.size},) float32"
            )
        elif not 0 <= message.base_version <= self.version:
            reason = f"update names unknown weights version {message.base_version}"
        elif self.job.mode == "sync" and message.base_version != self.version:
            reason = f"sync mode: update on version {message.base_version}, round is {self.version}"
        if reason:
            self._refuse(session, message, reason)
        return self.book.accept(
            session.worker_id, message.lease_id, message.offset, message.patterns
        )

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
