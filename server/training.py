"""``Coordinator``: the server's training, driven by worker events, composed of parts.

Each part owns its state and nothing writes another's fields: ``ElementPool`` (pool.py,
the elements updates are received into); ``UpdateIntake`` (intake.py, an update checked and
queued); the mode's ``StepPolicy`` (policies.py: which queued updates make a step; its
``Combination``: how they combine, the rule); ``StepQueue`` (stepqueue.py), ``StepRunner``
(stepping.py, the rule applied); ``LeaseBook``, ``LeaseDesk``, ``InlineFrames`` (who trains
on which frames); ``EpochControl`` (epochs.py: epochs, rates, roll-back); ``Evaluations``
and ``CvScoring`` (who scores each epoch, cv_scoring.py); ``ProgressWatch`` (progress.py,
delivery deadlines); ``StalenessControl``; ``DivergenceWatch`` (divergence.py, a run whose
every update is refused); ``TrainingStats``, the hooks; and the mode's traffic (traffic.py:
``UpdateTraffic``, leases and updates, or np's ``SliceRounds``), chosen by its policy: the
coordinator routes a worker's mode-dependent events there and never asks which mode runs.

Between steps the parts' ``checkpoint_state()`` make one consistent snapshot, the weights
of ``version`` and exactly the ledger they include (server/resume.py, checkpointer.py). It
routes the events (a worker joins, sends an update or a CV result, is late, leaves) to them
and does what they decide, on the event loop: it publishes each step's weights (to local
workers through transport/shared_board.py), sends them to the workers that compute,
starts epochs; only the ``StepRunner`` computes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from snet.protocol.codecs.handshake import DATA_LABELS
from snet.protocol.digest import weights_digest
from snet.protocol.errors import RejectedUpdate
from snet.protocol.hooks import HookSet, RunInfo
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    TRAINING_COMPLETE,
    ErrorMessage,
    EvalResult,
    FramesWanted,
    Goodbye,
    SliceReply,
    Weights,
    Welcome,
)
from snet.protocol.network import ElementLayout, initial_weights
from snet.protocol.numbering import shown_epoch
from snet.transport.shared_board import ServerBoards

from .cv_referee import CvReferee
from .cv_scoring import CvScoring
from .dataplan import DataPlan
from .departures import Departures
from .divergence import DivergenceWatch
from .epochs import EpochControl, EpochDecision
from .evaluations import EvalJob, Evaluations
from .idleness import IdleWatch
from .inline import InlineFrames
from .intake import UpdateIntake
from .lateness import is_late
from .leases import LeaseBook
from .leasing import LeaseDesk
from .policies import make_step_policy
from .pool import ElementPool, Received
from .progress import ProgressWatch
from .session import WorkerSession
from .slice_master import AssembledElement
from .slice_rounds import CoordinatorParts, SliceRounds
from .staleness import StalenessControl
from .stats import TrainingStats
from .stepping import PendingUpdate, StepOutcome, StepRunner, bunch_event, trace_record
from .stepqueue import Groups, StepQueue
from .traffic import UpdateTraffic

log = logging.getLogger("snet.server")


class Coordinator:
    """Holds the network and decides when to step, whom to lease frames and who scores."""

    def __init__(
        self, job: JobSpec, plan: DataPlan, executor: Executor, pool_size: int,
        trace: Callable[[dict[str, Any]], None] | None = None, hooks: HookSet | None = None,
        weights: np.ndarray | None = None, min_workers: int = 1,
        progress: ProgressWatch | None = None, verify_cv: bool = False, inline_step: float = 0.0,
    ) -> None:  # fmt: skip
        self.job, self.plan = job, plan
        self.layout = ElementLayout.for_network(job.network)
        self.connections = job.network.connections
        self.boards = ServerBoards(self.layout.size)  # local workers': shared_board.py
        start = initial_weights(job.network, job.seed) if weights is None else weights
        self.policy = make_step_policy(job)
        combination = self.policy.combination
        self.rule = combination.make_rule(start, job)
        self.pool = ElementPool(self.layout, pool_size)
        leases = combination.chunk_frames(job), combination.update_frames(job)
        self.book = LeaseBook.for_job(job, plan.train_frames, plan.total_frames, *leases)
        self.intake = UpdateIntake(self.layout, self.pool, self.book, self.policy)
        self.runner = StepRunner(self.rule, executor, inline_step, job.momentum)  # inline: CPU s
        self.staleness, self.idle = StalenessControl(job), IdleWatch()
        self.inline = InlineFrames(plan, job.data.context)
        self.desk = LeaseDesk(self.book, self.inline, min_workers)
        self.epochs, self.trace = EpochControl(job), trace
        second = verify_cv and self.policy.workers_score_cv  # np: the server scores alone
        self.evaluations = Evaluations(copies=2 if second else 1)  # (a 2nd was waited for)
        self.progress = progress or ProgressWatch()
        self.hooks = hooks or HookSet([])
        self.stats = TrainingStats(job.epochs)
        self.sessions: dict[int, WorkerSession] = {}
        self.scoring = CvScoring(self.evaluations, CvReferee(job, plan, executor), self.inline,
                                 plan, self.sessions, self.book.remaining_frames,
                                 not self.policy.workers_score_cv, self._accept_cv,
                                 self._fail, lambda: self.closed)  # fmt: skip
        self.departed, self.divergence = Departures(), DivergenceWatch(self.sessions.keys())
        self.version, self.digest = 0, weights_digest(self.rule.snapshot)  # and its weights
        self.published_from = 0  # the version the workers held before the newest publish
        self.earlier: dict[str, Any] = {"workers": [], "compression": []}  # before restarts
        self.steps = StepQueue(self.runner)
        self.finished, self.closed = asyncio.Event(), False  # closed at shutdown: no new steps
        self.on_finished: Callable[[], None] | None = None  # whom to tell training is done
        self.on_failure: Callable[[str], None] | None = None  # or cannot go on (with why)
        updates = UpdateTraffic(job.mode, self.desk, self.epochs, self.stats, self.evaluations,
                                self.sessions, self._take_update)  # fmt: skip
        rounds = functools.partial(self._slice_rounds, plan, min_workers)  # np's
        self.traffic = self.policy.make_traffic(updates, rounds)  # the mode's: traffic.py
        self.hooks.call("before_training", RunInfo(job.network.describe(), self.connections,
                        job.mode, job.epochs, len(plan.train_frames)))  # fmt: skip
        self._start_epoch(0)

    def _slice_rounds(self, plan: DataPlan, min_workers: int) -> SliceRounds:
        assert isinstance(self.rule, AssembledElement)  # np's rule (policies.py)
        parts = CoordinatorParts(self.book, self.epochs, self.stats, self.hooks, self.idle,
                                 self.steps, self.sessions, lambda: self.closed,
                                 self.finished.is_set, self._next_version, self._assembled,
                                 self._end_epoch, self._count_refused)  # fmt: skip
        return SliceRounds(self.job, self.rule, plan.source.labels, min_workers, parts)

    def close(self) -> None:
        self.closed = True  # the server is stopping: no step starts from now on
        self.boards.close()

    def _next_version(self) -> int:
        self.version += 1
        return self.version

    def _assembled(self) -> None:
        self.digest = weights_digest(self.rule.snapshot)

    @property
    def epoch(self) -> int:
        return self.epochs.epoch

    @property
    def learning_rate(self) -> float:
        return self.epochs.rate

    # ------------------------------------------------------------ workers

    def add_worker(self, session: WorkerSession) -> None:
        """A worker passed the handshake: send it the job, the weights and its frames."""
        self.sessions[session.worker_id] = session
        self.rule.set_workers(len(self.sessions))
        self.idle.joined(session, self.book.waiting_chunks > 0)
        log.info("worker %s (%s, %s) joined", session.name, session.backend, session.address)
        codecs = session.ledger.agreed() if session.ledger is not None else {}
        session.send(Welcome(session.worker_id, self.staleness.job_in_force(self.job), codecs))
        session.send(self.plan.data_info(DATA_LABELS in session.capabilities))
        self.send_weights(session)
        if self.finished.is_set():  # a latecomer (e.g. a restarted pod): nothing left to do
            session.send(Goodbye(TRAINING_COMPLETE))
            session.close(TRAINING_COMPLETE)
            return
        self.fill_leases()
        self.assign_evaluations()
        self.traffic.joined(session)

    def remove_worker(self, session: WorkerSession, reason: str) -> None:
        """A worker left (goodbye, lost connection, timeout): requeue its frames."""
        held = self.traffic.leaving(session)
        if self.sessions.pop(session.worker_id, None) is None:
            return
        self.rule.set_workers(len(self.sessions))
        self.runner.bounds.forget(session.worker_id)  # its norms vote no more
        session.left(reason)
        self.departed.add(session)
        returned = self.desk.worker_gone(session)
        log.info("worker %s left (%s); %d frames back in the queue", session.name, reason, returned)
        self.evaluations.worker_gone(session.worker_id)
        self.fill_leases()
        self.assign_evaluations()
        self.maybe_step()
        self.traffic.left(session, held)

    def send_weights(self, session: WorkerSession) -> None:
        session.weights_sent(self.version, self.published_from)
        if not self.traffic.whole_weights:
            return  # np workers get slices, not copies of the whole network
        session.send(Weights(self.version, self.epoch, self.learning_rate, session.updates_settled,
                             self.rule.snapshot, digest=self.digest))  # fmt: skip

    def on_resync(self, session: WorkerSession, reason: str) -> None:
        """The worker asks for a full float32 copy of the weights (once a version)."""
        if session.full_copy_asked(self.version, reason):
            self.send_weights(session)

    def fill_leases(self) -> None:
        self.traffic.fill()

    def on_slice_message(self, session: WorkerSession, message: SliceReply) -> None:
        self.traffic.on_message(session, message)

    def on_frames_wanted(self, session: WorkerSession, message: FramesWanted) -> None:
        """The worker cannot read the data (its mode's traffic says what follows)."""
        self.traffic.frames_wanted(session, message)

    # ------------------------------------------------------------ updates and steps

    def on_update(self, session: WorkerSession, received: Received) -> None:
        """An update: the mode's traffic takes it (raises RejectedUpdate if refused)."""
        self.traffic.on_update(session, received)

    def _take_update(self, session: WorkerSession, received: Received) -> None:
        """Check an update; queue it for the next step or refuse it (raises RejectedUpdate).
        A queued update's element is the step queue's from here (``Received.keep``); the
        connection gives back what was not kept (server/pool.py)."""
        if not self.intake.arrived(session, received):
            return
        message = received.message
        try:
            pending = self.intake.admit(session, received, self.version, self.steps.running)
        except RejectedUpdate as refusal:
            self._count_refused(session, str(refusal), refusal.numeric)
            self.send_weights(session)  # tells the worker the update is settled
            self.fill_leases()  # the refused frames are queued again
            self.desk.note_if_dry(session)
            self.maybe_step()
            raise
        session.delivered(message.patterns, message.compute_seconds)
        self.stats.record_train(message.patterns, message.correct, message.loss_sum)
        self.steps.append(pending)
        if self.desk.wants_more(session):
            self.fill_leases()
        self.desk.note_if_dry(session)
        self.maybe_step()

    def maybe_step(self) -> None:
        if not self.steps.between_steps or not self.steps or self.closed:
            return
        now, waiting = time.monotonic(), self.steps.pending_workers()  # once, not per worker
        view = self.steps.view(self.sessions.values(), self.book.holders(),
                               lambda s: is_late(self, s, now, waiting), self.version)  # fmt: skip
        chosen = self.policy.take(view)
        if self.staleness.setting.needs_base_weights:
            chosen = chosen[:1]  # one step per pass: every version's weights exist
        if self.staleness.refuse_over_bound(chosen, self.steps, self.version, self._refuse_queued):
            self.maybe_step()  # the queue changed: choose again from what is left
            return
        if chosen:
            self.steps.start(chosen, self._step)

    def set_staleness(self, text: str, by: str) -> dict[str, Any]:
        """Put another staleness policy in force from the next step (the control endpoint);
        recorded in /status and the trace. ConfigError for a bad one."""
        record = self.staleness.change(text, self.version, shown_epoch(self.epoch), by,
                                       self.sessions.values())  # fmt: skip
        if self.trace is not None and not record.get("unchanged"):
            self.trace({"staleness_policy": {**record, "epoch": self.epoch}})  # 0-based there
        return record

    async def _step(self, groups: Groups) -> None:
        setting = self.staleness.setting
        if await self.steps.run(groups, self.learning_rate, self._publish, self.version, setting):
            self.maybe_step()
        else:
            self._fail(self.steps.failure)

    def _publish(self, outcome: StepOutcome, rate: float) -> None:
        """Steps are done: a version each (staleness, ledger, hooks), weights to workers."""
        now = time.monotonic()
        if outcome.applied:  # first: it may have refused others (NaN) in the same pass
            self.divergence.applied()
        for pending, reason in outcome.refused:  # not finite, or implausible norms
            self._refuse_queued(pending, reason, numeric=True)
        if outcome.snapshot is None:
            return
        self.rule.publish(outcome.snapshot)  # with its version, on the event loop
        self.digest, self.published_from = outcome.digest, self.version  # before this pass's
        self.stats.record_pass()
        last = outcome.applied[-1] if outcome.applied else None
        seconds = outcome.seconds / max(len(outcome.applied), 1)  # of each step
        for batch in outcome.applied:
            base = self.version
            self.version += 1
            for pending in batch:
                staleness = base - pending.message.base_version
                pending.session.settle_applied(staleness, now)
                self.stats.record_staleness(staleness)
                self.book.record_applied(pending.frames)
            event = bunch_event(batch, self.version, self.epoch, rate)
            self.stats.record_step(len(batch), event.patterns, seconds)
            self.hooks.call("after_bunch", event)
            if self.trace is not None:
                digest = self.digest if batch is last else None
                self.trace(trace_record(batch, self.version, self.epoch, rate, digest))
        holders = self.book.holders()  # idle ones get theirs with a lease: wants_weights
        for session in filter(lambda s: s.wants_weights(holders), self.sessions.values()):
            self.send_weights(session)
        if self.book.epoch_complete:
            self._end_epoch()
            self.steps.mark_boundary()

    def _count_refused(self, session: WorkerSession, reason: str, numeric: bool,
                       at_once: bool = False) -> None:  # fmt: skip
        session.refused(numeric)  # settled: the worker may send more
        self.stats.record_refused()  # at_once: the run has diverged (np: no bunch without it)
        if numeric and (why := self.divergence.say(reason) if at_once else
                        self.divergence.refuse(session, reason, self.version)):  # fmt: skip
            self._fail(why)  # every update refused, none applied: it cannot train on

    def _refuse_queued(self, pending: PendingUpdate, reason: str, numeric: bool = False) -> None:
        """Refuse a queued update at step time: its frames go back, the worker is told."""
        session, message = pending.session, pending.message
        session.clock.settled(time.monotonic())
        self.book.unaccept(pending.frames)
        self.stats.record_train(-message.patterns, -message.correct, -message.loss_sum)
        self._count_refused(session, reason, numeric)
        session.warn("refused update from %s: %s", session.name, reason)
        refusal = ErrorMessage(RejectedUpdate.code, reason, False, message.lease_id, message.offset)
        if session.state != "gone":  # a departed worker is told nothing (and owes nothing)
            session.send(refusal)
            self.send_weights(session)
        self.fill_leases()

    # ------------------------------------------------------------ epochs

    def _start_epoch(self, epoch: int) -> None:
        """Shuffle and lease the frames of ``epoch``."""
        self.epochs.start(epoch)
        self.book.start_epoch(epoch)
        self.idle.start_epoch(self.sessions.values())
        self.stats.start_epoch(epoch, self.learning_rate)
        self.hooks.call("before_epoch", epoch, self.learning_rate)
        if self.sessions:
            self.fill_leases()

    def _end_epoch(self) -> None:
        epoch = self.epoch
        self.stats.end_epoch(epoch, self.version, self.book.ledger.summary())
        self.idle.end_epoch(epoch, self.sessions.values(), self.book.granted)
        self.evaluations.add(epoch, self.version, self.rule.model)
        following = self.epochs.epoch_trained(epoch)
        if following is not None:
            self._start_epoch(following)
        self.assign_evaluations()

    def assign_evaluations(self) -> None:
        self.scoring.assign()

    def on_eval_result(self, session: WorkerSession, message: EvalResult) -> None:
        self.scoring.result(session, message)

    def _fail(self, reason: str) -> None:
        if self.on_failure is not None:
            self.on_failure(reason)

    def _accept_cv(self, job: EvalJob, message: EvalResult) -> None:
        self.stats.record_cv(message.epoch, message.frames, message.correct, message.loss_sum)
        self._apply_decision(message, self.epochs.cv_result(message.epoch, job.weights, message))

    def _apply_decision(self, result: EvalResult, decision: EpochDecision) -> None:
        if decision.restore is not None:  # roll back: a new version, sent to every worker
            self.traffic.hold()  # np: the slices are cut anew once the roll-back is done
            self.rule.load(decision.restore)
            self.runner.forget_weights()
            self.published_from, self.version = self.version, self.version + 1
            self.digest = weights_digest(self.rule.snapshot)
            for session in self.sessions.values():
                self.send_weights(session)
        kept = self.stats.mark_kept(result.epoch, decision.kept, self.version)
        self.hooks.call("after_epoch", kept)
        if decision.next_epoch is not None:
            self._start_epoch(decision.next_epoch)
        if decision.finish:
            self.hooks.call("after_training")
            self.finished.set()
        self.steps.offer(True)  # before the results are written: on_finished may stop
        if decision.finish and self.on_finished is not None:
            self.on_finished()
        if decision.restore is not None:
            self.traffic.restart()

    def resume_at(self, version: int, digest: str, earlier: dict[str, Any], finished: bool) -> None:
        """Go on from ``version`` (weights of ``digest``) after server/resume.py ran."""
        self.version, self.digest, self.earlier = version, digest, earlier
        if finished:
            self.finished.set()
