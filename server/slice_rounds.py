"""``SliceRounds``: network-parallel (``np``) training's part of the coordinator.

The coordinator (training.py) holds it in np mode and hands it, through a small explicit
interface, the events where np differs from the pattern-parallel modes: a worker joins
(``joined``) or leaves (``leaving``, ``left``), frames are to be handed out (``fill``), a
worker sends a slice message (``on_message``), wants frames inline or sends an update
(refused), newbob rolls back (``hold``, ``restart``); the server scores each epoch's CV
(cv_scoring.py). The rest (sessions, frame order, epochs, CV bookkeeping, stats, hooks,
checkpoints) stays the coordinator's, asked through ``CoordinatorParts``' callables.

No worker is leased frames or sends updates. The part takes the frames from the lease
book as one lone worker would (so the bunches are those of sequential training), and
runs each bunch through every slice holder: ``np_bunch`` with the frame indices out,
``np_partial`` back from each, the ``SliceMaster`` sums them and sends the error out
with the next bunch. With ``np_pipeline`` two bunches are in flight.

Who holds which hidden units changes only at a quiet moment: when a worker joins or
leaves, the bunches in flight are finished (join) or abandoned (leave: their frames go
back to the queue), every holder reports its slice, and the units are cut anew among the
workers present from the copies the master holds. A departed worker's units come back as
of its last report (at most ``COLLECT_EVERY`` bunches old); with no worker left training
waits, the whole network held by the server, until one joins.

Each completed bunch is a version. The element the server publishes (/weights, CV,
checkpoints, the final weights) is the one assembled at the last report: reports are
asked every ``COLLECT_EVERY`` bunches and at every epoch end, before the CV evaluation.
A bunch's frames are recorded as applied in the lease book's ledger only once the slices
that include it are reported, so a checkpoint's ledger counts exactly its element's, and
its version and figures leave out the bunches after the report (``not_in_weights``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from snet.protocol.errors import ConfigError, RejectedUpdate
from snet.protocol.hooks import BunchEvent, HookSet
from snet.protocol.job import JobSpec
from snet.protocol.memory import stated_memory
from snet.protocol.messages import (
    ErrorMessage,
    FramesWanted,
    NpBunch,
    PartialOutputs,
    SliceState,
)
from snet.protocol.numbering import counted
from snet.protocol.slices import HiddenSlice

from .epochs import EpochControl
from .idleness import IdleWatch
from .leases import LeaseBook
from .pool import Received
from .session import WorkerSession
from .slice_master import COLLECT_EVERY, AssembledElement
from .stats import BunchFigures, TrainingStats
from .stepqueue import StepQueue

log = logging.getLogger("snet.server")

LONE = 0  # the lease book's worker id for the frames np mode trains (real ids start at 1)
NO_BUNCH = -1
# Workers whose measured speeds differ less than this get equal slices: the noise of a
# measurement must not hand a board more units than its memory holds.
SPEED_SPREAD = 1.5


@dataclass
class BunchRound:
    """One bunch on its way through the slice holders."""

    bunch: int
    lease_id: int
    offset: int
    frames: np.ndarray
    sent_at: float
    partials: dict[int, np.ndarray] = field(default_factory=dict)
    slowest: float = 0.0  # the longest compute a holder reported for it (the barrier waits)


@dataclass(frozen=True)
class CoordinatorParts:
    """What ``SliceRounds`` uses of the coordinator that holds it: its parts (each keeps
    its own state), what it reads, and what it asks the coordinator to do."""

    book: LeaseBook
    epochs: EpochControl
    stats: TrainingStats
    hooks: HookSet
    idle: IdleWatch
    steps: StepQueue
    sessions: Mapping[int, WorkerSession]  # the workers present (read only)
    closed: Callable[[], bool]  # shutting down: no new bunch
    finished: Callable[[], bool]  # the job is done
    bunch_applied: Callable[[], int]  # a bunch completed: its version (a new one)
    assembled: Callable[[], None]  # the rule's element changed: publish its digest
    end_epoch: Callable[[], None]  # every bunch of the epoch is done and reported
    # an answer refused (session, why, for its numbers, the run's end at once if so)
    refused: Callable[[WorkerSession, str, bool, bool], None]


class SliceRounds:
    """Runs bunches through the slice holders instead of leasing frames to workers: np
    mode's traffic (server/traffic.py)."""

    whole_weights = False  # each worker holds a slice, sent it by ``_reslice``

    def __init__(
        self, job: JobSpec, rule: AssembledElement, labels: np.ndarray, min_workers: int,
        parts: CoordinatorParts,
    ) -> None:  # fmt: skip
        self.job, self.rule, self.master, self.labels = job, rule, rule.master, labels
        self.min_workers = min_workers
        self.book, self.epochs, self.stats = parts.book, parts.epochs, parts.stats
        self._cut: dict[int, tuple[int, int]] = {}  # the units each holds, as last said
        self.parts = parts
        self.depth = 2 if job.np_pipeline else 1
        self.in_flight: dict[int, BunchRound] = {}
        self.next_bunch = 0
        self.cursor: tuple[int, np.ndarray] | None = None  # (lease id, indices) being cut
        self.cursor_offset = 0
        self.quiet_for = ""  # why no new bunch starts now ("": none): reslice, epoch_end
        self.collecting = False  # reports asked for and not all in
        self.since_collect = 0
        self.speeds: dict[int, float] = {}  # worker id -> measured unit-patterns per second
        self.capacity: dict[int, int] = {}  # worker id -> the most units its memory holds
        self.partials_ignored = 0  # of bunches abandoned when a holder left
        self.reports_ignored = 0  # answers to a request a newer one overtook
        self.last_completed = NO_BUNCH
        self.collect_bunch = NO_BUNCH
        self.unrecorded: list[tuple[int, np.ndarray, BunchFigures]] = []  # done, not reported

    @property
    def sessions(self) -> Mapping[int, WorkerSession]:
        return self.parts.sessions

    # ------------------------------------------------------------ workers

    def joined(self, session: WorkerSession) -> None:
        """A worker joined (after the coordinator welcomed it): re-slice at a quiet moment.
        The memory it states (protocol/memory.py) bounds the slice it is cut."""
        try:
            stated = stated_memory(session.capabilities)
        except ConfigError as exc:
            session.send(ErrorMessage("bad_job", str(exc), True))
            session.close(str(exc))
            return
        if stated is not None:
            self.capacity[session.worker_id] = stated.units_held(self.job.network,
                                                                 self.job.bunch_size)  # fmt: skip
        if session.worker_id in self.sessions and not self.parts.finished():
            self._quiesce("reslice")

    def leaving(self, session: WorkerSession) -> bool:
        """A worker is leaving (before the coordinator refills): whether it held units;
        if so no bunch may go to it, and the frames of the bunches in flight go back."""
        held = session.worker_id in self.master.holders and not self.parts.finished()
        if held:
            self.master.depart(session.worker_id)
            self.book.worker_gone(LONE)
            self.in_flight.clear()
            self.cursor = None
            self.quiet_for = self.quiet_for or "reslice"
            log.warning("np: %s left holding units; re-slicing", session.name)
        return held

    def left(self, session: WorkerSession, held: bool) -> None:
        """A worker has left (the coordinator is done with it): its units are cut anew."""
        self.speeds.pop(session.worker_id, None)
        self.capacity.pop(session.worker_id, None)
        if held:
            self._quiesce("reslice")

    def fill(self) -> None:
        """Start bunches (the pattern-parallel modes lease frames here; none while CV waits)."""
        self._pump()

    def frames_wanted(self, session: WorkerSession, message: FramesWanted) -> None:
        """np mode sends no frames: every bunch goes to every worker, which reads it."""
        text = f"np mode needs every worker to read the data itself ({message.reason[:200]})"
        text += "; np does not send frames inline"
        log.warning("worker %s cannot take part: %s", session.name, text)
        session.send(ErrorMessage("bad_job", text, True))
        session.close(text)

    def on_update(self, session: WorkerSession, received: Received) -> None:
        """Workers send partial outputs, not updates: RejectedUpdate (nothing kept)."""
        raise RejectedUpdate("np mode: workers send partial outputs, not updates")

    # ------------------------------------------------------------ slices

    def on_message(self, session: WorkerSession, message: PartialOutputs | SliceState) -> None:
        """A slice report or a bunch's partial outputs (RejectedUpdate if wrong; one not
        finite also says the run has diverged: server/divergence.py)."""
        try:
            self._take(session, message)
        except RejectedUpdate as refusal:  # counted, as a refused update is; its numbers:
            self.parts.refused(session, (  # no bunch completes without every slice
                f"{refusal} (at worker {session.name}'s answer for bunch {message.bunch}), "
                "and in np mode no bunch completes without every slice"
            ), refusal.numeric, True)  # fmt: skip
            raise

    def _take(self, session: WorkerSession, message: PartialOutputs | SliceState) -> None:
        if isinstance(message, SliceState):
            if not self.collecting or message.bunch != self.collect_bunch:
                self.reports_ignored += 1  # asked for earlier, overtaken by a newer request
                return
            part = HiddenSlice(message.start, message.stop)
            self.master.take_report(session.worker_id, part, message.element, message.velocity)
            self._delivered(session, 0, 0.0)
            self._maybe_collected()
            return
        round_ = self.in_flight.get(message.bunch)
        if round_ is None:  # a bunch abandoned when a holder left
            self.partials_ignored += 1
            return
        if session.worker_id in round_.partials:
            raise RejectedUpdate(f"a second partial output for bunch {message.bunch}")
        self.master.check_partial(session.worker_id, message.partial, len(round_.frames))
        round_.partials[session.worker_id] = message.partial
        round_.slowest = max(round_.slowest, message.compute_seconds)
        self._delivered(session, len(round_.frames), message.compute_seconds)
        units = self.master.holders[session.worker_id].units
        session.delivered(len(round_.frames), message.compute_seconds)
        if message.compute_seconds > 0:
            speed = units * len(round_.frames) / message.compute_seconds
            earlier = self.speeds.get(session.worker_id, speed)
            self.speeds[session.worker_id] = 0.8 * earlier + 0.2 * speed
        self._complete_bunches()

    def _complete_bunches(self) -> None:
        """Bunches complete in order: sum, step the output biases, send the error."""
        while self.in_flight:
            bunch, round_ = next(iter(self.in_flight.items()))
            if set(round_.partials) != set(self.master.holders):
                return
            del self.in_flight[bunch]
            labels = self.labels[round_.frames]
            partials = [round_.partials[w] for w in sorted(round_.partials)]
            delta, loss, correct = self.master.combine(partials, labels, bunch)
            patterns, rate = len(round_.frames), self.epochs.rate
            self.master.step_output(delta, patterns, rate)
            self.master.bunch_done(round_.slowest)
            # Recorded as applied once the slices that include it are reported: a
            # checkpoint's ledger then holds exactly the bunches in its element.
            frames = self.book.accept(LONE, round_.lease_id, round_.offset, patterns)
            figures = BunchFigures(len(partials), patterns, correct, loss)
            self.unrecorded.append((bunch, frames, figures))
            version = self.parts.bunch_applied()
            self.last_completed = bunch
            self.since_collect += 1
            self.stats.record_train(patterns, correct, loss)
            self.stats.record_step(len(partials), patterns, time.monotonic() - round_.sent_at)
            self.stats.record_pass()
            event = BunchEvent(self.epochs.epoch, version, 1, patterns, correct, loss, rate)
            self.parts.hooks.call("after_bunch", event)
            if not self.in_flight and not self.book.waiting_chunks and not self.book.leases_out:
                self.quiet_for = "epoch_end"  # every bunch of the epoch is done
            quiet_now = bool(self.quiet_for) and not self.in_flight
            collect = quiet_now or self.since_collect >= COLLECT_EVERY
            self._pump(NpBunch(NO_BUNCH, bunch, rate, patterns, collect, error=delta))

    def _pump(self, error: NpBunch | None = None) -> None:
        """Start bunches while fewer than ``depth`` are in flight; the first carries
        ``error`` (the last completed bunch's), else it goes alone."""
        while not self.quiet_for and not self.parts.closed() and len(self.in_flight) < self.depth:
            if not self.master.holders or self.epochs.waiting_for_cv:
                break
            round_ = self._next_round()
            if round_ is None:
                break
            self.in_flight[round_.bunch] = round_
            base = error or NpBunch(NO_BUNCH, NO_BUNCH, 0.0, 0, False)
            self._send_all(replace(base, bunch=round_.bunch, indices=round_.frames))
            error = None
        if error is not None:
            self._send_all(error)

    def _next_round(self) -> BunchRound | None:
        if self.cursor is None or self.cursor_offset >= len(self.cursor[1]):
            lease = self.book.grant(LONE, 1)
            if lease is None:
                return None
            self.stats.leasing(True)  # the epoch's time runs from its first bunch
            self.cursor, self.cursor_offset = (lease.lease_id, lease.indices), 0
        lease_id, indices = self.cursor
        offset = self.cursor_offset
        frames = indices[offset : offset + self.job.bunch_size]
        self.cursor_offset += len(frames)
        self.next_bunch += 1
        return BunchRound(self.next_bunch - 1, lease_id, offset, frames, time.monotonic())

    def _send_all(self, message: NpBunch) -> None:
        if self.parts.closed():
            return
        if message.collect:  # every holder reports its slice as of the last completed bunch
            self.collecting, self.collect_bunch = True, self.last_completed
            self.master.reported.clear()
        now = time.monotonic()
        for worker_id in self.master.holders:
            session = self.sessions[worker_id]
            session.send(message)
            if message.bunch >= 0 or message.collect:
                session.clock.got_work(now)  # it owes an answer: late ones are dropped

    def _delivered(self, session: WorkerSession, patterns: int, seconds: float) -> None:
        """An answer came: its delivery clock (server/lateness.py) runs on only while it
        owes another (a partial of a bunch in flight, or a report)."""
        session.clock.update_arrived(time.monotonic(), patterns, seconds)
        wid = session.worker_id
        owes_report = self.collecting and wid not in self.master.reported
        if not owes_report and all(wid in r.partials for r in self.in_flight.values()):
            session.clock.ran_dry()

    # ------------------------------------------------------------ quiet moments

    def _quiesce(self, why: str) -> None:
        """No new bunch until the ones in flight are done and every slice is reported;
        then ``why`` (an epoch's end, a re-slicing) is carried out."""
        if self.quiet_for != "epoch_end":  # an epoch end re-slices when it is done anyway
            self.quiet_for = why
        if self.in_flight:
            return  # the error of the last bunch in flight asks for the reports
        if self.master.holders:
            self._send_all(NpBunch(NO_BUNCH, NO_BUNCH, 0.0, 0, True))
        else:  # nobody to ask: the server's copies are all there is (units rolled back)
            self.collecting, self.collect_bunch = True, self.last_completed
            self._maybe_collected()

    def _maybe_collected(self) -> None:
        if not self.collecting or not self.master.all_reported:
            return
        self.collecting = False
        self.since_collect = 0
        self.rule.assemble()  # the assembled element: /weights, CV, checkpoints
        self.parts.assembled()
        reported = [frames for bunch, frames, _ in self.unrecorded if bunch <= self.collect_bunch]
        for frames in reported:
            self.book.record_applied(frames)
        self.unrecorded = self.unrecorded[len(reported) :]
        if not self.quiet_for or self.in_flight:
            return  # a periodic report: training goes on
        if self.quiet_for == "epoch_end":
            self.parts.idle.start_epoch(())  # every holder saw every bunch: nobody sat idle
            self.parts.end_epoch()  # the next epoch's bunches wait for the slices
        self._reslice()
        self.quiet_for = ""
        self.parts.steps.offer(True)
        self._pump()

    def holding_back(self) -> bool:
        """Before the first bunch, fewer than ``min_workers`` have joined: it waits (for a
        network no one board holds); once started, it goes on with whoever is there."""
        return self.next_bunch == 0 and len(self.sessions) < self.min_workers

    def _reslice(self) -> None:
        if not self.sessions or self.holding_back():
            self.master.holders.clear()
            return
        mean = float(np.mean(list(self.speeds.values()))) if self.speeds else 1.0
        speeds = {w: self.speeds.get(w, mean) for w in self.sessions}
        if max(speeds.values()) < SPEED_SPREAD * min(speeds.values()):
            speeds = dict.fromkeys(speeds, 1.0)  # alike: equal slices, not measuring noise
        grants = self.master.reslice(speeds, {w: self.capacity.get(w) for w in speeds})
        if self.master.memory_short:  # nobody is cut a slice: cut one a worker cannot
            # hold, it refused it and left for good (exit 4); now it stays, and all wait
            log.error("np: network %s: %s; training waits for more workers (or more memory)",
                      self.job.network.describe(), self.master.memory_short)  # fmt: skip
            return
        for worker_id, grant in grants.items():
            state = SliceState(grant.part.start, grant.part.stop, self.last_completed,
                               grant.weights, grant.velocity)  # fmt: skip
            self.sessions[worker_id].send(state)
        cut = {w: (p.start, p.stop) for w, p in self.master.holders.items()}
        said = f"np: hidden units cut among {counted(len(speeds), 'worker')}: {cut}"
        log.log(logging.INFO if cut != self._cut else logging.DEBUG, "%s", said)  # new ones
        self._cut = cut

    # ------------------------------------------------------------ epochs, resume

    def hold(self) -> None:
        """A roll-back (newbob) is being carried out: no bunch starts meanwhile."""
        self.quiet_for = "reslice"

    def restart(self) -> None:
        """The roll-back is done: the slices are cut anew from the restored element."""
        self.master.load(self.rule.weights)
        self.quiet_for = ""
        self._reslice()
        self._pump()

    def not_in_weights(self) -> list[BunchFigures]:
        """The bunches after the last report (not in a checkpoint's element or ledger)."""
        return [figures for _, _, figures in self.unrecorded]
