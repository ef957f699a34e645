"""Each mode's step decision, driven from a plain list of pending updates: no server."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from snet.client.policies import (
    make_compute_policy,
)
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.server.leases import LeaseBook
from snet.server.policies import (
    MAX_FUSED_STEPS,
    AsyncSteps,
    BlockDeltas,
    Combination,
    PendingView,
    QueueView,
    StepPolicy,
    SyncSteps,
    WorkerView,
    make_step_policy,
)
from snet.server.progress import STALL_FACTOR, DeliveryClock, ProgressWatch


def _view(
    pending: list[int],
    workers: int,
    computing: set[int],
    late: frozenset[int] = frozenset(),
    new: frozenset[int] = frozenset(),
) -> QueueView:
    """``pending``: the queued updates' workers, oldest first; ``computing``: the workers
    that still hold frames with no update for them; ``new``: not yet delivered."""
    return QueueView(
        tuple(PendingView(worker, 0) for worker in pending),
        tuple(WorkerView(i, i in computing, i in late, i not in new) for i in range(workers)),
        version=0,
    )


def _shape(view: QueueView, groups: list[list[int]]) -> list[list[int]]:
    return [[view.pending[index].worker_id for index in group] for group in groups]


def test_a_backlog_is_taken_as_consecutive_steps_up_to_the_limit() -> None:
    policy = AsyncSteps(updates_per_step=1)
    view = _view([0] * (MAX_FUSED_STEPS + 5), workers=1, computing={0})
    groups = policy.take(view)
    assert _shape(view, groups) == [[0]] * MAX_FUSED_STEPS
    assert groups == [[i] for i in range(MAX_FUSED_STEPS)]  # consecutive, oldest first
    rest = _view([0] * 5, workers=1, computing={0})  # the rest waits for the next pass
    assert _shape(rest, policy.take(rest)) == [[0]] * 5
    assert policy.take(_view([], workers=1, computing={0})) == []


def test_async_groups_keep_updates_per_step_and_wait_for_computing_workers() -> None:
    policy = AsyncSteps()  # one step per worker keeping up: 3 updates
    view = _view([0, 1, 2, 0, 1], workers=3, computing={0, 1, 2})
    assert _shape(view, policy.take(view)) == [[0, 1, 2]]
    rest = _view([0, 1], workers=3, computing={0, 1, 2})
    assert policy.take(rest) == []  # worker 2 is still computing: wait for it
    done = _view([0, 1], workers=3, computing={0, 1})  # ...until it has nothing left to send
    assert _shape(done, policy.take(done)) == [[0, 1]]


def test_async_never_waits_for_a_late_worker() -> None:
    """Issue 12: a joined worker that computes nothing froze every async step."""
    policy = AsyncSteps()
    view = _view([0, 1], workers=3, computing={0, 1, 2}, late=frozenset({2}))
    assert _shape(view, policy.take(view)) == [[0, 1]]  # sized for the two keeping up
    view = _view([0], workers=3, computing={1, 2}, late=frozenset({2}))
    assert policy.take(view) == []  # worker 1 keeps up and computes: wait for it


def test_async_does_not_wait_for_a_newcomers_first_update() -> None:
    policy = AsyncSteps()
    view = _view([0, 1], workers=3, computing={0, 1, 2}, new=frozenset({2}))
    assert _shape(view, policy.take(view)) == [[0, 1]]
    start = _view([0], workers=2, computing={0, 1}, new=frozenset({0, 1}))
    assert policy.take(start) == []  # at the start nobody has delivered: all are waited for


@pytest.mark.parametrize("computing", [0, 1])
def test_sync_takes_the_whole_round_once_nobody_is_expected(computing: int) -> None:
    policy = SyncSteps()
    view = _view([0, 1], workers=3, computing={2} if computing else set())
    groups = policy.take(view)
    assert _shape(view, groups) == ([] if computing else [[0, 1]])


def test_sync_waits_for_a_latecomer_only_once_it_has_delivered() -> None:
    """A peer that joined mid-run and said nothing held every round to its deadline, was
    dropped and could join again at once: 0.2 steps a second against 381."""
    policy = SyncSteps()
    workers = (WorkerView(0, False, False, True), WorkerView(1, True, False, False, True))
    silent = QueueView((PendingView(0, 4),), workers, version=4)
    assert _shape(silent, policy.take(silent)) == [[0]]  # worker 1 joined late, sent nothing
    delivered = (workers[0], WorkerView(1, True, False, True, True))
    assert policy.take(QueueView((PendingView(0, 4),), delivered, version=4)) == []
    start = (workers[0], WorkerView(1, True, False, False, False))  # there from the start
    assert policy.take(QueueView((PendingView(0, 4),), start, version=4)) == []


def test_sync_waits_for_a_late_worker_until_it_is_dropped() -> None:
    policy = SyncSteps()
    view = _view([0, 1], workers=3, computing={2}, late=frozenset({2}))
    assert policy.take(view) == [] and policy.late_action == "drop"
    assert AsyncSteps().late_action == "revoke"


def test_versions_each_policy_takes() -> None:
    assert SyncSteps().refusal(3, 3) == ""
    assert "round is 4" in SyncSteps().refusal(3, 4)
    assert AsyncSteps().refusal(3, 4) == ""  # stale, but async takes it
    for policy in (SyncSteps(), AsyncSteps()):
        assert "unknown weights version 5" in policy.refusal(5, 4)
        assert "unknown weights version -1" in policy.refusal(-1, 4)


def test_make_step_policy_names_the_modes() -> None:
    assert isinstance(make_step_policy(JobSpec(mode="sync")), SyncSteps)
    policy: StepPolicy = make_step_policy(JobSpec(mode="async", updates_per_step=4))
    assert isinstance(policy, AsyncSteps) and policy.updates_per_step == 4
    blocks = make_step_policy(JobSpec(mode="bmuf"))
    assert isinstance(blocks, SyncSteps) and blocks.late_action == "drop"
    assert isinstance(blocks.combination, BlockDeltas)
    assert "carries a worker's momentum" in blocks.combination.codec_problem("topk:0.01")
    assert blocks.combination.codec_problem("int8") == ""
    for sliver in ("delta:topk:0.01", "delta:powersgd:2"):  # the run collapsed
        assert "sends a sliver of each change" in blocks.combination.weights_problem(sliver)
    for whole in ("none", "fp16", "delta:int8", "delta:sign"):
        assert blocks.combination.weights_problem(whole) == ""
    assert policy.combination.weights_problem("delta:topk:0.01") == ""  # every bunch's copy
    assert blocks.combination.chunk_frames(JobSpec(mode="bmuf", block_bunches=64)) == 64 * 128
    loose = make_step_policy(JobSpec(mode="bmuf", block_sync=False))
    assert isinstance(loose, AsyncSteps) and loose.updates_per_step == 1  # each block alone
    assert type(policy.combination) is Combination
    # np's workers hold slices, not weights to score: the server scores its CV
    assert not make_step_policy(JobSpec(mode="np")).workers_score_cv
    assert policy.workers_score_cv and blocks.workers_score_cv


def test_bmuf_leases_whole_blocks_to_several_workers() -> None:
    # Leases shrink to one update over an epoch's tail (server/leases.py); for bmuf an
    # update is a block: leases cut to one bunch ended every block after a bunch, an
    # exchange per bunch (Figure 4's bmuf ran at per-bunch speed until this).
    job = JobSpec(mode="bmuf", bunch_size=100, block_bunches=16, chunk_frames=2048)
    combination = make_step_policy(job).combination
    assert combination.update_frames(job) == 1600
    assert combination.update_frames(job.with_changes(block_seconds=2.0)) == 0
    assert make_step_policy(JobSpec()).combination.update_frames(JobSpec()) == 128
    leases = combination.chunk_frames(job), combination.update_frames(job)
    book = LeaseBook.for_job(job, np.arange(48_000), 48_000, *leases)
    book.start_epoch(0)
    sizes = []
    while (lease := book.grant(len(sizes) % 5, workers=5)) is not None:
        sizes.append(len(lease.indices))
    assert sum(sizes) == 48_000 and all(size % 1600 == 0 for size in sizes[:-1])


# ---------------------------------------------------------------- deadlines


def test_a_deadline_follows_the_workers_measured_interval() -> None:
    watch = ProgressWatch(stall_seconds=2.0, join_seconds=10.0)
    clock = DeliveryClock(joined_at=0.0)
    clock.got_work(0.0)
    assert watch.deadline(clock, []) == 2.0  # nothing measured: the floor
    assert watch.deadline(clock, [], patient=True) == 12.0  # sync: time to load the data
    clock.update_arrived(5.0, 64, 0.5)  # the first: start-up, not an interval
    assert clock.interval is None and clock.clock_start() == 5.0
    clock.update_arrived(5.5, 64, 0.5)
    assert clock.interval == pytest.approx(0.5)
    assert watch.deadline(clock, []) == pytest.approx(STALL_FACTOR * 0.5)
    clock.ran_dry()
    assert clock.clock_start() is None  # holds no frames: owes nothing


def test_after_one_update_a_slow_worker_is_judged_by_its_own_compute_time() -> None:
    """An emulated board beside numpy workers: its blocks take seconds where theirs take
    milliseconds. After its first update (start-up included, so no interval yet) the
    others' pace would have it late at the floor; its own first compute time decides,
    never more than the server saw it take (a claim beyond that is not believed)."""
    watch = ProgressWatch(stall_seconds=2.0, join_seconds=10.0)
    fast = [DeliveryClock(0.0, interval=0.015)]
    board = DeliveryClock(joined_at=0.0)
    board.got_work(0.0)
    board.update_arrived(4.0, 2048, 2.5)  # 1.5 s of start-up, 2.5 s of compute
    assert board.interval is None
    assert watch.deadline(board, fast) == pytest.approx(STALL_FACTOR * 2.5)
    boaster = DeliveryClock(joined_at=0.0)
    boaster.got_work(0.0)
    boaster.update_arrived(1.0, 64, 600.0)  # claims 600 s of compute in 1 s
    assert watch.deadline(boaster, fast) == pytest.approx(STALL_FACTOR * 1.0)
    quick = DeliveryClock(joined_at=0.0)
    quick.got_work(0.0)
    quick.update_arrived(1.0, 64, 0.015)
    assert watch.deadline(quick, fast) == 2.0  # a fast worker keeps the floor
    silent = DeliveryClock(joined_at=0.0)
    silent.got_work(0.0)
    silent.update_arrived(4.0, 64, 0.0)  # reports no compute time: the others' pace
    assert watch.deadline(silent, fast) == 2.0


def test_frames_taken_back_still_let_the_update_sent_for_them_measure_the_pace() -> None:
    """A newcomer at 2.5 s a bunch beside fast workers is late at the 2 s floor and its
    lease is taken back; the update it still sends for it (refused) shows its pace, so its
    next lease is judged by that, not by the others' again (before: by theirs, forever)."""
    watch = ProgressWatch(stall_seconds=2.0, join_seconds=0.0)
    fast = [DeliveryClock(0.0, interval=0.015)]
    slow = DeliveryClock(joined_at=0.0)
    slow.got_work(0.0)
    assert watch.deadline(slow, fast) == 2.0
    slow.taken_back()  # at 2.2 s
    assert slow.clock_start() is None  # it owes nothing: it holds nothing
    slow.update_arrived(2.6, 512, 2.5)
    assert slow.clock_start() is None and slow.first_compute == pytest.approx(2.5)
    slow.got_work(2.7)  # delivered: it may hold leases again
    assert watch.deadline(slow, fast) == pytest.approx(STALL_FACTOR * 2.5)
    slow.taken_back()  # taken back again before it delivers: measured the same way
    slow.update_arrived(7.7, 512, 2.5)
    assert slow.interval == pytest.approx(5.0)
    slow.update_arrived(10.0, 512, 2.5)  # held nothing since: no interval to measure
    assert slow.interval == pytest.approx(5.0)


def test_a_newcomer_is_judged_by_the_others_intervals_and_a_scorer_by_its_rate() -> None:
    """A scorer's CV time is judged by the rate the server saw it train at (between its
    updates), held to the others' too: by the rate it claimed, one that claimed 1000 s
    of compute once was given hours, and stood the run still for as long as it stayed
    (a probe)."""
    watch = ProgressWatch(stall_seconds=0.1, join_seconds=0.0)
    others = []
    for interval in (0.2, 0.3, 0.4):
        other = DeliveryClock(0.0, interval=interval, patterns=500)
        others.append(other)
    newcomer = DeliveryClock(0.0)
    assert watch.deadline(newcomer, others) == pytest.approx(STALL_FACTOR * 0.3)
    scorer = DeliveryClock(0.0, interval=0.05, patterns=500, seconds_per_pattern=1e-3)
    assert watch.deadline(scorer, others, cv_frames=1000) == pytest.approx(
        STALL_FACTOR * 0.05 + STALL_FACTOR * (500 + 1000) * 1e-4  # seen: 0.05 s / 500
    )  # (its bunch and the CV set: the scoring deadline, one formula for both)
    assert watch.deadline(scorer, others, 1000) - watch.deadline(scorer, others) == (
        pytest.approx(watch.scoring_deadline(scorer, others, 1000)))  # fmt: skip
    liar = DeliveryClock(0.0, interval=60.0, patterns=128, seconds_per_pattern=1000 / 128)
    assert watch.deadline(liar, others, cv_frames=5520) == pytest.approx(
        STALL_FACTOR * 60.0 + STALL_FACTOR * (128 + 5520) * STALL_FACTOR * 0.3 / 500
    )  # its own seen pace (0.47 s a pattern) held to 10x the others' (6e-4)


def _mode_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` comparing a ``mode`` (a name or an attribute) with anything."""

    def is_mode(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "mode") or (
            isinstance(node, ast.Name) and node.id == "mode"
        )

    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(map(is_mode, [node.left, *node.comparators]))
    ]


def test_the_server_and_worker_branch_on_the_mode_only_in_their_policies() -> None:
    """A mode is a policy object (issue 13): outside server/policies.py and
    client/policies.py, which build the policy of a job's mode, nothing in server/ or
    client/ asks which mode runs; it asks the policy (memory needs included)."""
    root = Path(__file__).resolve().parent.parent
    found = {
        f"{path.relative_to(root)}:{line}"
        for part in ("server", "client")
        for path in sorted((root / part).rglob("*.py"))
        if path.name != "policies.py"
        for line in _mode_comparisons(path)
    }
    assert found == set(), found
    assert _mode_comparisons(root / "client" / "policies.py")  # the check finds them


SESSION_NAMES = {"session", "s", "worker", "holder"}  # what the server's modules call one


def _session_writes(path: Path) -> list[str]:
    """``line: target`` of each assignment to a field of a worker session in ``path``
    (``session.x = ...``, ``pending.session.x += ...``, ``session.ledger.x = ...``)."""

    def names_a_session(node: ast.expr) -> bool:
        while isinstance(node, ast.Attribute):
            if node.attr == "session":
                return True
            node = node.value
        return isinstance(node, ast.Name) and node.id in SESSION_NAMES

    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(each, ast.Attribute) and names_a_session(each.value):
                    found.append(f"{node.lineno}: {ast.unparse(each)}")
    return found


def test_only_the_session_changes_its_own_fields(tmp_path: Path) -> None:
    """Parts with one owner (issue 13): the server's parts tell a ``WorkerSession`` what
    happened (``session.refused()``, ``session.taken_back(ids)``) and never assign its fields
    (nine modules did)."""
    root = Path(__file__).resolve().parent.parent
    found = {
        f"{path.relative_to(root)}:{write}"
        for path in sorted((root / "server").rglob("*.py"))
        if path.name != "session.py"
        for write in _session_writes(path)
    }
    assert found == set(), found
    sample = tmp_path / "sample.py"  # the check finds what it is for
    sample.write_text("session.probation = True\npending.session.patterns += 3\n")
    assert _session_writes(sample) == ["1: session.probation", "2: pending.session.patterns"]


def test_each_mode_s_policy_chooses_its_workers_traffic() -> None:
    """The coordinator's mode-dependent events go to the traffic the policy makes
    (server/traffic.py): leases and updates, or np's rounds, made only when chosen."""
    updates, rounds, made = object(), object(), []

    def make_rounds() -> object:
        made.append(True)
        return rounds

    for mode, expected in (("sync", updates), ("async", updates), ("bmuf", updates)):
        policy = make_step_policy(JobSpec(mode=mode))
        assert policy.make_traffic(updates, make_rounds) is expected  # type: ignore[arg-type]
    assert not made
    policy = make_step_policy(JobSpec(mode="np"))
    assert policy.make_traffic(updates, make_rounds) is rounds  # type: ignore[arg-type]


def test_each_mode_s_worker_policy_chooses_its_turn() -> None:
    """The worker's compute loop runs the turn its policy makes (client/worker.py):
    updates in the data-parallel modes, np's slice work in np, made only when chosen."""
    from snet.client.slice_work import SliceWork

    def updates() -> object:
        return "updates"

    def slices(work: SliceWork) -> object:
        return work

    for mode in ("sync", "async", "bmuf"):
        job = JobSpec(mode=mode)
        turn = make_compute_policy(job).make_turn(job, None, None, updates, slices)  # type: ignore[arg-type]
        assert turn == "updates"
    job = JobSpec(mode="np")
    turn = make_compute_policy(job).make_turn(job, None, None, updates, slices)  # type: ignore[arg-type]
    assert isinstance(turn, SliceWork) and turn.job == job


def test_a_scorers_time_for_the_cv_set_is_held_to_the_others_pace() -> None:
    """A peer with no leases left, asked to score, stretched its own interval by sending a
    refused update late (3.1 s for 128 patterns beside the others' 2 ms): the deadline
    for its updates, which its interval sets, held the run's end 34 s. Scoring has a
    deadline of its own: the CV frames at its seen pace, at most 10x the others'."""
    watch = ProgressWatch(stall_seconds=2.0, join_seconds=10.0)
    others = [DeliveryClock(0.0, interval=0.002, patterns=128) for _ in range(2)]
    stretched = DeliveryClock(0.0, interval=3.1, patterns=128, seconds_per_pattern=1000 / 128)
    assert watch.deadline(stretched, others, cv_frames=5520) > 30  # its leases: its own pace
    held = STALL_FACTOR * (128 + 5520) * STALL_FACTOR * 0.002 / 128
    assert watch.scoring_deadline(stretched, others, 5520) == pytest.approx(max(2.0, held))
    assert watch.scoring_deadline(stretched, others, 5520) < 10
    honest = DeliveryClock(0.0, interval=0.003, patterns=128)
    assert watch.scoring_deadline(honest, others, 5520) == pytest.approx(
        max(2.0, STALL_FACTOR * (128 + 5520) * 0.003 / 128))  # fmt: skip
    unknown = DeliveryClock(0.0)  # nothing seen yet, of it or the others: the allowance
    assert watch.scoring_deadline(unknown, [], 5520) == 12.0
    # nothing seen of it: the others' pace (10x that let a newcomer that never computes
    # hold the epoch's score for minutes: a review)
    assert watch.scoring_deadline(unknown, others, 5520) == pytest.approx(
        max(2.0, STALL_FACTOR * 5520 * 0.002 / 128))  # fmt: skip
    slow_others = [DeliveryClock(0.0, interval=0.2, patterns=128) for _ in range(2)]
    assert watch.scoring_deadline(unknown, slow_others, 5520) == pytest.approx(
        STALL_FACTOR * 5520 * 0.2 / 128)  # fmt: skip


def test_bmuf_refuses_update_codecs_that_would_undertrain_its_blocks() -> None:
    """topk folds a worker's momentum into gradients; powersgd of few factors leaves most
    of a block's delta in the residual (a probe's demo at rank 2: 78 % CV where int8 gave
    92 %, and the topk refusal had recommended powersgd:R). The job's setting and a
    worker's own choice are refused alike, with one message."""
    from snet.protocol.codecs import BMUF_MIN_RANK
    from snet.protocol.job import JobSpec
    from snet.server.policies import make_step_policy

    bmuf = make_step_policy(JobSpec(mode="bmuf")).combination
    assert "carries a worker's momentum" in bmuf.codec_problem("topk:0.01")
    assert "powersgd:16 or more" in bmuf.codec_problem("topk:0.01")
    assert "in 2 factors leaves most of it waiting in the residual" in bmuf.codec_problem(
        "powersgd:2")  # fmt: skip
    for fine in ("none", "fp16", "int8", "sign", f"powersgd:{BMUF_MIN_RANK}"):
        assert bmuf.codec_problem(fine) == ""
        assert JobSpec(mode="bmuf", compress=fine).compress == fine
    with pytest.raises(ConfigError, match="compress powersgd:4: a bmuf block's model delta"):
        JobSpec(mode="bmuf", compress="powersgd:4")
    assert JobSpec(mode="async", compress="powersgd:2").compress == "powersgd:2"  # gradients
