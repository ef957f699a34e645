"""Newbob (hand-worked sequences), the workers' cache shuffle, hooks, and the CLONES-style
network description."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from snet.protocol.errors import ConfigError
from snet.protocol.hooks import BunchEvent, EpochEvent, Hook, HookSet, RunInfo, load_hook
from snet.protocol.job import JobSpec
from snet.protocol.network import NetworkSpec
from snet.protocol.schedule import NewbobSchedule, make_schedule
from snet.protocol.shuffle import cache_order
from snet.server.leases import LeaseBook

# ---------------------------------------------------------------- newbob


def test_newbob_reproduces_quicknets_own_test_sequence() -> None:
    # QN_RateSchedule_NewBoB(0.01, 0.5, ramp 1.0, stop 0.5): Quicknet's testsuite values
    schedule = NewbobSchedule(0.01, 0.5, 1.0, 0.5, max_epochs=100)
    rates = [schedule.after_epoch(e).next_rate for e in (29.0, 28.1, 27.4, 28.0)]
    assert rates == [0.01, 0.005, 0.0025, 0.0]


def test_newbob_hand_worked_sequence_with_roll_back() -> None:
    """qnstrn defaults (scale 0.5, ramp 0.5, stop 0.5), rate 0.008, CV errors in percent.

    epoch  error  best before  gain   state            next rate  kept
      1    30.0   100.0        70.0   flat             0.008      yes (30.0 < 100)
      2    25.0    30.0         5.0   flat             0.008      yes
      3    24.8    25.0         0.2   ramp starts      0.004      yes
      4    26.0    24.8        -1.2   ramping, < stop  0 (stop)   no: 26.0 > 24.8
    """
    schedule = NewbobSchedule(0.008, 0.5, 0.5, 0.5, max_epochs=10)
    decisions = [schedule.after_epoch(e) for e in (30.0, 25.0, 24.8, 26.0)]
    assert [d.next_rate for d in decisions] == [0.008, 0.008, 0.004, 0.0]
    assert [d.restore_best for d in decisions] == [False, False, False, True]
    assert decisions[-1].stop and schedule.lowest_error == 24.8


def test_newbob_keeps_halving_while_ramping_and_rolls_back_a_worse_epoch() -> None:
    schedule = NewbobSchedule(0.1, 0.5, 0.5, 0.5, max_epochs=10)
    steps = [(20.0, 0.1, False), (19.8, 0.05, False), (18.0, 0.025, False)]
    # 18.5 is worse than 18.0: gain -0.5 < stop ends training, and the epoch is rolled back
    steps += [(18.5, 0.0, True)]
    for error, rate, restored in steps:
        decision = schedule.after_epoch(error)
        assert (decision.next_rate, decision.restore_best) == (rate, restored), error


def test_newbob_max_epochs_and_job_settings() -> None:
    schedule = NewbobSchedule(0.01, 0.5, 1.0, 0.5, max_epochs=3)
    assert [schedule.after_epoch(e).next_rate for e in (29.0, 28.1, 26.0)] == [0.01, 0.005, 0.0]
    job = JobSpec(schedule="newbob", learning_rates=(0.3,), newbob_scale=0.25, newbob_ramp=2.0)
    newbob = make_schedule(job)
    assert newbob is not None and (newbob.rate, newbob.scale, newbob.ramp) == (0.3, 0.25, 2.0)
    assert make_schedule(JobSpec()) is None
    with pytest.raises(ConfigError, match="newbob_scale"):
        JobSpec(schedule="newbob", newbob_scale=1.5)
    with pytest.raises(ConfigError, match="schedule must be one of"):
        JobSpec(schedule="exponential")
    # newbob's own settings under the list schedule were accepted and changed nothing
    for name, value in (("newbob_stop", 3.0), ("newbob_ramp", 0.3), ("newbob_scale", 0.25)):
        with pytest.raises(ConfigError) as ignored:
            JobSpec(**{name: value})
        assert str(ignored.value).startswith(
            f"{name} {value:g} applies to the newbob schedule only, and this job's schedule "
            "is list, which would ignore it"
        )
        assert getattr(JobSpec(schedule="newbob", **{name: value}), name) == value
        # but a job an older snet let through (a welcome, a checkpoint's) is read as it
        # trained, with the setting at its default, not refused
        older = JobSpec.from_dict({**JobSpec().to_dict(), name: value})
        assert getattr(older, name) == getattr(JobSpec(), name) and older.schedule == "list"


# ---------------------------------------------------------------- the cache shuffle


def test_cache_order_permutes_within_each_cache_only() -> None:
    indices = np.arange(100, 350)
    order = cache_order(indices, lease_id=5, seed=1, cache_frames=64)
    for start in range(0, 250, 64):
        assert sorted(order[start : start + 64]) == list(indices[start : start + 64])
    assert not np.array_equal(order, indices)
    np.testing.assert_array_equal(order, cache_order(indices, 5, 1, 64))  # reproducible
    assert not np.array_equal(order, cache_order(indices, 6, 1, 64))  # per lease
    np.testing.assert_array_equal(cache_order(indices, 5, 1, 1), indices)


@pytest.mark.parametrize(
    ("seed", "lease_id"), [(0, 0), (1, 5), (2**32 - 1, 2**31 - 1), (2**32, 3), (2**63 - 1, 7)]
)
def test_cache_order_is_the_protocols_generator_for_any_seed(seed: int, lease_id: int) -> None:
    """The order is ``default_rng([seed, lease_id, start])``'s permutation of each cache (a
    worker of another make computes it so): the faster seeding agrees for seeds that fit
    one 32-bit word, and larger ones go the plain way."""
    indices = np.arange(1000, 1300)
    expected = indices.copy()
    for start in range(0, 300, 64):
        run = indices[start : start + 64]
        generator = np.random.default_rng([seed, lease_id, start])
        expected[start : start + len(run)] = run[generator.permutation(len(run))]
    np.testing.assert_array_equal(cache_order(indices, lease_id, seed, 64), expected)


def test_lease_book_accounts_for_the_workers_shuffle() -> None:
    train = np.arange(0, 3000, 3)
    book = LeaseBook(train, 3000, chunk_frames=256, seed=4, cache_frames=64)
    book.start_epoch(0)
    lease = book.grant(worker_id=1)
    assert lease is not None
    # the Lease message carries the chunk; the worker trains in cache order; the book agrees
    np.testing.assert_array_equal(lease.indices, cache_order(lease.chunk, lease.lease_id, 4, 64))
    used = book.accept(1, lease.lease_id, 0, 32)
    np.testing.assert_array_equal(used, lease.indices[:32])
    assert book.worker_gone(1) == 256 - 32


def test_sequential_frame_order_leases_consecutive_frames() -> None:
    train = np.arange(1000)
    book = LeaseBook(train, 1000, chunk_frames=100, seed=2, sequential=True)
    book.start_epoch(0)
    chunks = []
    while (lease := book.grant(1)) is not None:
        chunks.append(lease.chunk)
    assert all(np.array_equal(c, np.arange(c[0], c[0] + 100)) for c in chunks)
    assert [c[0] for c in chunks] != sorted(c[0] for c in chunks)  # chunk order shuffled


# ---------------------------------------------------------------- hooks


class CountingHook(Hook):
    name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def before_training(self, info: RunInfo) -> None:
        self.calls.append(f"start {info.mode}")

    def after_bunch(self, event: BunchEvent) -> None:
        self.calls.append(f"bunch {event.patterns}")

    def after_epoch(self, event: EpochEvent) -> None:
        self.calls.append(f"epoch {event.epoch}")

    def figures(self) -> dict[str, int]:
        return {"calls": len(self.calls)}


class BrokenHook(Hook):
    name = "broken"

    def after_bunch(self, event: BunchEvent) -> None:
        raise RuntimeError("boom")


def test_hooks_are_called_and_a_broken_one_is_switched_off() -> None:
    counting = CountingHook()
    hooks = HookSet([BrokenHook(), counting])
    hooks.call("before_training", RunInfo("3:4:2", 26, "sync", 1, 10))
    for _ in range(2):
        hooks.call("after_bunch", BunchEvent(0, 1, 2, 8, 5, 3.5, 0.1))
    hooks.call("after_epoch", EpochEvent(0, 0.1, 16, 10, 4, 3, 1.0, True))
    assert counting.calls == ["start sync", "bunch 8", "bunch 8", "epoch 0"]
    figures = hooks.figures()
    assert figures["counting"] == {"calls": 4}
    assert figures["broken"]["disabled"] and "boom" in figures["broken"]["error"]


def test_load_hook_by_name() -> None:
    assert isinstance(load_hook("snet.protocol.hooks:McupsHook"), Hook)
    with pytest.raises(ConfigError, match=r"package\.module:ClassName"):
        load_hook("nocolon")
    with pytest.raises(ConfigError, match="cannot load hook"):
        load_hook("snet.protocol.hooks:Missing")


# ---------------------------------------------------------------- network description


def test_clones_style_description_any_depth() -> None:
    layers = [
        {"name": "in", "size": 117},
        {"name": "h1", "size": 64, "activation": "tanh"},
        {"name": "h2", "size": 32, "activation": "relu"},
        {"name": "h3", "size": 16},
        {"name": "out", "size": 10, "activation": "softmax"},
    ]
    connections = [
        {"from": "in", "to": "h1"},
        {"from": "h1", "to": "h2"},
        {"from": "h2", "to": "h3"},
        {"from": "h3", "to": "out"},
    ]
    spec = NetworkSpec.from_dict({"layers": layers, "connections": connections})
    assert spec == NetworkSpec((117, 64, 32, 16, 10), ("tanh", "relu", "sigmoid"))
    assert NetworkSpec.from_dict({"layers": layers}) == spec  # chain implied
    assert NetworkSpec.parse("117:64:32:16:10", "tanh").sizes == spec.sizes  # shorthand
    assert JobSpec.from_dict(JobSpec(network=spec).to_dict()).network == spec


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"connections": [{"from": "in", "to": "out"}]}, "chains of full connections"),
        ({"connections": [{"from": "in", "to": "nowhere"}]}, "no layer 'nowhere'"),
        ({"layers_out": "tanh"}, "output layer 'out' is softmax"),
        ({"layers_in": "relu"}, "input layer 'in' has no activation"),
    ],
)
def test_bad_descriptions_are_refused_clearly(change: dict[str, object], match: str) -> None:
    layers: list[dict[str, object]] = [
        {"name": "in", "size": 13, "activation": change.get("layers_in")},
        {"name": "h", "size": 8, "activation": "sigmoid"},
        {"name": "out", "size": 3, "activation": change.get("layers_out", "softmax")},
    ]
    description: dict[str, object] = {"layers": layers}
    if "connections" in change:
        description["connections"] = change["connections"]
    with pytest.raises(ConfigError, match=match):
        NetworkSpec.from_dict(description)


def test_the_cv_of_the_weights_held_skips_epochs_newbob_rolled_back() -> None:
    from snet.cli.status import held_weights_note
    from snet.server.stats import TrainingStats

    stats = TrainingStats(4)
    assert stats.weights_cv_accuracy() is None  # nothing scored yet
    for epoch, correct, kept in ((0, 80, True), (1, 90, True)):
        stats.start_epoch(epoch, 0.1)
        stats.end_epoch(epoch, 10 * (epoch + 1), {})
        stats.record_cv(epoch, 100, correct, 1.0)
        stats.mark_kept(epoch, kept, 10 * (epoch + 1) + 3)  # scored while training on
        assert stats.scored_version == 10 * (epoch + 1)  # the epoch's end
    stats.start_epoch(2, 0.1)
    stats.end_epoch(2, 30, {})
    stats.record_cv(2, 100, 85, 1.0)
    stats.mark_kept(2, False, 34)  # rolled back: the weights of epoch 1 are version 34
    assert stats.scored_version == 34
    stats.start_epoch(3, 0.05)  # training, not yet scored
    assert stats.latest("cv_accuracy") == 0.85  # the newest scored epoch, rolled back
    assert stats.weights_cv_accuracy() == 0.9  # the weights the server went on from
    document = {"cv_accuracy": 0.85, "weights_cv_accuracy": 0.9}
    assert held_weights_note(document) == " (rolled back; weights held 90.00%)"
    assert held_weights_note({"cv_accuracy": 0.9, "weights_cv_accuracy": 0.9}) == ""
    assert held_weights_note({"cv_accuracy": 0.9}) == ""  # a server from before the field


def test_a_run_newbob_ends_early_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """snet train (and the demo) showed 7 epochs of 20 and the weights, and no word why."""
    from snet.cli.main import main
    from snet.protocol.schedule import stopped_early

    job = JobSpec(schedule="newbob", epochs=20)
    assert stopped_early(job, 20) == "" and stopped_early(JobSpec(epochs=20), 7) == ""
    argv = ["train", "--network", "117:16:10", "--schedule", "newbob", "--epochs", "40",
            "--newbob-stop", "5", "--out-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    epochs = sum(line.startswith("epoch ") for line in lines)
    assert 2 <= epochs < 40
    assert lines[-2] == (
        f"newbob stopped training after epoch {epochs} of at most 40: its CV gained less "
        "than --newbob-stop (5 points) once the rate ramped down"
    )
    assert lines[-1] == f"weights in {tmp_path / 'weights.npz'}"
