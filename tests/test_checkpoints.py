"""Checkpoint files, the parts' saved states, and the worker's one retry deadline.

The file format is fed damaged bytes (truncated, one bit flipped); the store keeps the
newest K and passes over a damaged newest file; the lease book restored from a checkpoint
queues exactly the frames its weights do not include; bmuf's block filter and the norm
bounds go on exactly as before. The worker's retry deadline is tried
against a real process and a port that accepts connections and drops them at once (a
server still starting, or broken): each TCP connect used to renew the deadline for ever.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from snet.client.buffers import WeightsBox
from snet.protocol.digest import weights_digest
from snet.protocol.errors import CodecError
from snet.protocol.job import JobSpec
from snet.protocol.messages import EvalResult, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.block_filter import BlockFilter
from snet.server.checkpoint import (
    CheckpointDamaged,
    CheckpointStore,
    decode_checkpoint,
    encode_checkpoint,
)
from snet.server.epochs import EpochControl
from snet.server.leases import LeaseBook
from snet.server.plausible import NormBounds
from snet.server.stats import TrainingStats

from helpers import Cluster


def _state() -> dict[str, object]:
    return {
        "version": 7,
        "nested": {"weights": np.arange(10, dtype=np.float32), "flags": [True, None, 1.5]},
        "ledgers": [{"uses": np.zeros(5, np.uint16)}, {"uses": np.ones(5, np.uint16)}],
        "empty": np.zeros(0, np.int64),
    }


def test_checkpoint_bytes_round_trip_and_damage_is_detected() -> None:
    data = encode_checkpoint(_state())
    back = decode_checkpoint(data)
    assert back["version"] == 7 and back["nested"]["flags"] == [True, None, 1.5]
    assert back["nested"]["weights"].dtype == np.float32
    assert back["nested"]["weights"].tolist() == list(range(10))
    assert back["ledgers"][1]["uses"].tolist() == [1] * 5 and back["empty"].shape == (0,)
    with pytest.raises(CheckpointDamaged, match="truncated"):
        decode_checkpoint(data[:-1])
    for position in (3, 40, len(data) // 2, len(data) - 40):
        flipped = bytearray(data)
        flipped[position] ^= 0x10
        with pytest.raises(CheckpointDamaged):
            decode_checkpoint(bytes(flipped))


def test_store_keeps_the_newest_and_falls_back_past_a_damaged_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    assert store.newest() is None
    for version in range(4):
        store.write({"version": version})
    assert store.sequence_numbers() == [3, 4]
    assert store.newest().state["version"] == 3  # type: ignore[union-attr]
    (tmp_path / "ckpt" / ".ckpt-00000005.snet.x1y2").write_bytes(b"half")  # a crash mid-write
    newest = store.path(4)
    newest.write_bytes(newest.read_bytes()[:20])
    loaded = store.newest()
    assert loaded is not None and loaded.state["version"] == 2 and loaded.skipped
    assert CheckpointStore(tmp_path / "ckpt").sequence_numbers() == [3, 4]  # only read
    # resumed, the damaged one is set aside: it counted among the 2 kept, and the next
    # write deleted checkpoint 3, leaving one that reads back (a probe)
    store.set_aside_newer(loaded)
    assert CheckpointStore(tmp_path / "ckpt").sequence_numbers() == [3]
    assert (tmp_path / "ckpt" / "ckpt-00000004.snet.damaged").exists()
    store.write({"version": 4})
    assert store.sequence_numbers() == [3, 5]  # 4 is not used again
    store.remove_leftovers()
    assert not list((tmp_path / "ckpt").glob(".ckpt-*"))
    store.path(3).write_bytes(b"SNETCKPT" + bytes(60))
    store.path(5).write_bytes(b"SNETCKPT" + bytes(60))
    with pytest.raises(CheckpointDamaged, match="no usable checkpoint"):
        store.newest()
    store.clear()
    assert store.sequence_numbers() == [] and store.newest() is None
    assert not list((tmp_path / "ckpt").iterdir())  # the damaged ones too


def _book(job: JobSpec) -> LeaseBook:
    return LeaseBook.for_job(job, np.arange(5, 1005), 1010, job.chunk_frames)


def test_checkpoints_past_the_hundred_millionth_are_found_and_pruned(tmp_path: Path) -> None:
    """Names were read as 8 digits and written as at least 8: from 10**8 on, a restart
    resumed from checkpoint 99,999,999 and nothing was pruned again (found by a probe)."""
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    store.write({"version": 1})
    store.path(1).rename(store.path(99_999_999))
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    for version in (2, 3):
        store.write({"version": version})
    assert store.path(100_000_001).name == "ckpt-100000001.snet"
    assert store.sequence_numbers() == [100_000_000, 100_000_001]  # 99,999,999 pruned
    assert store.newest().state["version"] == 3  # type: ignore[union-attr]
    (tmp_path / "ckpt" / "ckpt-000000007.snet").write_bytes(b"x")  # not a name it writes
    assert CheckpointStore(tmp_path / "ckpt").sequence_numbers() == [100_000_000, 100_000_001]


def test_restored_book_leases_exactly_what_the_weights_lack() -> None:
    job = JobSpec(chunk_frames=64, bunch_size=16, shuffle_cache_bunches=1)
    book = _book(job)
    book.start_epoch(0)
    book.start_epoch(1)
    applied: list[np.ndarray] = []
    for worker in (1, 2):
        lease = book.grant(worker)
        assert lease is not None
        applied.append(book.accept(worker, lease.lease_id, 0, 32))  # applied
        book.accept(worker, lease.lease_id, 32, 16)  # accepted, never applied
    for frames in applied:
        book.record_applied(frames)
    saved = decode_checkpoint(encode_checkpoint(book.checkpoint_state()))

    restored = _book(job)
    requeued = restored.restore_checkpoint(saved)
    assert requeued == 1000 - 64 and restored.leases_out == 0 and restored.epoch == 1
    assert restored.ledger.epoch == 1 and restored.ledger.uses.sum() == 64
    worker = 1
    while (lease := restored.grant(worker)) is not None:
        frames = restored.accept(worker, lease.lease_id, 0, len(lease.indices))
        restored.record_applied(frames)
    assert restored.epoch_complete
    assert restored.ledger.summary()["used_once"] == 1000
    assert restored.ledger.summary()["used_more"] == 0


@pytest.mark.parametrize("kind", ["cbm", "nbm", "nesterov"])
def test_a_restored_block_filter_steps_exactly_as_the_original(kind: str) -> None:
    """bmuf: what the workers start from (the look-ahead for nbm) and the model saved
    (nesterov's look-ahead) are restored as they were, and so is Δ: the next blocks
    give the same results bit for bit."""
    rng = np.random.default_rng(3)
    start = rng.standard_normal(300).astype(np.float32)
    job = JobSpec(mode="bmuf", block_filter=kind, block_momentum=0.5)
    deltas = [rng.standard_normal(300).astype(np.float32) for _ in range(5)]
    original = BlockFilter(start, job)

    def block(rule: BlockFilter, delta: np.ndarray) -> None:
        out = rule.steps([[delta * 10]], [10], 0.1)
        assert out is not None
        rule.publish(out)

    for delta in deltas[:3]:
        block(original, delta)
    saved = decode_checkpoint(encode_checkpoint(original.checkpoint_state()))
    restored = BlockFilter(np.zeros(300, np.float32), job)
    restored.restore_checkpoint(saved)
    assert restored.blocks == original.blocks == 3
    for rule in (original, restored):
        for delta in deltas[3:]:
            block(rule, delta)
    assert np.array_equal(restored.snapshot, original.snapshot)
    assert np.array_equal(restored.model, original.model)
    assert not restored.snapshot.flags.writeable and not restored.model.flags.writeable


def test_restored_norm_bounds_judge_updates_as_before() -> None:
    """A restarted server refuses an implausible update at once, as it would have before
    the restart, rather than learning the updates' norms from scratch."""
    bounds = NormBounds()
    kinds = [(False, "none"), (True, "int8")]
    for _ in range(50):
        for kind in kinds:
            assert bounds.problem(kind, np.full(100, 0.01, np.float32), 10) == ""
    restored = NormBounds()
    restored.restore_checkpoint(
        decode_checkpoint(encode_checkpoint({"b": bounds.checkpoint_state()}))["b"]
    )
    assert restored.view() == bounds.view()  # means, counts, bounds and their judges
    huge = np.full(100, 100.0, np.float32)
    assert "implausible" in restored.problem(kinds[0], huge, 10)
    assert NormBounds().problem(kinds[0], huge, 10) == ""  # a fresh one would have taken it
    # rows written before the spread was kept: [kind..., log mean, seen], no spread yet
    old_rows = [[*kind, row["log_mean"], row["seen"]] for kind, row in
                zip(kinds, bounds.checkpoint_state(), strict=True)]  # fmt: skip
    older = NormBounds()
    older.restore_checkpoint(old_rows)

    def means(judged: NormBounds) -> list[tuple[str, float, int]]:
        return [(row["kind"], row["norm_per_pattern"], row["updates"]) for row in judged.view()[0]]

    assert means(older) == means(bounds)  # (no spread known: the bounds differ)
    assert "implausible" in older.problem(kinds[0], huge, 10)


def test_schedule_and_statistics_survive_a_round_trip() -> None:
    job = JobSpec(schedule="newbob", epochs=8)
    control = EpochControl(job)
    weights = np.ones(4, np.float32)
    control.epoch_trained(0)
    control.cv_result(0, weights, EvalResult(1, 0, 100, 60, 1.0))
    control.epoch_trained(1)
    control.cv_result(1, weights * 2, EvalResult(2, 1, 100, 61, 1.0))
    stats = TrainingStats(8)
    stats.start_epoch(0, 0.2)
    stats.record_train(128, 100, 3.5)
    stats.record_staleness(2)
    stats.end_epoch(0, 40, {"used_once": 5})
    saved = decode_checkpoint(
        encode_checkpoint({"epochs": control.checkpoint_state(), "stats": stats.checkpoint_state()})
    )
    again, counted = EpochControl(job), TrainingStats(8)
    again.restore_checkpoint(saved["epochs"])
    counted.restore_checkpoint(saved["stats"])
    assert (again.rate, again.kept, again.epoch) == (control.rate, control.kept, control.epoch)
    assert again.newbob is not None and control.newbob is not None
    assert vars(again.newbob) == vars(control.newbob)
    assert again.best_weights is not None and again.best_weights.tolist() == [2.0] * 4
    assert counted.staleness_histogram == {2: 1} and counted.epochs_done == 1
    assert counted.epochs[0].as_dict() | {"seconds": 0} == stats.epochs[0].as_dict() | {
        "seconds": 0
    }


def test_an_epochs_seconds_count_from_its_first_lease_not_the_wait_for_workers() -> None:
    """The first epoch began with the server, and /status showed the wait for the
    workers as its training time (27.8 s for a 1.5 s epoch)."""
    stats = TrainingStats(2)
    stats.start_epoch(0, 0.2)
    stats.epochs[0].started -= 30.0  # the server waited 30 s for its workers
    stats.leasing(False)  # nobody to lease to yet
    assert stats.epochs[0].leased is None
    assert stats.epochs[0].as_dict()["seconds"] == 0.0  # the wait showed, growing, till now
    stats.leasing(True)
    first = stats.epochs[0].leased
    stats.leasing(True)  # later leases of the same epoch change nothing
    assert first is not None and stats.epochs[0].leased == first
    stats.end_epoch(0, 10, {})
    assert stats.epochs[0].as_dict()["seconds"] < 5.0
    state = stats.checkpoint_state()
    del state["epochs"][0]["leased"]  # a checkpoint written before epochs kept it
    restored = TrainingStats(2)
    restored.restore_checkpoint(state)
    assert restored.epochs[0].as_dict()["seconds"] >= 30.0  # as it was counted then


def test_a_worker_checks_the_digest_the_server_announced() -> None:
    layout = ElementLayout.for_network(NetworkSpec((4, 3, 2), ("sigmoid",)))
    box = WeightsBox(layout, wake=asyncio.Event())
    flat = np.arange(layout.size, dtype=np.float32)
    box.receive(Weights(1, 0, 0.1, 0, flat, digest=weights_digest(flat)))
    box.receive(Weights(2, 0, 0.1, 0, flat))  # none announced: nothing to check
    changed = flat.copy()
    changed[3] += 1e-6  # one value off by the least amount
    with pytest.raises(CodecError, match="the server announced"):
        box.receive(Weights(3, 0, 0.1, 0, changed, digest=weights_digest(flat)))
    assert box.undecodable == 1 and box.take_newest() is not None
    assert box.current is not None and box.current.version == 2


@pytest.fixture
def slammer() -> Iterator[int]:
    """A port that accepts every connection and closes it at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_one_retry_deadline_across_connections_that_drop(cluster: Cluster, slammer: int) -> None:
    worker = cluster._spawn(
        ["worker", "--server", f"127.0.0.1:{slammer}", "--name", "w", "--retry-seconds", "3"],
        cluster.tmp_path / "w.log",
    )
    assert worker.wait(60) == 3, cluster.log("w")[-2000:]
    log = cluster.log("w")
    assert "connection closed during the handshake" in log and "gave up after" in log


def test_a_network_that_differs_only_in_its_activations_is_named_so() -> None:
    """A restart with --activation tanh was refused as "network 117:1024:10 there,
    117:1024:10 here": the sizes alone, the difference hidden."""
    from snet.protocol.job import JobSpec
    from snet.protocol.network import NetworkSpec
    from snet.server.durability import _setting

    tanh = JobSpec(network=NetworkSpec.parse("117:1024:10", "tanh")).to_dict()["network"]
    assert _setting(JobSpec().to_dict()["network"]) == "117:512:10 sigmoid"
    assert _setting(tanh) == "117:1024:10 tanh"
