"""End-to-end training with a real server and real workers on 127.0.0.1: in-process (the
fast ring) where the process boundary does not matter, as processes (the system ring)
where it does (a worker killed, a signal, the loop chosen by SNET_LOOP)."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from snet.protocol.network import NetworkSpec, initial_weights

from helpers import SMALL_JOB, Cluster, wait_until
from inprocess import Lab
from sequential_replay import load_weights, replay_sequentially
from short_data import short_data


async def test_sync_two_workers_equal_sequential_training(lab: Lab) -> None:
    # on a third of the data (tests/short_data.py): the subject is that the steps equal
    # their sequential replay, bunch for bunch, not how much the net learns
    server = await lab.server(
        "--mode",
        "sync",
        "--min-workers",
        "2",
        "--epochs",
        "1",
        "--momentum",
        "0.9",
        "--learning-rates",
        "0.1",
        "--trace-file",
        str(lab.tmp_path / "trace.jsonl"),
        *SMALL_JOB,
        "--data",
        short_data(),
    )
    workers = [lab.worker(server, f"w{i}") for i in range(2)]
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in workers] == [0, 0]

    trace = [json.loads(line) for line in (lab.tmp_path / "trace.jsonl").open()]
    assert len(trace) > 50
    # Each synchronous step combines one update per worker computed on the same version.
    two_worker_steps = [s for s in trace if len(s["updates"]) == 2]
    assert len(two_worker_steps) >= 10, f"{len(two_worker_steps)} of {len(trace)} steps"
    for step in trace:
        assert {u["base_version"] for u in step["updates"]} == {step["version"] - 1}
        assert len({u["worker"] for u in step["updates"]}) == len(step["updates"])

    spec = NetworkSpec.parse("117:64:10")
    expected = replay_sequentially(trace, spec, momentum=0.9, data=short_data())
    got = np.concatenate([a.ravel() for a in load_weights(server.out_dir / "weights.npz")])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    assert np.abs(got - initial_weights(spec, seed=1)).max() > 0.05  # it really trained


# One loop (tests/README.md): its subject is learning through stale updates, not the loop;
# async training on asyncio is run by test_faults.py and test_data_division.py.
@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_async_three_workers_converge_with_staleness(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "3", *SMALL_JOB)
    workers = [lab.worker(server, f"w{i}") for i in range(3)]
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in workers] == [0, 0, 0]
    status = server.final_status()
    assert status["mode"] == "async"
    assert status["epochs_done"] == 3
    epochs = status["epochs"]
    assert status["cv_accuracy"] > 0.7, epochs
    assert epochs[-1]["cv_loss"] < epochs[0]["cv_loss"], epochs
    assert status["staleness_max"] > 0
    assert sum(int(k) * v for k, v in status["staleness_histogram"].items()) > 0
    rows = {row["name"]: row for row in status["workers"]}
    assert set(rows) == {"w0", "w1", "w2"}
    assert all(row["updates_sent"] > 10 for row in rows.values())
    assert all(row["backend"] in ("numpy", "torch") for row in rows.values())
    for epoch in status["epochs"]:  # every training frame applied exactly once per epoch
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0


@pytest.mark.system
def test_worker_killed_mid_run_sync_mode_carries_on(cluster: Cluster) -> None:
    cluster.env["SNET_LOOP"] = "asyncio"  # the other system tests run on uvloop
    # and most on numpy's step (helpers.py; a job this small would take it anyway:
    # client/kernel_choice.py): this one on the compiled step, in real processes, unless
    # the run chose a step for all
    cluster.env["SNET_KERNELS"] = os.environ.get("SNET_KERNELS", "numba")
    server = cluster.server("--mode", "sync", "--epochs", "3", "--linger-seconds", "30", *SMALL_JOB)
    workers = [cluster.worker(server, f"w{i}") for i in range(3)]
    wait_until(
        lambda: server.status()["workers_live"] == 3 and server.status()["steps"] > 20,
        60,
        "three workers training",
    )
    workers[1].send_signal(signal.SIGKILL)
    killed_at = server.status()["weight_version"]

    def gone() -> bool:
        rows = {row["name"]: row for row in server.status()["workers"]}
        return rows["w1"]["state"] == "gone"

    wait_until(gone, 30, "/status to show the killed worker gone")
    wait_until(
        lambda: server.status()["weight_version"] > killed_at + 20,
        60,
        "training to continue after the kill",
    )
    wait_until(lambda: server.status()["state"] == "trained", 120, "training to finish")
    status = server.status()
    assert status["epochs_done"] == 3
    rows = {row["name"]: row for row in status["workers"]}
    assert rows["w1"]["state"] == "gone" and "connection lost" in rows["w1"]["left_reason"]
    # The two survivors trained to the end and were sent home at once (the server lingers).
    assert [rows[name]["left_reason"] for name in ("w0", "w2")] == ["server trained"] * 2
    assert status["workers_live"] == 0
    for epoch in status["epochs"]:  # nothing the dead worker held was lost
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"], ledger
    assert (
        status["epochs"][0]["ledger"]["requeued_frames"]
        + sum(e["ledger"]["requeued_frames"] for e in status["epochs"][1:])
        > 0
    )
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert workers[0].wait(30) == 0 and workers[2].wait(30) == 0


@pytest.mark.system
def test_sigterm_shuts_down_gracefully_and_writes_weights(cluster: Cluster) -> None:
    server = cluster.server("--mode", "async", "--epochs", "50", *SMALL_JOB)
    # It waits --retry-seconds for a stopped server to come back before it exits 0.
    worker = cluster.worker(server, "w0", "--retry-seconds", "1")
    wait_until(lambda: server.status()["steps"] > 10, 60, "training to start")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert worker.wait(30) == 0
    weights = load_weights(server.out_dir / "weights.npz")
    assert [w.shape for w in weights] == [(117, 64), (64,), (64, 10), (10,)]
    final = server.final_status()
    assert final["state"] == "stopping" and final["weight_version"] > 10
    assert "goodbye" in cluster.log("w0") and time.time() > 0
