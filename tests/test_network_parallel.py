"""np mode's arithmetic, without sockets: slices, the master's sums and the exactness of
network-parallel steps against sequential training (the daemon tests are in
test_np_training.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from snet.client.data import load_corpus
from snet.client.network import BunchNetwork
from snet.client.policies import SliceCompute
from snet.client.slice_trainer import SliceTrainer
from snet.client.slice_work import SliceWork, slice_network
from snet.client.spert.backend import SpertBackend
from snet.client.spert.board import BoardMemoryError
from snet.client.spert.config import BoardConfig
from snet.client.spert.timing import BoardClock
from snet.perf.model import DEFAULT_CONSTANTS, predict
from snet.perf.plan import render_winners
from snet.protocol.errors import ConfigError, ProtocolError, RejectedUpdate
from snet.protocol.job import JobSpec
from snet.protocol.messages import NpBunch, PartialOutputs, SliceState
from snet.protocol.network import NetworkSpec, initial_weights
from snet.protocol.slices import (
    HiddenSlice,
    cut_slice,
    np_problem,
    put_slice,
    slice_size,
    split_hidden,
)
from snet.server.slice_master import SliceMaster
from snet.server.update_rule import UpdateRule

SPEC = NetworkSpec((7, 13, 4), ("sigmoid",))
BUNCH = 20


def _data(count: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(count, 7)).astype(np.float32), rng.integers(0, 4, count)


def _sequential(spec: NetworkSpec, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    rule = UpdateRule(initial_weights(spec, 3), 0.9)
    network = BunchNetwork(spec, 64)
    gradient = np.zeros_like(rule.weights)
    for start in range(0, len(x), BUNCH):
        network.gradient(rule.weights, x[start : start + BUNCH], y[start : start + BUNCH], gradient)
        rule.step([gradient], BUNCH, 0.3)
    return rule.weights


def _network_parallel(
    spec: NetworkSpec, x: np.ndarray, y: np.ndarray, workers: int, pipelined: bool
) -> np.ndarray:
    """The master and ``workers`` slice trainers, bunch by bunch; pipelined: the forward
    pass of bunch k+1 runs before the error of bunch k is applied."""
    master = SliceMaster(spec, 0.9, initial_weights(spec, 3))
    trainers: dict[int, SliceTrainer] = {}
    for worker, grant in master.reslice(dict.fromkeys(range(workers), 1.0)).items():
        trainers[worker] = SliceTrainer(spec, 0.9)
        trainers[worker].load(grant.part, grant.weights, grant.velocity, -1)
    starts = list(range(0, len(x), BUNCH))
    partials: dict[int, list[np.ndarray]] = {}

    def forward(k: int) -> None:
        frames = x[starts[k] : starts[k] + BUNCH]
        partials[k] = [t.forward(k, frames) for t in trainers.values()]

    forward(0)
    for k, start in enumerate(starts):
        if pipelined and k + 1 < len(starts):
            forward(k + 1)
        delta, _, _ = master.combine(partials.pop(k), y[start : start + BUNCH])
        master.step_output(delta, BUNCH, 0.3)
        for trainer in trainers.values():
            trainer.backward(k, delta, BUNCH, 0.3)
        if not pipelined and k + 1 < len(starts):
            forward(k + 1)
    for worker, trainer in trainers.items():
        master.take_report(worker, trainer.part, trainer.weights, trainer.velocity)
    return master.element


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
def test_np_steps_equal_sequential_steps(workers: int, activation: str) -> None:
    spec = NetworkSpec((7, 13, 4), (activation,))
    x, y = _data()
    expected = _sequential(spec, x, y)
    got = _network_parallel(spec, x, y, workers, pipelined=False)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_pipelined_steps_are_one_bunch_behind_whatever_the_slicing() -> None:
    x, y = _data()
    expected = _sequential(SPEC, x, y)
    pipelined = _network_parallel(SPEC, x, y, 3, pipelined=True)
    assert not np.allclose(pipelined, expected, rtol=1e-5, atol=1e-6)  # really behind
    # Each unit sees the same (stale) inputs whoever holds it: the slicing changes nothing.
    np.testing.assert_allclose(
        _network_parallel(SPEC, x, y, 2, pipelined=True), pipelined, rtol=1e-5, atol=1e-6
    )
    # With one bunch there is nothing to overlap: exactly the sequential step.
    np.testing.assert_allclose(
        _network_parallel(SPEC, x[:BUNCH], y[:BUNCH], 3, pipelined=True),
        _sequential(SPEC, x[:BUNCH], y[:BUNCH]),
        rtol=1e-5,
        atol=1e-6,
    )


def test_split_hidden_is_contiguous_and_follows_speed() -> None:
    parts = split_hidden(13, [1.0, 3.0])
    assert parts == [HiddenSlice(0, 3), HiddenSlice(3, 13)]
    assert split_hidden(2, [1.0, 1.0, 1.0]) == [
        HiddenSlice(0, 1),
        HiddenSlice(1, 2),
        HiddenSlice(2, 2),  # more workers than units: the last idles
    ]
    for speeds in ([1.0] * 5, [5.0, 1e-6, 1e-6], [0.0, 1.0]):
        parts = split_hidden(13, speeds)
        assert parts[0].start == 0 and parts[-1].stop == 13
        assert all(a.stop == b.start and a.units >= 1 for a, b in itertools.pairwise(parts))


def test_slices_cut_and_put_back_give_the_element() -> None:
    element = initial_weights(SPEC, 5)
    element[-4:] = [1, 2, 3, 4]  # output biases: not in any slice
    rebuilt = np.zeros_like(element)
    for part in split_hidden(13, [1.0, 2.0, 1.0]):
        put_slice(SPEC, rebuilt, part, cut_slice(SPEC, element, part))
    np.testing.assert_array_equal(rebuilt[:-4], element[:-4])
    assert slice_size(SPEC, HiddenSlice(2, 5)) == 3 * (7 + 1 + 4)


def test_np_needs_one_hidden_layer() -> None:
    assert np_problem(SPEC) == ""
    assert "one hidden layer" in np_problem(NetworkSpec((7, 5, 5, 4), ("tanh", "tanh")))


def test_master_checks_partials_and_reports_before_trusting_them() -> None:
    master = SliceMaster(SPEC, 0.9, initial_weights(SPEC, 1))
    grants = master.reslice({1: 1.0, 2: 1.0})
    good = np.zeros((BUNCH, 4), dtype=np.float32)
    master.check_partial(1, good, BUNCH)
    for worker, partial, why in [
        (3, good, "holds no slice"),
        (1, good[:-1], "shape"),
        (1, good.astype(np.float64), "shape"),
        (1, np.full((BUNCH, 4), np.nan, dtype=np.float32), "NaN"),
    ]:
        with pytest.raises(RejectedUpdate, match=why) as refused:
            master.check_partial(worker, partial, BUNCH)
        assert refused.value.numeric == (why == "NaN")  # the numbers: a diverged slice
    # finite outputs whose sum overflows put NaN in every output bias: refused, numeric
    huge = np.full((BUNCH, 4), 3e38, dtype=np.float32)
    with pytest.raises(RejectedUpdate, match="outputs for bunch 7 sum to NaN or Inf") as refused:
        master.combine([huge, huge], np.zeros(BUNCH, dtype=np.int64), 7)
    assert refused.value.numeric and np.isfinite(master.element).all()
    grant = grants[1]
    with pytest.raises(RejectedUpdate, match="not the one"):
        master.take_report(2, grant.part, grant.weights, grant.velocity)
    with pytest.raises(RejectedUpdate, match="needs"):
        master.take_report(1, grant.part, grant.weights[:-1], grant.velocity)
    master.take_report(1, grant.part, grant.weights, grant.velocity)
    assert not master.all_reported
    master.take_report(2, grants[2].part, grants[2].weights, grants[2].velocity)
    assert master.all_reported


def test_departed_slice_rolls_back_to_its_last_report_and_is_handed_over() -> None:
    start = initial_weights(SPEC, 1)
    master = SliceMaster(SPEC, 0.9, start)
    grants = master.reslice({1: 1.0, 2: 1.0})
    moved = grants[2].weights + 1.0
    master.take_report(2, grants[2].part, moved, grants[2].velocity)
    master.depart(2)
    assert master.units_rolled_back == grants[2].part.units
    regrant = master.reslice({1: 1.0})  # the survivor takes every unit, worker 2's included
    assert regrant[1].part == HiddenSlice(0, 13)
    np.testing.assert_array_equal(
        cut_slice(SPEC, master.element, grants[2].part), moved
    )  # its last report, not lost


def test_slice_trainer_refuses_what_does_not_fit() -> None:
    trainer = SliceTrainer(SPEC, 0.9)
    part = HiddenSlice(0, 5)
    with pytest.raises(ProtocolError, match="needs"):
        trainer.load(part, np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32), -1)
    size = slice_size(SPEC, part)
    trainer.load(part, np.zeros(size, dtype=np.float32), np.zeros(size, dtype=np.float32), -1)
    with pytest.raises(ProtocolError, match="not forwarded"):
        trainer.backward(0, np.zeros((2, 4), dtype=np.float32), 2, 0.1)
    trainer.forward(0, np.zeros((2, 7), dtype=np.float32))
    with pytest.raises(ProtocolError, match="shape"):
        trainer.backward(0, np.zeros((3, 4), dtype=np.float32), 3, 0.1)


def test_np_jobs_refuse_what_np_mode_cannot_do() -> None:
    assert JobSpec(mode="np").np_pipeline is False
    deep = NetworkSpec((117, 8, 8, 10), ("tanh", "tanh"))
    for changes, why in [
        ({"network": deep}, "one hidden layer"),
        (
            {"compress": "fp16"},
            "^compress fp16 applies to sync mode, async mode and bmuf mode "
            "only, and this job is in np mode, which would ignore it",
        ),
        (
            {"staleness": "rate"},
            r"^staleness rate applies to async mode and bmuf mode with asynchronous blocks "
            r"\(block_sync false\) only, and this job is in np mode, which would ignore it",
        ),
    ]:
        with pytest.raises(ConfigError, match=why):
            JobSpec(mode="np", **changes)  # type: ignore[arg-type]


def test_slice_work_checks_what_the_server_sends_before_using_it() -> None:
    job = JobSpec(mode="np", network=NetworkSpec.parse("117:8:10"), bunch_size=4, chunk_frames=8)
    work = SliceWork(job, load_corpus(job.data, 10, 117))
    size = slice_size(job.network, HiddenSlice(0, 8))
    zeros = np.zeros(size, dtype=np.float32)
    with pytest.raises(ProtocolError, match="of 8 units"):
        work.apply(SliceState(4, 9, -1, zeros, zeros))
    assert work.apply(SliceState(0, 8, -1, zeros, zeros)) == []
    total = work.corpus.bounds.total_frames
    for indices, why in [
        (np.arange(5), "bunch_size 4"),
        (np.array([0, total]), "outside"),
        (np.array([-1]), "outside"),
    ]:
        with pytest.raises(ProtocolError, match=why):
            work.apply(NpBunch(0, -1, 0.0, 0, False, indices.astype("<i8")))
    (partial,) = work.apply(NpBunch(0, -1, 0.0, 0, False, np.arange(4, dtype="<i8")))
    assert isinstance(partial, PartialOutputs) and partial.partial.shape == (4, 10)
    error = np.zeros((4, 10), dtype=np.float32)
    (report,) = work.apply(NpBunch(-1, 0, 0.1, 4, True, error=error))
    assert isinstance(report, SliceState) and (report.start, report.stop, report.bunch) == (0, 8, 0)


def test_snet_plan_says_where_each_strategy_wins() -> None:
    network = NetworkSpec.parse("351:1262:45")
    constants = DEFAULT_CONSTANTS.with_link_mbps(1000)
    predictions = [
        predict(network, bunch, workers, constants, strategy, mode)
        for bunch in (64,)
        for workers in (1, 4)
        for strategy in ("pattern", "network")
        for mode in ("sync", "async")
    ]
    lines = render_winners(predictions)
    assert lines[0].startswith("where each strategy wins")
    for workers, line in zip((1, 4), lines[1:], strict=True):
        rows = [p for p in predictions if p.workers == workers]
        best = max(rows, key=lambda p: p.mcups)
        assert line.split()[:3] == [str(workers), "worker(s):", best.strategy]
    assert render_winners([p for p in predictions if p.strategy == "pattern"]) == []


def test_a_board_holding_a_slice_is_charged_np_traffic_and_its_slice_compute() -> None:
    spec = NetworkSpec.parse("117:64:10")
    job = JobSpec(mode="np", network=spec, bunch_size=128)
    backend = SpertBackend(BoardConfig(time_scale=1e9))  # no real sleeping to speak of
    SliceCompute(1).prepare_backend(backend, job, load_corpus(job.data, 10, 117))
    part = slice_network(spec, 16)  # 117:16:10, what a quarter of the units amounts to
    backend.take_slice(part, 128)
    backend.slice_forward(128)
    backend.slice_backward(128)
    call = 50e-6
    per_pattern = part.connections / 345e6 + 16 * 5e-9 + 2e-6  # the forward pass
    forward = 128 * per_pattern + call
    train = 128 * (part.connections / 115e6 + 16 * 5e-9 + 2e-6) + call
    link = (
        (128 * 117 * 2) / 4.0e6  # 16-bit patterns in
        + (128 * 10 * 4) / 2.7e6  # 32-bit partial sums out
        + (128 * 10 * 2) / 4.0e6  # 16-bit errors in
        + 3 * call
    )
    totals = backend.board.clock.totals
    assert totals.link_seconds == pytest.approx(link, rel=1e-12)
    assert totals.compute_seconds == pytest.approx(train, rel=1e-12)  # forward + the rest
    assert forward < train
    report = backend.report()
    assert report is not None and report["patterns_trained"] == 128
    with pytest.raises(BoardMemoryError, match="does not fit"):
        backend.take_slice(slice_network(NetworkSpec.parse("117:4000:10"), 4000), 128)


class FakeTime:
    """A clock that only moves when slept on or told to (the host's arithmetic)."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("marked", [True, False])
def test_a_boards_time_covers_the_host_arithmetic_it_models(marked: bool) -> None:
    """np: the host does a slice's arithmetic, the board's modelled time is charged from
    before it (``begin``), so a pass ends at its board time, as on the board, not after
    the host's arithmetic plus the board time (which it took without the mark)."""
    spec = NetworkSpec.parse("117:64:10")
    job = JobSpec(mode="np", network=spec, bunch_size=128)
    backend = SpertBackend(BoardConfig(time_scale=1.0))
    SliceCompute(1).prepare_backend(backend, job, load_corpus(job.data, 10, 117))
    backend.take_slice(slice_network(spec, 16), 128)
    time = FakeTime()
    backend.board.clock = BoardClock(1.0, time.clock, time.sleep)
    mark = backend.begin() if marked else None
    time.now += 0.005  # the host's forward pass, 5 ms (beyond the clock's 2 ms of slack)
    backend.slice_forward(128, mark)
    board = backend.board.clock.totals.busy_seconds  # real seconds at time scale 1
    assert board > 0.005  # the board's pass is longer than the host's arithmetic
    assert time.now == pytest.approx(board if marked else 0.005 + board)
    assert backend.board.clock.totals.behind_count == 0
    assert backend.board.clock.totals.calls == 1  # one pass, its link and compute parts
