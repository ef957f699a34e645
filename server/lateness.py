"""What the server does about workers past their delivery deadline (issue 12, finding 2).

A worker is late when it holds frames, has no update queued or in the step being applied,
and has not delivered within its deadline since it last had to (the clock restarts when an
update of its is settled) (``ProgressWatch``: measured from its
own interval between updates). What being late costs depends on the mode's policy:

- ``revoke`` (async): it is not counted or waited for (``AsyncSteps``), and once the other
  workers have nothing left to do its undelivered leases are taken back (it is told:
  ``lease_revoked``, so it stops computing on them), given to them, and it gets no more
  until it delivers an update (any: a refused one shows it is alive, and the time it took
  still counts as its pace, so its next leases are judged by that);
- ``drop`` (sync): the round cannot go on without it, so it is dropped with the fatal
  ``round_deadline`` error and its frames go to the others; it may connect again at once.
  A latecomer (joined once training had made a step, nothing delivered yet) is revoked
  as in async mode instead, by the others' pace: the rounds do not wait for it
  (``SyncSteps``), and a silent one held each epoch's end to the round deadline, then came
  back.

In async mode a worker on time can still hold an epoch's end: one far slower than the
others (an emulated board beside numpy workers) still computing its last leases while they
have nothing left. Its undelivered frames are handed over to them when they would be done
far sooner (``slowest_at_the_end``), in the same way as a late worker's, counted apart
(``leases_handed_over``).

A CV evaluation not returned within its deadline is asked of another worker. These run
from ``check_progress``, which the server calls a few times a second.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import TYPE_CHECKING

from snet.protocol.messages import ROUND_DEADLINE, ErrorMessage
from snet.protocol.numbering import shown_epoch

from .progress import FAR_SLOWER, quickest
from .session import WorkerSession

if TYPE_CHECKING:
    from .training import Coordinator

log = logging.getLogger("snet.server")


def overdue(
    coordinator: Coordinator,
    session: WorkerSession,
    now: float,
    waiting: Container[int] | None = None,
) -> float:
    """Seconds ``session`` is past its deadline; <= 0 while it is not late or owes nothing.
    ``waiting``: the workers that wait on the server (``StepQueue.pending_workers()``), for
    a caller that asks of every worker (it is taken from the queue otherwise)."""
    started = session.clock.clock_start()
    if started is None:
        return 0.0  # it owes nothing
    if waiting is None:
        waiting = coordinator.steps.pending_workers()
    if session.worker_id in waiting:
        return 0.0  # it waits on the server
    return now - started - deadline(coordinator, session)


def deadline(coordinator: Coordinator, session: WorkerSession) -> float:
    """Seconds ``session`` may take for its next update."""
    others = [s.clock for s in coordinator.sessions.values() if s is not session]
    scoring = bool(coordinator.evaluations.held_by(session.worker_id))
    cv_frames = len(coordinator.plan.cv_frames) if scoring else 0
    # it would lose its connection (sync), unless it is a latecomer the rounds do not wait for
    patient = coordinator.policy.late_action == "drop" and not _latecomer(session)
    return coordinator.progress.deadline(session.clock, others, cv_frames, patient)


def _latecomer(session: WorkerSession) -> bool:
    """Joined once training had made a step, and has delivered nothing since: sync's rounds
    do not wait for it (server/policies.py), so its frames are taken back, not waited
    for, once the others run dry."""
    return session.joined_late and not session.proven


def is_late(
    coordinator: Coordinator,
    session: WorkerSession,
    now: float,
    waiting: Container[int] | None = None,
) -> bool:
    return overdue(coordinator, session, now, waiting) > 0


def check_progress(coordinator: Coordinator, now: float) -> None:
    """Act on the workers past their deadline, as the mode's policy says."""
    if coordinator.closed or coordinator.finished.is_set():
        return
    waiting = coordinator.steps.pending_workers()
    late = [s for s in coordinator.sessions.values() if is_late(coordinator, s, now, waiting)]
    if coordinator.policy.late_action == "drop":
        for session in [s for s in late if not _latecomer(s)]:
            _drop(coordinator, session, now)
        late = [s for s in late if _latecomer(s)]  # a silent one held each epoch's end 12 s
    if late and coordinator.book.waiting_chunks == 0 and _someone_idle(coordinator, late):
        for session in late:
            _revoke(coordinator, session, now)
    if coordinator.policy.hands_over_the_end and coordinator.book.waiting_chunks == 0:
        _hand_over(coordinator, late, now)
    _reassign_evaluations(coordinator, now)
    coordinator.maybe_step()  # who counts for a step may have changed


def slowest_at_the_end(
    coordinator: Coordinator, late: list[WorkerSession], now: float
) -> tuple[WorkerSession, float, float] | None:
    """At an epoch's end (nothing left to lease), of the holders that would take far longer
    over their undelivered frames than the quickest idle worker (``FAR_SLOWER`` times,
    and longer by more than the deadline it is allowed for an update: ``stall_seconds``,
    or ten of its own intervals, what the server waits for it in any case), the one whose
    frames would save the most, with (its seconds, the idle worker's), at their paces
    (``DeliveryClock.pace``). On time, they were never late: an emulated board (0.2 s a
    bunch) beside a numpy worker held each epoch's end 15 s over its last two leases while
    the other, done in one, waited (a probe); async exists so that a slow machine delays
    nobody. What it delivered of a lease counts; the bunch it is computing is thrown away
    (its update is refused), and the one after it if that lease was all it held (the
    worker keeps its last work for one bunch: client/work.py). One a check: the idle
    workers' frames then, not the same idle worker's pace for every slow one."""
    holders = coordinator.book.holders()
    sessions = list(coordinator.sessions.values())
    idle = [s for s in sessions if s.worker_id not in holders and s not in late]
    fastest = quickest(s.clock for s in idle if s.proven and not s.probation)
    if fastest is None:
        return None
    slowest, saved = None, 0.0
    for session in sessions:
        pace, started = session.clock.pace, session.clock.clock_start()
        if session in late or session.worker_id not in holders or not pace or started is None:
            continue
        frames = coordinator.book.remaining_frames(session.worker_id)
        theirs = frames * pace - (now - started)  # into its current bunch already
        ours = frames * fastest
        gain = theirs - ours
        if theirs > FAR_SLOWER * ours and gain > max(saved, deadline(coordinator, session)):
            slowest, saved = (session, theirs, ours), gain
    return slowest


def _hand_over(coordinator: Coordinator, late: list[WorkerSession], now: float) -> None:
    found = slowest_at_the_end(coordinator, late, now)
    if found is None:
        return
    session, theirs, ours = found
    leases, frames = coordinator.desk.revoke(session, late=False)
    coordinator.stats.record_handed_over(leases)
    log.info("worker %s would take %.1f s more over its %d leases (%d frames), an idle "
             "worker %.1f s: they go to the idle", session.name, theirs, leases, frames,
             ours)  # fmt: skip
    coordinator.fill_leases()


def _someone_idle(coordinator: Coordinator, late: list[WorkerSession]) -> bool:
    holders = coordinator.book.holders()  # one pass: per worker would scan every lease
    return any(s not in late and s.worker_id not in holders for s in coordinator.sessions.values())


def _drop(coordinator: Coordinator, session: WorkerSession, now: float) -> None:
    allowed = deadline(coordinator, session)
    waited = overdue(coordinator, session, now) + allowed
    text = (
        f"missed the round deadline: no update in {waited:.1f} s (deadline {allowed:.1f} s); "
        "its frames go to the others"
    )
    log.warning("worker %s %s", session.name, text)
    coordinator.stats.record_late(dropped=True)
    session.send(ErrorMessage(ROUND_DEADLINE, text, True))
    session.close(text)  # the coordinator's remove_worker requeues its frames


def _revoke(coordinator: Coordinator, session: WorkerSession, now: float) -> None:
    waited = now - (session.clock.clock_start() or now)
    leases, frames = coordinator.desk.revoke(session)
    coordinator.stats.record_late(leases_revoked=leases)
    log.warning(
        "worker %s delivered nothing in %.1f s: its %d leases (%d frames) go to the others",
        session.name, waited, leases, frames,
    )  # fmt: skip
    coordinator.fill_leases()


def _reassign_evaluations(coordinator: Coordinator, now: float) -> None:
    def allowed(session: WorkerSession) -> float:
        others = [s.clock for s in coordinator.sessions.values() if s is not session]
        cv_frames = len(coordinator.plan.cv_frames)
        return coordinator.progress.scoring_deadline(session.clock, others, cv_frames)

    for session, job in coordinator.evaluations.overdue(now, allowed, coordinator.sessions):
        log.warning("worker %s did not score epoch %d in %.1f s: taken back from it",
                    session.name, shown_epoch(job.epoch), now - job.assigned_at)  # fmt: skip
        session.hold_scoring()  # not asked again before it delivers something
    coordinator.assign_evaluations()
