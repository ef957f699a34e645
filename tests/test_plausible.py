"""Plausibility, not only finiteness: norms, counts, reports, names, bounded records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from snet.client.config import WorkerConfig
from snet.protocol.errors import ConfigError, RejectedUpdate
from snet.protocol.worker_name import name_problem
from snet.server.departures import Departures
from snet.server.plausible import (
    ABSOLUTE_NORM,
    JUDGE_EVERY,
    MAX_FACTOR,
    NORM_FACTOR,
    SETTLE_UPDATES,
    NormBounds,
)
from snet.server.reported import (
    REPORT_DEPTH,
    checked_report,
    eval_figures_problem,
    finite,
    update_figures_problem,
)
from snet.server.session import WorkerSession, unique_name

RNG = np.random.default_rng(3)


def _gradient(scale: float, size: int = 1000) -> np.ndarray:
    return (scale * RNG.standard_normal(size)).astype(np.float32)


def test_norm_bounds_refuse_what_no_honest_gradient_looks_like() -> None:
    bounds = NormBounds()
    kind = (False, "none")
    assert "overflows" in bounds.problem(kind, np.full(1000, 1e30, np.float32), 64)
    huge = np.zeros(1000, np.float32)
    huge[3] = 2.0**43  # one mutated value
    assert "beyond" in bounds.problem(kind, huge, 64)
    assert "zeros" in bounds.problem(kind, np.zeros(1000, np.float32), 64)
    nan = _gradient(1.0)
    nan[5] = np.nan
    assert "NaN" in bounds.problem(kind, nan, 64)
    for _ in range(SETTLE_UPDATES):
        assert bounds.problem(kind, _gradient(64.0), 64) == ""
    # settled: within NORM_FACTOR of the running mean, whatever the bunch size
    assert bounds.problem(kind, _gradient(640.0), 640) == ""
    assert "implausible" in bounds.problem(kind, _gradient(64.0 * NORM_FACTOR * 3), 64)
    # a tiny honest gradient (a bunch already classified with confidence) is taken: a
    # small step cannot harm the weights, and a lower bound refused honest updates
    assert bounds.problem(kind, _gradient(64.0 / NORM_FACTOR**3), 64) == ""
    # another kind has its own mean (a topk update's norm is not a dense one's)
    assert bounds.problem((True, "topk:0.01"), _gradient(0.01), 64) == ""
    assert ABSOLUTE_NORM > 1e3


def test_single_pattern_updates_of_a_trained_network_are_taken() -> None:
    """Bunch 1 once the network has learned: most patterns' gradients are tiny, a
    misclassified one's is not (the default job's trained weights: log norms with a
    standard deviation of 3.4, 7.8 % of them beyond 100x their geometric mean). A fixed
    factor refused those, and again each time their frames came back: bunch 1 and 2
    never finished. The bound widens with the spread seen; a mutated value still fails."""
    bounds = NormBounds()
    kind = (False, "none")
    rng = np.random.default_rng(11)
    direction = _gradient(1.0)
    direction /= np.linalg.norm(direction)
    norms = np.exp(rng.normal(math.log(0.0316), 3.4, 3000))
    refused = [n for n in norms if bounds.problem(kind, (n * direction).astype(np.float32), 1)]
    assert refused == []
    assert max(norms) > 100 * math.exp(np.log(norms).mean())  # the old bound's refusals
    huge = np.zeros(1000, np.float32)
    huge[3] = 2.0**43  # one mutated value: beyond the absolute bound, now always in force
    assert "per pattern is beyond 1e+06" in bounds.problem(kind, huge, 1)
    # updates sent just under the bound widen the spread: never past MAX_FACTOR
    pushed = NormBounds()
    for n in np.exp(rng.normal(0.0, 0.3, 50)):
        assert pushed.problem(kind, (n * direction).astype(np.float32), 1) == ""
    for _ in range(60):
        allowed = math.exp(pushed._log_mean[kind] + pushed._allowed(kind))
        assert allowed <= MAX_FACTOR * math.exp(pushed._log_mean[kind]) * 1.0001
        pushed.problem(kind, (0.99 * allowed * direction).astype(np.float32), 1)
    assert pushed._allowed(kind) == pytest.approx(math.log(MAX_FACTOR))
    # a bunch of 64's norms barely spread: the bound stays NORM_FACTOR there
    tight = NormBounds()
    for n in np.exp(rng.normal(math.log(0.2), 0.3, 200)):
        assert tight.problem(kind, (n * 64 * direction).astype(np.float32), 64) == ""
    assert "implausible" in tight.problem(kind, (0.2 * 64 * 3 * NORM_FACTOR * direction), 64)


def _norm(per_pattern: float, patterns: int = 64) -> np.ndarray:
    """An update whose norm per pattern is exactly ``per_pattern`` (in float32)."""
    direction = _gradient(1.0)
    return (direction * (per_pattern * patterns / np.linalg.norm(direction))).astype(np.float32)


def test_a_kind_not_yet_settled_is_held_to_the_settled_kinds() -> None:
    """The audit: plain updates had settled the mean (weights of 0.099 at most); a new
    connection in fp16 or powersgd sent 1e4 per pattern, within the absolute bound that
    alone held a kind before its own mean settled, and was taken 3 times of 3."""
    bounds = NormBounds(momentum=0.9)
    plain = (False, "none")
    for _ in range(SETTLE_UPDATES):
        assert bounds.problem(plain, _norm(0.5), 64) == ""
    for codec in ("fp16", "powersgd:2"):
        for _ in range(3):
            problem = bounds.problem((False, codec), _norm(1e4), 64)
            assert "few updates of its kind yet" in problem and "0.5" in problem
        assert bounds.problem((False, codec), _norm(0.5 * NORM_FACTOR * 3), 64)  # 300x
        # honest ones are taken: a codec's norms are near the plain ones (the default
        # job's fp16, int8, sign, powersgd:2 means: 0.95 to 1.05x the plain mean)
        assert bounds.problem((False, codec), _norm(0.5 * 2), 64) == ""
    # momentum-carrying updates are up to 1/(1 - momentum) larger (the default job's topk:
    # 7.5 to 9.3x the plain mean at momentum 0.9): 300x is taken there, 3000x is not
    topk = (True, "topk:0.01")
    assert bounds.problem(topk, _norm(0.5 * 9.3), 64) == ""
    assert bounds.problem(topk, _norm(0.5 * NORM_FACTOR * 3), 64) == ""
    assert "implausible" in bounds.problem(topk, _norm(0.5 * NORM_FACTOR * 30), 64)
    assert "implausible" in bounds.problem(topk, _norm(1e4), 64)
    # plain updates are not widened against a momentum-carrying mean: within its factor
    carried = NormBounds(momentum=0.9)
    for _ in range(SETTLE_UPDATES):
        assert carried.problem(topk, _norm(4.5), 64) == ""
    assert carried.problem((False, "int8"), _norm(4.5 * NORM_FACTOR * 0.9), 64) == ""
    assert "implausible" in carried.problem((False, "int8"), _norm(4.5 * NORM_FACTOR * 1.2), 64)


def test_the_absolute_bound_alone_holds_while_no_kind_has_settled() -> None:
    bounds = NormBounds(momentum=0.9)
    for codec in ("none", "fp16"):
        for _ in range(SETTLE_UPDATES - 1):  # neither kind settles
            assert bounds.problem((False, codec), _norm(1.0 if codec == "none" else 1e4), 64) == ""
    assert "beyond" in bounds.problem((False, "fp16"), _norm(ABSOLUTE_NORM * 2), 64)


def test_a_refused_update_does_not_move_the_mean() -> None:
    bounds = NormBounds()
    kind = (False, "none")
    for _ in range(SETTLE_UPDATES):
        bounds.problem(kind, _gradient(1.0), 1)
    before = bounds.view()
    for _ in range(50):
        assert bounds.problem(kind, _gradient(1e4), 1)
    assert bounds.view() == before


def test_reported_figures_are_bounded_by_the_patterns() -> None:
    assert update_figures_problem(64, 10, 50.0, 0.01) == ""
    assert "7800000000000000 correct" in update_figures_problem(64, 7_800_000_000_000_000, 1, 0)
    assert "-1 correct" in update_figures_problem(64, -1, 1.0, 0.0)
    assert "loss of nan" in update_figures_problem(64, 1, math.nan, 0.0)
    assert "loss" in update_figures_problem(64, 1, -1.0, 0.0)
    assert "0 patterns" in update_figures_problem(0, 0, 0.0, 0.0)
    assert "seconds" in update_figures_problem(64, 1, 1.0, math.inf)
    # (1e300 was taken, and a deadline then printed as a 300-digit number: a probe)
    assert "claims 1e+300 seconds of compute" in update_figures_problem(64, 1, 1.0, 1e300)
    assert update_figures_problem(64, 1, 1.0, 3600.0) == ""  # an emulated board's, say
    assert eval_figures_problem(500, 450, 100.0, 500) == ""
    assert "the CV set has 500" in eval_figures_problem(499, 450, 100.0, 500)
    assert "correct" in eval_figures_problem(500, 501, 100.0, 500)
    assert "loss" in eval_figures_problem(500, 5, math.inf, 500)


def test_worker_reports_are_small_shallow_plain_json() -> None:
    assert checked_report({"board": {"busy": 1.5}}) == {"board": {"busy": 1.5}}
    deep: object = 1
    for _ in range(990):  # raised RecursionError in the server before
        deep = [deep]
    with pytest.raises(RejectedUpdate, match="nested deeper"):
        checked_report({"x": deep})
    assert checked_report({"x": _nest(REPORT_DEPTH - 1)})
    with pytest.raises(RejectedUpdate, match="bytes"):
        checked_report({"x": "y" * 100_000})
    with pytest.raises(RejectedUpdate, match="not plain JSON"):
        checked_report({"x": math.nan})
    with pytest.raises(RejectedUpdate, match="not a map"):
        checked_report([1, 2])


def _nest(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = {"a": value}
    return value


def test_status_figures_are_finite_json() -> None:
    document = finite({"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf, "e": 2}})
    assert document == {"a": None, "b": [1.0, None], "c": {"d": None, "e": 2}}
    json.dumps(document, allow_nan=False)


def test_worker_names_are_printable_bounded_and_unique() -> None:
    assert name_problem("w1") == ""
    assert "not printable" in name_problem("w1\nsnet_updates_applied 1e9")
    assert "over 64" in name_problem("x" * 65)
    assert unique_name("w", ["a", "b"]) == "w"
    assert unique_name("w", ["w", "w-2"]) == "w-3"


def test_a_worker_checks_its_own_name_before_it_connects() -> None:
    """A name of 100,000 characters was a frame_too_large refusal from the server; a
    newline a refusal after connecting. Both are the worker's own configuration."""
    with pytest.raises(ConfigError, match="worker name is 100000 characters long, over 64"):
        WorkerConfig(server="127.0.0.1:7000", name="x" * 100_000)
    with pytest.raises(ConfigError, match="not printable"):
        WorkerConfig(server="127.0.0.1:7000", name="w1\nforged log line")
    assert WorkerConfig(server="127.0.0.1:7000").worker_name()  # hostname-pid: fine


def test_departed_workers_are_summed_and_only_the_latest_kept() -> None:
    departures = Departures(kept=3)
    for i in range(1000):
        session = WorkerSession(i, f"w{i}", "addr", "numpy", (), print, print)
        session.updates_sent, session.patterns = 2, 128
        session.left_reason = "timeout: no message" if i % 2 else f"goodbye {i}"
        departures.add(session)
    assert [s.name for s in departures.recent] == ["w997", "w998", "w999"]
    summary = departures.summary()
    assert summary["workers"] == 1000 and summary["updates"] == 2000
    assert summary["patterns"] == 128_000 and summary["rows_kept"] == 3
    assert summary["reasons"]["timeout"] == 500
    assert len(summary["reasons"]) <= 17  # distinct reasons are bounded too
    # an update a worker left queued is refused after it left: the totals say so (it
    # was summed as it stood at its leaving: 7 refusals where 1,893 were made, a probe)
    departures.recent[-1].updates_rejected += 1
    assert departures.summary()["updates_rejected"] == 1
    for i in range(3):  # once its row goes, its figures stay in the totals
        departures.add(WorkerSession(2000 + i, "later", "addr", "numpy", (), print, print))
    assert departures.summary()["updates_rejected"] == 1
    assert departures.summary()["updates"] == 2000 and departures.summary()["workers"] == 1003


def test_a_worker_cannot_raise_the_norms_it_is_judged_against() -> None:
    """A peer that grew its updates by half after each one taken (and halved them after a
    refusal) dragged the running mean and spread up with it: 162 of its updates applied,
    up to 1e8 times the others' norm, CV from 86 % to 8 %, weights RMS 1.8e5 (a probe).
    Judged against the other workers' norms, it stays within their factor."""
    rng = np.random.default_rng(0)
    bounds, scale, largest, refusals = NormBounds(), 1.0, 0.0, []
    for turn in range(3000):
        if turn % 3 == 2:  # the third worker, growing its norms
            problem = bounds.problem((False, "none"), _gradient(64.0 * scale), 64, 3)
            if problem:
                refusals.append(problem)
                scale /= 2
            else:
                largest, scale = max(largest, scale), scale * 1.5
        else:  # two honest workers, spread as a bunch of 64's norms are
            honest = _gradient(64.0 * float(np.exp(rng.normal(0, 0.3))))
            assert bounds.problem((False, "none"), honest, 64, turn % 3 + 1) == ""
    assert NORM_FACTOR / 2 < largest < 2 * NORM_FACTOR  # it had reached 1.26e8
    assert "the median worker's accepted updates' running mean is" in refusals[-1]


@pytest.mark.parametrize("honest_workers", [1, 2, 3])
def test_a_worker_of_tiny_updates_cannot_lower_the_others_bounds(honest_workers: int) -> None:
    """Small updates are taken; a peer sending tiny steady ones settled a narrow mean that
    held honest workers to a hundredth of their norms when the others' median alone
    judged (292 of 300 refused, a review's simulation)."""
    rng = np.random.default_rng(1)
    bounds, workers = NormBounds(), honest_workers + 1
    refused = 0
    for turn in range(300 * workers):
        worker = turn % workers
        if worker == honest_workers:
            assert bounds.problem((False, "none"), _gradient(64.0 * 1e-4), 64, worker) == ""
        else:
            honest = _gradient(64.0 * float(np.exp(rng.normal(0, 0.3))))
            refused += bool(bounds.problem((False, "none"), honest, 64, worker))
    assert refused == 0


def _attack(
    bounds: NormBounds, kind: tuple[bool, str], reconnect: bool, tiny: bool
) -> tuple[float, int]:
    """Three honest workers and one peer (tiny steady updates, or growing by half after
    each taken); it comes back under a new id every 10 of its updates if ``reconnect``.
    Its largest update taken (x the honest norm) and the honest updates refused."""
    rng, peer, scale, largest, refused = np.random.default_rng(2), 100, 1.0, 0.0, 0
    for turn in range(1600):
        if turn % 4 < 3:
            honest = _gradient(64.0 * float(np.exp(rng.normal(0, 0.3))))
            refused += bool(bounds.problem((False, "none"), honest, 64, turn % 4))
            continue
        if reconnect and turn % 40 == 3:
            bounds.forget(peer)  # the connection ended: a new id comes back
            peer += 1
        norm = 1e-4 if tiny else scale
        taken = not bounds.problem(kind, _gradient(64.0 * norm), 64, peer)
        if not tiny:
            largest, scale = (max(largest, scale), scale * 1.5) if taken else (largest, scale / 2)
    return largest, refused


@pytest.mark.parametrize("tiny", [False, True], ids=["growing", "tiny"])
def test_a_peer_that_comes_back_again_and_again_has_one_vote(tiny: bool) -> None:
    """The rows of workers that left still voted: a peer back under a new id each time
    had a vote a connection (600 of 600 honest updates refused; 7.6e7 taken)."""
    largest, refused = _attack(NormBounds(), (False, "none"), reconnect=True, tiny=tiny)
    assert refused == 0 and largest < 2 * NORM_FACTOR


def test_a_peer_of_a_codec_of_its_own_is_held_to_the_other_kinds() -> None:
    """Alone in its kind (a codec a peer chooses: topk:0.0137), its own running mean
    judged it: an update of 1.84e19 per pattern taken (a review's simulation). Now it is
    held to the strictest settled kind's bound too, widened for carrying momentum."""
    bounds = NormBounds(momentum=0.9)
    largest, refused = _attack(bounds, (True, "topk:0.0137"), reconnect=False, tiny=False)
    assert refused == 0 and largest < 20 * NORM_FACTOR  # 1/(1 - 0.9) x 100, and the drift


def test_the_norm_checks_figures_say_what_judges_each_kind_and_each_workers_norm() -> None:
    """/status shows them (``update_norms``, and each worker row's ``norm_per_pattern``):
    what a kind's updates are taken up to and what sets it, and which worker is far from
    the others; they were kept and read by nothing."""
    bounds, kind = NormBounds(), (False, "none")
    assert bounds.view() == ([], {})
    for _ in range(SETTLE_UPDATES - 1):
        assert bounds.problem(kind, _norm(0.5), 64, 1) == ""
    [row], workers = bounds.view()
    assert row["kind"] == "none" and row["updates"] == SETTLE_UPDATES - 1
    assert (row["judged_by"], row["largest_per_pattern"]) == ("settling", ABSOLUTE_NORM)
    assert row["norm_per_pattern"] == pytest.approx(0.5, rel=1e-3) and workers == {1: row[
        "norm_per_pattern"]}  # fmt: skip
    assert bounds.problem(kind, _norm(0.5), 64, 1) == ""
    [row], _ = bounds.view()  # settled, judged by the running mean of every update taken
    assert row["judged_by"] == "running mean"
    assert row["largest_per_pattern"] == pytest.approx(0.5 * NORM_FACTOR, rel=1e-3)
    for _ in range(SETTLE_UPDATES):  # two more workers settle: the median worker judges
        for worker, norm in ((2, 0.4), (3, 30.0)):
            assert bounds.problem(kind, _norm(norm), 64, worker) == ""
    for _ in range(JUDGE_EVERY):  # (once the median worker is reckoned again)
        assert bounds.problem(kind, _norm(0.5), 64, 1) == ""
    [row], workers = bounds.view()
    assert row["judged_by"] == "median worker"
    assert row["updates"] == 3 * SETTLE_UPDATES + JUDGE_EVERY
    assert row["largest_per_pattern"] == pytest.approx(0.5 * NORM_FACTOR, rel=1e-3)
    assert workers == pytest.approx({1: 0.5, 2: 0.4, 3: 30.0}, rel=1e-3)  # worker 3 stands out
    assert "implausible" in bounds.problem(kind, _norm(0.5 * NORM_FACTOR * 1.5), 64, 3)
    bounds.problem((True, "topk:0.01"), _norm(4.0), 64, 4)  # a kind carrying momentum
    assert [row["kind"] for row in bounds.view()[0]] == ["none", "topk:0.01 (momentum carried)"]


def test_the_figures_change_nothing_the_check_decides() -> None:
    """/status's view reckoned the median worker and kept it: polling /status moved when
    it was reckoned again, and an update near the bound was taken by one server and
    refused by another fed the same (a review)."""
    rng = np.random.default_rng(5)
    looked, unlooked, kind = NormBounds(), NormBounds(), (False, "none")
    for turn in range(600):
        update = _gradient(64.0 * float(np.exp(rng.normal(0, 0.3))))
        for bounds in (looked, unlooked):
            assert bounds.problem(kind, update, 64, turn % 3) == ""
        if turn % 3 == 0:
            looked.view()
    assert looked.checkpoint_state() == unlooked.checkpoint_state()
    for scale in np.geomspace(10, 1000, 40):  # near the bound: the same answers
        update = _gradient(64.0 * float(scale))
        assert looked.problem(kind, update, 64, 1) == unlooked.problem(kind, update, 64, 1)


def test_the_figures_say_what_the_check_holds_a_kind_to() -> None:
    """A kind still settling is held to the settled kinds' bound, not the absolute one
    alone; a kind of few workers to the strictest other kind's (a review: both were
    shown as their own)."""
    bounds = NormBounds()
    for _ in range(SETTLE_UPDATES):
        assert bounds.problem((False, "none"), _norm(0.5), 64, 1) == ""
    assert bounds.problem((False, "fp16"), _norm(0.5), 64, 2) == ""
    rows = {row["kind"]: row for row in bounds.view()[0]}
    assert rows["fp16"]["judged_by"] == "settling: none's bound"
    assert rows["fp16"]["largest_per_pattern"] == pytest.approx(0.5 * NORM_FACTOR, rel=1e-3)
    for _ in range(SETTLE_UPDATES):
        assert bounds.problem((False, "fp16"), _norm(5.0), 64, 2) == ""
    rows = {row["kind"]: row for row in bounds.view()[0]}  # its own would allow 500
    assert rows["fp16"]["judged_by"] == "none's bound"
    assert rows["fp16"]["largest_per_pattern"] == pytest.approx(0.5 * NORM_FACTOR, rel=1e-3)
    assert "kind (False, 'none')'s running mean" in bounds.problem(
        (False, "fp16"), _norm(0.5 * NORM_FACTOR * 1.5), 64, 2)  # fmt: skip


def test_while_a_pass_runs_the_status_shows_the_last_figures_read_between_passes() -> None:
    """The pass changes the bounds' tables in the step thread: /status reads them only
    between steps, and while one runs gets the figures it read last (it never computes
    them in the pass either, where a failure would have stopped the step)."""
    from concurrent.futures import ThreadPoolExecutor

    from snet.server.stepping import StepRunner
    from snet.server.update_rule import UpdateRule

    with ThreadPoolExecutor(1) as executor:
        runner = StepRunner(UpdateRule(np.zeros(10, np.float32), 0.9), executor)
        kind = (False, "none")
        assert runner.bounds.problem(kind, _norm(0.5), 64, 1) == ""
        between = runner.norm_figures(between_steps=True)
        assert between[0][0]["updates"] == 1
        assert runner.bounds.problem(kind, _norm(0.5), 64, 1) == ""  # a pass, say
        assert runner.norm_figures(between_steps=False) is between  # not read meanwhile
        assert runner.norm_figures(between_steps=True)[0][0]["updates"] == 2


def test_a_departed_workers_queued_update_makes_it_no_row_again() -> None:
    """An update of a worker that left, still queued, came back as a fresh row with a
    running mean of its own (shown in /status for good, and 8 such would have given it a
    vote again: a probe). It is judged, and taken, but makes no row."""
    bounds, kind = NormBounds(), (False, "none")
    for _ in range(SETTLE_UPDATES * 5):
        for worker in (1, 2, 3):
            assert bounds.problem(kind, _norm(0.5), 64, worker) == ""
    bounds.forget(1)
    assert bounds.problem(kind, _norm(0.5), 64, 2) == ""  # the loop's forget is taken up
    for _ in range(SETTLE_UPDATES + 1):
        assert bounds.problem(kind, _norm(0.5), 64, 1) == ""  # judged, and taken
    assert set(bounds.view()[1]) == {2, 3}
