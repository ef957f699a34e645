"""bmuf mode: block-wise model-update filtering, model averaging and an outer Nesterov.

The filter's arithmetic is checked against hand-written recurrences; end to end, a
synchronous block of one bunch with η = 0 and plain SGD is a synchronous step, and one
worker with η = 0 trains exactly as ``snet train`` does.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from snet.cli.status import render
from snet.client.blocks import LocalTrainer
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.block_filter import BlockFilter

from helpers import SMALL_JOB, Cluster, run_process
from sequential_replay import load_weights, replay_sequentially

RNG = np.random.default_rng(11)
SIZE = 300


def _deltas(count: int) -> list[np.ndarray]:
    return [RNG.standard_normal(SIZE).astype(np.float32) for _ in range(count)]


def test_cbm_is_block_momentum_over_the_pattern_weighted_mean() -> None:
    start = RNG.standard_normal(SIZE).astype(np.float32)
    job = JobSpec(mode="bmuf", block_filter="cbm", block_lr=0.8)
    rule = BlockFilter(start, job)
    w, delta = start.astype(np.float64), np.zeros(SIZE)
    nesterov = BlockFilter(start, JobSpec(mode="bmuf", block_filter="nesterov"))
    assert nesterov.figures()["block_momentum"] == 0.9  # before any block: not 0
    for overlapping in (True, False):  # cbm's default η with overlapping blocks: 0
        ahead = BlockFilter(start, JobSpec(mode="bmuf", block_overlap=overlapping))
        assert ahead.momentum(2) == (0.0 if overlapping else 0.5)
    for _ in range(3):
        deltas, patterns = _deltas(2), [128, 64]  # a short block at an epoch's tail
        sent = [d * p for d, p in zip(deltas, patterns, strict=True)]
        out = rule.steps([sent], [sum(patterns)], learning_rate=0.1)
        assert out is not None
        rule.publish(out)
        mean = (deltas[0] * 128 + deltas[1] * 64) / 192  # weighted by the patterns covered
        delta = (1 - 1 / 2) * delta + 0.8 * mean  # η = 1 - 1/N with N = 2 blocks
        w = w + delta
        np.testing.assert_allclose(rule.model, w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rule.snapshot, w, rtol=1e-5, atol=1e-5)  # CBM: no look-ahead
    again = BlockFilter(start, job)  # a restart: η as last applied, not 0 until a block
    again.restore_checkpoint(rule.checkpoint_state())
    assert again.figures()["block_momentum"] == rule.figures()["block_momentum"] == 0.5


def test_nbm_sends_the_look_ahead_and_nesterov_is_pytorchs_outer_sgd() -> None:
    start = RNG.standard_normal(SIZE).astype(np.float32)
    nbm = BlockFilter(start, JobSpec(mode="bmuf", block_filter="nbm", block_momentum=0.5))
    outer = BlockFilter(start, JobSpec(mode="bmuf", block_filter="nesterov"))
    w_nbm, d_nbm = start.astype(np.float64), np.zeros(SIZE)
    w_torch, u = start.astype(np.float64), np.zeros(SIZE)  # torch.optim.SGD(nesterov=True)
    for _ in range(4):
        (g,) = _deltas(1)
        for rule in (nbm, outer):
            out = rule.steps([[g * 10]], [10], 0.1)
            assert out is not None
            rule.publish(out)
        d_nbm = 0.5 * d_nbm + g
        w_nbm = w_nbm + d_nbm
        np.testing.assert_allclose(nbm.model, w_nbm, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(nbm.snapshot, w_nbm + 0.5 * d_nbm, rtol=1e-5, atol=1e-5)
        u = 0.9 * u + g  # the pseudo-gradient is -g; SGD's step with lr 0.7 subtracts it
        w_torch = w_torch + 0.7 * (g + 0.9 * u)
        np.testing.assert_allclose(outer.model, w_torch, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(outer.snapshot, outer.model)  # workers start from it


def test_average_and_async_blocks_and_nan() -> None:
    start = np.zeros(SIZE, np.float32)
    average = BlockFilter(start, JobSpec(mode="bmuf", block_filter="average"))
    d = _deltas(3)
    out = average.steps([[x * 5 for x in d]], [15], 0.1)
    assert out is not None
    np.testing.assert_allclose(out, sum(d) / 3, rtol=1e-5, atol=1e-6)  # the models' mean
    loose = BlockFilter(start, JobSpec(mode="bmuf", block_filter="average", block_sync=False))
    loose.set_workers(4)
    out = loose.steps([[d[0] * 5]], [5], 0.1)  # one block as it arrives, scaled by 1/N
    assert out is not None
    np.testing.assert_allclose(out, d[0] / 4, rtol=1e-5, atol=1e-6)
    bad = d[1].copy()
    bad[3] = np.nan
    assert loose.steps([[bad]], [1], 0.1) is None  # nothing changed
    np.testing.assert_array_equal(loose.weights, out)


class _Quadratic:
    """A backend whose gradient sum is ``sum over patterns of (w - target)``."""

    def __init__(self, target: np.ndarray) -> None:
        self.target = target

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        np.multiply(weights - self.target, np.float32(len(frames)), out=out)
        return 0.0, 0


def test_a_local_block_is_momentum_sgd_and_sends_its_weighted_delta() -> None:
    spec = NetworkSpec.parse("3:4:2")
    layout = ElementLayout.for_network(spec)
    job = JobSpec(network=spec, mode="bmuf", bunch_size=4, momentum=0.5,
                  data=DataSpec(source="x.npz"))  # fmt: skip
    target = RNG.standard_normal(layout.size).astype(np.float32)
    trainer = LocalTrainer(_Quadratic(target), layout, job)  # type: ignore[arg-type]
    start = np.zeros(layout.size, np.float32)
    out = np.empty_like(start)
    loss, correct, used = trainer.block(start, np.arange(10), out, rate=0.1)
    assert used == 10 and (loss, correct) == (0.0, 0)
    w, v = start.astype(np.float64), np.zeros(layout.size)
    for _bunch in (4, 4, 2):  # bunches of 4, the last one short
        v = 0.5 * v - 0.1 * (w - target)
        w = w + v
    np.testing.assert_allclose(out, 10 * (w - start), rtol=1e-5, atol=1e-5)


def _overlapping_trainer() -> tuple[LocalTrainer, np.ndarray]:
    """A bmuf worker's trainer with overlap on a tiny network, plain SGD (no momentum) on
    ``_Quadratic``'s bowl around the target it returns; bunches of 4."""
    spec = NetworkSpec.parse("3:4:2")
    layout = ElementLayout.for_network(spec)
    job = JobSpec(network=spec, mode="bmuf", bunch_size=4, momentum=0.0, block_overlap=True,
                  data=DataSpec(source="x.npz"))  # fmt: skip
    target = RNG.standard_normal(layout.size).astype(np.float32)
    return LocalTrainer(_Quadratic(target), layout, job), target  # type: ignore[arg-type]


def test_an_overlapping_block_sends_its_own_progress_moved_onto_the_newest_weights() -> None:
    """With overlap, the second block starts from the copy the first one left (not from
    the weights passed), sends its own progress, and ``rebase`` puts that progress on the
    weights that came meanwhile: the copy is then those weights plus what is unsent."""
    trainer, target = _overlapping_trainer()
    start = np.zeros_like(target)
    first, second = np.empty_like(start), np.empty_like(start)
    trainer.block(start, np.arange(4), first, rate=0.5)  # w = 0.5 target
    np.testing.assert_allclose(first, 4 * 0.5 * target, rtol=1e-6)
    ignored = np.full_like(start, 100.0)
    trainer.block(ignored, np.arange(4), second, rate=0.5)  # from 0.5 target: 0.75 target
    np.testing.assert_allclose(second, 4 * 0.25 * target, rtol=1e-6, atol=1e-6)
    newest = RNG.standard_normal(target.size).astype(np.float32)  # held the first delta
    trainer.rebase(newest)
    np.testing.assert_allclose(trainer.local, newest + 0.25 * target, rtol=1e-6, atol=1e-6)
    third, moved = np.empty_like(start), trainer.local.copy()
    trainer.block(ignored, np.arange(4), third, rate=0.5)  # from there, half way to target
    np.testing.assert_allclose(third, 4 * 0.5 * (target - moved), rtol=1e-5, atol=1e-5)


def test_weights_offered_between_blocks_are_where_the_next_block_starts() -> None:
    """Weights holding the last delta that come while no block computes (at an epoch's
    end, or a newbob roll-back) are where the next block starts; before the first block
    an offer is dropped (the weights the block is given are no older)."""
    trainer, target = _overlapping_trainer()
    start, out = np.zeros_like(target), np.empty_like(target)
    trainer.offer(np.full_like(start, 7.0))  # older than what the first block is given
    trainer.block(start, np.arange(4), out, rate=0.5)
    np.testing.assert_allclose(out, 4 * 0.5 * target, rtol=1e-6)  # from 0, not from 7
    newest = RNG.standard_normal(target.size).astype(np.float32)
    trainer.offer(newest)  # the filtered weights, holding that delta, while idle
    trainer.block(np.full_like(start, 100.0), np.arange(4), out, rate=0.5)
    np.testing.assert_allclose(out, 4 * 0.5 * (target - newest), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trainer.local, newest + out / 4, rtol=1e-5, atol=1e-5)


def test_weights_offered_during_a_block_move_its_progress_at_the_next_bunch() -> None:
    """The overlap's own path: weights that come while a block computes (offered by the
    event loop) are taken at the next bunch's boundary; the rest of the block trains on
    them plus its own progress, and its delta is its progress over the whole block."""
    trainer, target = _overlapping_trainer()
    newest = RNG.standard_normal(target.size).astype(np.float32)
    calls = 0
    plain = trainer.backend.gradient

    def offering(weights: np.ndarray, frames: np.ndarray, out: np.ndarray) -> tuple[float, int]:
        nonlocal calls
        calls += 1
        if calls == 3:  # the second block's first bunch: the weights holding the first delta
            trainer.offer(newest)
        return plain(weights, frames, out)

    trainer.backend.gradient = offering  # type: ignore[method-assign]
    start, first, second = (np.zeros_like(target) for _ in range(3))
    trainer.block(start, np.arange(8), first, rate=0.5)  # two bunches: w = 0.75 target
    trainer.block(start, np.arange(8), second, rate=0.5)
    # bunch 1 from 0.75 t to 0.875 t (progress 0.125 t), moved onto newest; bunch 2 halfway
    w = newest + 0.125 * target
    w = w - 0.5 * (w - target)
    np.testing.assert_allclose(second / 8, w - newest, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trainer.local, w, rtol=1e-5, atol=1e-5)


def test_sync_blocks_of_one_bunch_without_momentum_are_sync_steps(cluster: Cluster) -> None:
    """Each synchronous block of one bunch, filtered with eta = 0 and zeta = 1, is the sync
    step on the same round: the plain SGD step over the union of the round's frames
    (replayed from the trace; which frames share a round depends on timing)."""
    trace_file = cluster.tmp_path / "trace.jsonl"
    server = cluster.server(
        "--mode", "bmuf", "--block-bunches", "1", "--block-filter", "average",
        "--momentum", "0", "--learning-rates", "0.2", "--epochs", "1", "--min-workers", "2",
        "--trace-file", str(trace_file), *SMALL_JOB,
    )  # fmt: skip
    workers = [cluster.worker(server, f"w{i}") for i in range(2)]
    assert server.wait(120) == 0 and [w.wait(30) for w in workers] == [0, 0]
    ledger = server.final_status()["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]
    trace = [json.loads(line) for line in trace_file.open()]
    trace = [step for step in trace if "updates" in step]
    assert sum(len(step["updates"]) == 2 for step in trace) >= 10  # rounds of both workers
    expected = replay_sequentially(trace, NetworkSpec.parse("117:64:10"), momentum=0.0)
    got = np.concatenate([a.ravel() for a in load_weights(server.out_dir / "weights.npz")])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("block_sync", "overlap"), [("true", "false"), ("false", "false"), ("true", "true"),
                                ("false", "true")],
)  # fmt: skip
def test_one_worker_with_no_block_momentum_trains_as_snet_train(
    cluster: Cluster, block_sync: str, overlap: str
) -> None:
    """Alone, with eta = 0, a worker's blocks are snet train's bunches, in sync and in async
    blocks (where each block must start on the weights that hold the one before), with
    and without overlap (where each block's progress is moved onto those weights)."""
    block_filter = "average"
    job = ("--epochs", "2", "--learning-rates", "0.2,0.1", *SMALL_JOB)
    server = cluster.server(
        "--mode", "bmuf", "--block-filter", block_filter, "--block-sync", block_sync,
        "--block-overlap", overlap, *job,
    )  # fmt: skip
    worker = cluster.worker(server, "alone")
    assert server.wait(120) == 0 and worker.wait(30) == 0
    sequential = cluster.tmp_path / "sequential"
    run_process(
        [sys.executable, "-m", "snet.cli", "train", "--out-dir", str(sequential), *job],
        check=True, timeout=120,
    )  # fmt: skip
    got = np.concatenate([a.ravel() for a in load_weights(server.out_dir / "weights.npz")])
    expected = np.concatenate([a.ravel() for a in load_weights(sequential / "weights.npz")])
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    status = server.final_status()
    assert status["rule"]["filter"] == block_filter and status["rule"]["blocks"] > 0
    assert status["rule"]["overlap"] == (overlap == "true")


def test_two_overlapping_workers_train_every_frame_once_in_rounds_of_both(
    cluster: Cluster,
) -> None:
    """Two workers overlapping their blocks with the exchange: the server's rounds still
    take a delta of each, every frame is trained once an epoch, and the net learns."""
    trace_file = cluster.tmp_path / "trace.jsonl"
    server = cluster.server(
        "--mode", "bmuf", "--block-overlap", "true", "--block-bunches", "4", "--epochs", "2",
        "--min-workers", "2", "--trace-file", str(trace_file), *SMALL_JOB,
    )  # fmt: skip
    workers = [cluster.worker(server, f"w{i}") for i in range(2)]
    assert server.wait(120) == 0 and [w.wait(30) for w in workers] == [0, 0]
    status = server.final_status()
    for epoch in status["epochs"]:
        assert epoch["ledger"]["used_once"] == epoch["ledger"]["frames"]
    trace = [json.loads(line) for line in trace_file.open()]
    rounds = [step for step in trace if "updates" in step]
    assert sum(len(step["updates"]) == 2 for step in rounds) >= 10
    assert status["rule"]["overlap"] == 1
    shown = next(line for line in render(status).splitlines() if line.startswith("blocks:"))
    # cbm's default eta with overlapping blocks is 0, as with async ones (block_filter.py);
    # the line's other forms: tests/test_status_reading.py
    assert re.search(r"^blocks: cbm, sync blocks of 4 bunches, overlapping the exchange, "
                     r"\d+ filtered, eta 0, zeta 1, ", shown)  # fmt: skip
