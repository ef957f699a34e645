"""The fault switch (transport/faults.py) with real processes: each worker process is told
its own faults through its environment (``SNET_WORKER_FAULTS``), and training must
recover, with every training frame of every epoch applied exactly once (the system ring).
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers import QUICK_JOB, Cluster, ServerProcess, wait_until

pytestmark = pytest.mark.system
# The server leases nothing before both workers have joined: on a busy machine one worker
# started seconds after the other, and the small job was over before it joined, with
# none of its faults ever met. QUICK_JOB (bunches of 512): the subject is the faults and
# the ledger, not learning, and bunches of 128 took four times the updates.
JOB = ("--epochs", "2", "--linger-seconds", "30", "--min-workers", "2", *QUICK_JOB)
BUNCH = int(QUICK_JOB[QUICK_JOB.index("--bunch-size") + 1])


def test_a_lost_update_and_damaged_weights_cost_no_frame(cluster: Cluster) -> None:
    """The fault switch: worker 1 loses its 5th update on the way, worker 2 receives its
    9th weights damaged. The server finds the gap the lost update left and queues its
    frames again; worker 2 refuses the damaged frame, closes and joins again. Training
    completes and every training frame of every epoch is applied exactly once."""
    server = cluster.server("--mode", "async", *JOB)
    status = _train_with_faults(cluster, server, "drop:update:5;duplicate:update:9")
    server_log = server.log.read_text()
    assert f"updates of w1 were lost: {BUNCH} frames back in the queue" in server_log
    assert server_log.count("came again; ignored") == 1  # the 9th, delivered twice
    rows = [row for row in status["workers"] if row["name"] == "w2"]
    assert rows[0]["state"] == "gone" and len(rows) <= 2  # the server saw it join again,
    # if the job was not over by then
    # it joined again: said by the worker, since the rest of this short job may be over
    # (in 0.15 s) before its first retry (0.2 s), and a hello after the end is not a row
    assert cluster.log("w2").count("joined snet as worker") == 2


def test_a_lost_update_in_sync_mode_costs_no_frame(cluster: Cluster) -> None:
    """The same faults in sync mode: after losing its update worker 1 waits for the round
    and the round for it, so no later update shows the gap; the round deadline drops it
    (``round_deadline``), it joins again, and its undelivered frames go back."""
    server = cluster.server("--mode", "sync", *JOB)
    _train_with_faults(cluster, server)
    assert "dropped from the sync rounds: missed the round deadline" in cluster.log("w1")
    assert server.log.read_text().count("worker w1 (numpy") == 2  # it joined again


def test_a_lost_delta_of_overlapping_blocks_costs_no_frame(cluster: Cluster) -> None:
    """bmuf whose workers train the next block while the last delta is out: worker 1's
    lost delta holds its next one back (the weights holding it never come), the round
    deadline drops it, and it joins again; worker 2's damaged weights close it while it
    computes ahead. Every frame is still trained once an epoch."""
    server = cluster.server("--mode", "bmuf", "--block-overlap", "true", "--block-bunches",
                            "1", *JOB)  # fmt: skip
    _train_with_faults(cluster, server)
    assert "dropped from the sync rounds: missed the round deadline" in cluster.log("w1")
    assert server.final_status()["rule"]["overlap"] == 1


def _train_with_faults(
    cluster: Cluster, server: ServerProcess, first_faults: str = "drop:update:5"
) -> dict[str, Any]:
    """Two workers, the first with ``first_faults``, the second receiving its 9th weights
    damaged; checks the ledger, the pool and the logs once trained, and returns the
    server's status."""
    environment = dict(cluster.env)
    cluster.env = {**environment, "SNET_WORKER_FAULTS": first_faults}
    first = cluster.worker(server, "w1")
    cluster.env = {**environment, "SNET_WORKER_FAULTS": "corrupt:weights:9"}
    second = cluster.worker(server, "w2")
    cluster.env = environment
    wait_until(lambda: server.status()["state"] == "trained", 120, "training to finish")
    status = server.status()
    assert len(status["epochs"]) == 2
    for epoch in status["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"], epoch
        assert ledger["used_more"] == 0 and ledger["unused"] == 0, epoch
    queues = status["queues"]
    assert queues["free"] == queues["pool_size"]  # every pooled element came back, once
    assert first.wait(30) == 0 and second.wait(30) == 0
    assert "fault switch: drop:send:update:5" in cluster.log("w1")
    assert "fault switch: corrupt:receive:weights:9" in cluster.log("w2")
    server_log = server.log.read_text()
    assert "malformed_frame" in server_log  # worker 2 told the server why it closed
    for name in ("w1", "w2"):
        assert "Traceback" not in cluster.log(name)
    assert "Traceback" not in server_log
    return status
