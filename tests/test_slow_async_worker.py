"""A slow but steady async worker gets its updates applied (server/lateness.py).

An outside audit's worker at 2.5 s a bunch beside fast ones had every update refused
("lease N is not held by this worker"): its first lease was taken back at the 2 s floor
its newcomer's deadline got from the others' pace, and since the update it then sent was
for frames it no longer held, the server learnt no pace of its own for it: every later
lease went the same way.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from snet.client.data import HeldLease
from snet.client.work import WorkQueue
from snet.protocol.job import JobSpec
from snet.protocol.messages import Lease
from snet.server.leases import LeaseBook
from snet.server.leasing import LeaseDesk
from snet.server.session import WorkerSession

from inprocess import Lab, LabServer, wait_until
from short_data import short_job
from slow_backend import Slow


async def _run(lab: Lab, *flags: str) -> dict[str, Any]:
    """A 2-epoch async run of a fast worker (20 ms a bunch) and one at 1 s a bunch, in
    leases of one bunch; the slow one's row in the final /status. The fast one runs dry at
    each epoch's end while the slow one holds a lease: the moment a late worker's leases
    are taken back. The least deadline is 0.4 s, not the default 2 s: the audit's case (a
    bunch of 2.5 s against the 2 s floor) at a fraction of its time."""
    server = await lab.server(
        "--mode", "async", "--epochs", "2", "--min-workers", "2", *short_job(),
        "--chunk-frames", "512", "--stall-seconds", "0.4", *flags,
    )  # fmt: skip
    _, rows = await _trained_beside(lab, server, 0.02, 1.0)
    row = rows["slow"]
    assert row["update_interval"] == pytest.approx(1.0, abs=0.4), row  # its own pace
    return row


async def _trained_beside(
    lab: Lab, server: LabServer, fast: float, slow: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``server``'s job trained by a worker "fast" and one "slow" at those seconds a bunch:
    the final status and its worker rows by name, every epoch's frames applied once."""
    lab.worker(server, "fast", backend=Slow(fast))
    lab.worker(server, "slow", backend=Slow(slow))
    assert await server.wait(120) == "trained"
    status = server.final_status()
    for epoch in status["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0, ledger
    return status, {row["name"]: row for row in status["workers"]}


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the server's deadlines
async def test_a_worker_slower_than_its_first_allowance_loses_one_lease_not_all(
    lab: Lab,
) -> None:
    """A worker slower than the others' floor (async gives a first update no allowance of
    its own: ``--join-seconds`` is sync's) has its first lease taken back, but the update
    it still sends for it, refused, gives the server its pace: its later leases are its
    own (before: 0 of its updates applied, 1 refused, 3 leases taken back)."""
    slow = await _run(lab, "--join-seconds", "0")
    assert slow["leases_revoked"] == 1 and slow["updates_rejected"] <= 1, slow
    assert slow["updates_sent"] >= 2, slow
    assert "taken back: no update in time" in lab.log("slow")  # it was told


def test_a_worker_told_its_lease_was_taken_back_drops_what_is_left_of_it() -> None:
    """``lease_revoked``: the frames left of that lease are not computed (another worker
    trains them; their updates would be refused), the other leases stay in order; the
    last one stays for one bunch (a worker left with nothing was leased nothing again;
    one that computed all of it had every bunch refused, and sync rounds waited)."""
    work = WorkQueue()
    for lease_id in (4, 5, 6):
        indices = np.arange(lease_id * 100, lease_id * 100 + 8)
        work.leases.append(HeldLease(Lease(lease_id, 0, indices), indices))
    work.advance(3)  # three frames of lease 4 sent
    work.revoke(5)
    assert [held.lease.lease_id for held in work.leases] == [4, 6] and work.offset == 3
    work.revoke(4)  # the one being trained: the next starts at its beginning
    assert [held.lease.lease_id for held in work.leases] == [6] and work.offset == 0
    work.revoke(4)  # already done or dropped: nothing to do
    assert work.next_bunch(8)[1:2] == (0,)
    work.revoke(6)  # its last work: kept, so that an update shows the server it is alive
    assert [held.lease.lease_id for held in work.leases] == [6]
    indices = np.arange(700, 708)
    work.leases.append(HeldLease(Lease(7, 0, indices), indices))  # leased once it delivers
    lease, offset, frames = work.next_bunch(2)
    assert (lease.lease_id, offset, len(frames)) == (6, 0, 2)
    work.advance(2)  # one bunch of the kept one, not the rest of it (each would be refused)
    assert [held.lease.lease_id for held in work.leases] == [7] and work.offset == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the server's deadlines
async def test_a_worker_whose_lease_is_taken_back_before_it_starts_trains_after(
    lab: Lab,
) -> None:
    """Its start-up lasts until its only lease has been taken back (it took 5 s, the
    deadline 2 s): it dropped it when told, sent no update, and the server leased nothing
    to it again (found by a review: 0 updates in 4 epochs). It keeps its last work: the
    refused update for it shows it alive."""
    server = await lab.server("--mode", "async", "--epochs", "3", "--min-workers", "2",
                              *short_job(), "--chunk-frames", "512")  # fmt: skip
    started = threading.Event()
    lab.worker(server, "fast", backend=Slow(0.01))
    lab.worker(server, "starter", backend=Slow(0.01, started))
    await wait_until(lambda: _revoked(server, "starter"), 60, "its lease to be taken back")
    started.set()
    assert await server.wait(120) == "trained"
    row = {r["name"]: r for r in server.final_status()["workers"]}["starter"]
    assert row["leases_revoked"] >= 1, row  # the case: taken back before it started
    assert row["updates_sent"] > row["updates_rejected"] >= 1 and not row["probation"], row


def test_a_late_scorer_is_not_asked_to_score_but_is_still_leased() -> None:
    """A worker late with a CV score was put on the leases' probation: idle (scorers are
    chosen among the idle), it held no lease, so it never delivered an update to lift it,
    and was leased nothing for the rest of the run (a review). Now it is only not asked
    to score again before it delivers (``scoring_held``); probation stays for leases taken
    back."""
    job = JobSpec(bunch_size=4, chunk_frames=8)
    book = LeaseBook.for_job(job, np.arange(64), 64, 8)
    book.start_epoch(0)
    desk = LeaseDesk(book, SimpleNamespace(send=lambda *_: None), 1)  # type: ignore[arg-type]
    sent: list[object] = []
    session = WorkerSession(1, "scorer", "", "numpy", (), sent.append, lambda _: None)
    session.scoring_held = True
    desk.fill([session], 0.1)
    assert [m.lease_id for m in sent if isinstance(m, Lease)] == [1]  # a newcomer's one
    session.probation, sent[:] = True, []
    desk.fill([session], 0.1)
    assert sent == []  # taken back: none until it delivers


async def _revoked(server: LabServer, name: str) -> bool:
    rows = {row["name"]: row for row in (await server.status())["workers"]}
    return name in rows and rows[name]["leases_revoked"] > 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the server's deadlines
async def test_a_far_slower_worker_hands_its_last_leases_to_an_idle_one(lab: Lab) -> None:
    """An emulated board (0.2 s a bunch) beside a numpy worker held each epoch's end 15 s
    over its last leases, on time, never late, while the other had nothing left (a probe).
    Here a worker at a board's 0.2 s a bunch beside one at 2 ms, whose first leases (about
    14 bunches of 64 each) outlast the other's epoch: what it has not delivered when the
    other runs dry goes to the other (what it delivered counts), it is told, and the
    refusal of the bunch it was computing is no warning. (Leases granted near an epoch's
    end are smaller, a bunch at the last: server/leases.py; the early ones of a worker
    this slow are what held the end.)"""
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--min-workers", "2", *short_job(),
        "--bunch-size", "64", "--stall-seconds", "0.4",
    )  # fmt: skip
    status, rows = await _trained_beside(lab, server, 0.002, 0.2)
    slow, fast = rows["slow"], rows["fast"]
    assert slow["leases_handed_over"] >= 1 and slow["leases_revoked"] == 0, slow  # on time
    assert fast["leases_handed_over"] == 0 and fast["leases_revoked"] == 0, fast
    assert status["leases_handed_over"] == slow["leases_handed_over"]
    assert slow["updates_sent"] - slow["updates_rejected"] >= 2, slow  # its share counted
    assert "handed over: an idle worker trains it sooner" in lab.log("slow")
    warned = [line for line in lab.log("server").splitlines() if line.startswith("WARNING")]
    assert not [line for line in warned if "refused update" in line], warned


def test_the_cv_set_goes_to_a_worker_not_far_slower_than_the_quickest() -> None:
    """The scorer was the worker with the fewest frames left: an emulated board whose last
    leases had just been handed over (none left), at 0.2 s a bunch, scored while the numpy
    worker waited (the epoch's score 1.5 s late). A worker far slower than the quickest
    scores only if no other can; among the others, the fewest frames left, as before (the
    paces' noise between workers of one speed sent it to one still training)."""
    from snet.server.evaluations import Evaluations

    def worker(worker_id: int, name: str, seconds: float) -> WorkerSession:
        session = WorkerSession(worker_id, name, "", "numpy", (), lambda _: None, lambda _: None)
        session.clock.got_work(0.0)
        session.clock.update_arrived(1.0, 64, seconds)  # proven, its pace measured
        return session

    board, fast = worker(1, "board", 0.2), worker(2, "numpy", 0.002)
    twin = worker(3, "twin", 0.0016)
    left = {1: 0, 2: 0, 3: 640}  # frames each still holds
    evaluations = Evaluations()
    evaluations.add(0, 5, np.zeros(3, np.float32))
    ((chosen, _),) = evaluations.assign([board, fast, twin], left.__getitem__, 2.0)
    assert chosen.name == "numpy"  # not the board; not its twin, a little quicker but busy
    evaluations.add(1, 6, np.zeros(3, np.float32))
    ((chosen, _),) = evaluations.assign([board, twin], left.__getitem__, 3.0)
    assert chosen.name == "twin"  # busy, but the board is far slower
    evaluations.add(2, 7, np.zeros(3, np.float32))
    ((chosen, _),) = evaluations.assign([board], left.__getitem__, 4.0)
    assert chosen.name == "board"  # when none else can


def test_a_scorer_past_its_deadline_keeps_a_job_nobody_else_may_take() -> None:
    """An emulated board, the only worker --verify-cv left to score an epoch (the other
    had scored it), overran its scoring deadline: the job was taken back and given to it
    again at each deadline, 27 times in 4 epochs, and it computed every copy (a review).
    A job is taken back only for a proven worker to have, never for the late one again;
    one nobody else may take waits four deadlines, and then the server scores it (a
    scorer that never answered held a newbob run: a review)."""
    from snet.server.evaluations import SELF_SCORE_FACTOR, Evaluations

    def worker(worker_id: int, name: str, proven: bool = True) -> WorkerSession:
        session = WorkerSession(worker_id, name, "", "numpy", (), lambda _: None, lambda _: None)
        if proven:
            session.clock.got_work(0.0)
            session.clock.update_arrived(1.0, 64, 0.01)
            session.settle_applied(0, 1.0)  # an update of its applied: proven
        return session

    board, fast = worker(1, "board"), worker(2, "numpy")
    sessions = {1: board, 2: fast}
    evaluations = Evaluations(copies=2)  # --verify-cv: two scorers an epoch
    evaluations.add(0, 5, np.zeros(3, np.float32))
    assert len(evaluations.assign([board, fast], lambda _: 0, 1.0)) == 2  # one each
    assert evaluations.overdue(10.0, lambda _: 3.6, sessions) == []  # both keep theirs
    newcomer = worker(3, "newcomer", proven=False)  # a newcomer is no one to give it to
    sessions[3] = newcomer
    assert evaluations.overdue(10.0, lambda _: 3.6, sessions) == []
    third = worker(4, "third")
    sessions[4] = third
    ((late, job),) = evaluations.overdue(10.0, lambda _: 3.6, sessions)  # one taker: one
    late.hold_scoring()  # as lateness.py does
    ((chosen, again),) = evaluations.assign(sessions.values(), lambda _: 0, 10.0)
    assert chosen is third and again is job and late.worker_id in job.taken_from
    # nobody answers from now on: the jobs go round the workers, never back to one that
    # was late with them, and when none is left the server scores the epoch itself
    given = {(s.worker_id, j.copy) for s in sessions.values() for j in evaluations.held_by(
        s.worker_id)}  # fmt: skip
    now, stranded = 10.0, []
    for _ in range(20):
        now += SELF_SCORE_FACTOR * 3.6 + 1
        for session, _ in evaluations.overdue(now, lambda _: 3.6, sessions):
            session.hold_scoring()
        for session, job in evaluations.assign(sessions.values(), lambda _: 0, now):
            assert session.worker_id not in job.taken_from
            given.add((session.worker_id, job.copy))
        if stranded := evaluations.refused_everywhere(sessions.values()):
            break
    assert [job.epoch for job in stranded] == [0]
    assert len(given) <= 2 * len(sessions)  # each copy at most once to each worker


def test_a_pace_is_never_quicker_than_the_server_sees() -> None:
    """Who gets an epoch's last frames and the CV set follows a worker's pace: from its own
    compute_seconds alone, a peer claiming 1e-9 s a pattern had every other worker's last
    leases handed to it. Its pace is never less than its interval between updates shows."""
    from snet.server.progress import DeliveryClock

    clock = DeliveryClock(joined_at=0.0)
    clock.got_work(0.0)
    clock.update_arrived(0.5, 64, 1e-9 * 64)  # its first: start-up, no interval yet
    assert clock.pace == pytest.approx(1e-9)
    for second in (1.0, 1.5, 2.0):  # one update each half second, 64 patterns
        clock.update_arrived(second, 64, 1e-9 * 64)
    assert clock.pace == pytest.approx(0.5 / 64)
    honest = DeliveryClock(joined_at=0.0)  # a reported time above its interval stands
    honest.got_work(0.0)
    for second in (0.5, 1.0):
        honest.update_arrived(second, 64, 0.6)
    assert honest.pace == pytest.approx(0.6 / 64)


def test_a_refusal_on_a_lease_taken_back_is_expected_twice_at_most_never_for_its_numbers() -> None:
    """The refusal of the bunch a worker was computing on a lease taken back (and of the
    next, if it was its last) is information; more on the same lease, or one refused for
    its numbers, is a warning within the peer's budget (a peer could resend for ever)."""
    from snet.protocol.errors import RejectedUpdate

    session = WorkerSession(1, "w", "", "numpy", (), lambda _: None, lambda _: None)
    session.taken_back([7, 8], late=False)
    assert (session.leases_handed_over, session.leases_revoked) == (2, 0)
    assert not session.expected_refusal(RejectedUpdate("not finite", 7, 0, numeric=True))
    assert [session.expected_refusal(RejectedUpdate("not held", 7, 0)) for _ in range(3)] == [
        True, True, False,
    ]  # fmt: skip
    assert not session.expected_refusal(RejectedUpdate("not held", 9, 0))
    assert session.expected_refusal(RejectedUpdate("not held", 8, 0))


def test_only_async_gradients_hand_the_end_over() -> None:
    """bmuf's async blocks would lose a worker's whole block: they keep their leases."""
    from snet.server.policies import make_step_policy

    jobs = {"sync": JobSpec(mode="sync"), "async": JobSpec(mode="async"),
            "np": JobSpec(mode="np"), "bmuf async blocks": JobSpec(mode="bmuf", block_sync=False),
            "bmuf sync blocks": JobSpec(mode="bmuf", block_sync=True)}  # fmt: skip
    handing = {name for name, job in jobs.items() if make_step_policy(job).hands_over_the_end}
    assert handing == {"async"}


@pytest.mark.parametrize("late", [True, False])
def test_an_epoch_without_frames_after_a_handover_is_no_warning(
    late: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A far slower worker whose last leases went to the others at an epoch's end may train
    on nothing the next epoch: expected, an info line; after a late revocation a warning."""
    from snet.server.idleness import IdleWatch

    session = WorkerSession(1, "board", "", "spert", (), lambda _: None, lambda _: None)
    session.taken_back([4], late=late)
    watch = IdleWatch()
    watch.start_epoch([session])
    with caplog.at_level("INFO", logger="snet.server"):
        assert watch.end_epoch(1, [session], {}) == [session]
    (record,) = [r for r in caplog.records if "trained on no frames" in r.getMessage()]
    assert record.levelname == ("WARNING" if late else "INFO")
    assert ("handed over" in record.getMessage()) is not late
