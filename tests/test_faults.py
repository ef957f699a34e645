"""Bad input never corrupts training: bad frames, wrong shapes, NaN, wrong tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

from snet.protocol.framing import MAGIC, PREFIX
from snet.protocol.messages import (
    ErrorMessage,
    Heartbeat,
    Lease,
    ServerHello,
    Update,
    Weights,
    WorkerReport,
)
from snet.protocol.network import ElementLayout, NetworkSpec

from helpers import SMALL_JOB, Cluster, RawClient, ServerProcess, wait_until

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


def _update(lease: Lease, offset: int, element: np.ndarray) -> Update:
    return Update(0, lease.lease_id, offset, 128, 1.0, 0, 0.01, element)


def test_bad_clients_are_refused_and_training_state_is_untouched(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *SMALL_JOB
    )
    weights_before = server.get("/weights")

    garbage = RawClient(server.port, "garbage")
    garbage.receive(ServerHello)
    garbage.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
    refusal = garbage.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "malformed_frame" and "magic" in refusal.text
    assert garbage.closed_by_peer()

    oversized = RawClient(server.port, "oversized")
    oversized.receive(ServerHello)
    oversized.send_bytes(PREFIX.pack(MAGIC, 1, 0, 10, 2**40))
    refusal = oversized.receive(ErrorMessage)
    assert refusal.code == "frame_too_large" and oversized.closed_by_peer()

    bad = RawClient(server.port, "bad-updates")
    bad.handshake()
    bad.receive(Weights)
    lease = bad.receive(Lease)
    wrong_shape = np.ones(LAYOUT.size - 1, dtype=np.float32)
    bad.send(_update(lease, 0, wrong_shape))
    refusal = bad.receive(ErrorMessage)
    assert not refusal.fatal and refusal.code == "update_rejected" and "shape" in refusal.text
    poisoned = np.zeros(LAYOUT.size, dtype=np.float32)
    poisoned[123] = np.nan
    bad.send(_update(lease, 128, poisoned))
    refusal = bad.receive(ErrorMessage)
    assert not refusal.fatal and "NaN" in refusal.text
    bad.send(Heartbeat(0.0))  # the connection survived both refusals
    bad.send(WorkerReport(0.0, {"board": {"modelled_busy_seconds": 1.5}}))
    wait_until(
        lambda: (
            [r["report"] for r in server.status()["workers"] if r["name"] == "bad-updates"]
            == [{"board": {"modelled_busy_seconds": 1.5}}]
        ),
        10,
        "the worker report",
    )
    assert server.status()["updates_rejected"] == 2

    status = server.status()
    assert status["weight_version"] == 0 and status["updates_applied"] == 0
    assert status["frames_refused"] == 2
    assert server.get("/weights") == weights_before  # bit for bit
    rows = {row["name"]: row for row in status["workers"]}
    assert rows["bad-updates"]["updates_rejected"] == 2 and rows["bad-updates"]["state"] != "gone"
    assert rows["bad-updates"]["report"] == {"board": {"modelled_busy_seconds": 1.5}}
    bad.close()  # its leases (and the refused frames) go back to the queue

    worker = cluster.worker(server, "good")
    wait_until(lambda: server.status()["state"] == "trained", 90, "training to finish")
    status = server.status()
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0
    assert ledger["requeued_frames"] >= 256
    assert status["cv_accuracy"] > 0.5
    assert server.get("/weights") != weights_before
    worker.kill()


def test_truncated_frame_then_disconnect_loses_nothing(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *SMALL_JOB
    )
    client = RawClient(server.port, "truncated")
    client.handshake()
    lease = client.receive(Lease)
    frame = b"".join(
        bytes(p) for p in _update_pieces(lease, np.zeros(LAYOUT.size, dtype=np.float32))
    )
    client.send_bytes(frame[: len(frame) // 2])  # half an update, straight into a pooled element
    wait_until(
        lambda: server.status()["queues"]["free"] < server.status()["queues"]["pool_size"],
        10,
        "the payload to be received into a pooled element",
    )
    client.close()
    wait_until(lambda: server.status()["workers_live"] == 0, 10, "the client to be dropped")
    status = server.status()
    assert status["queues"]["free"] == status["queues"]["pool_size"]  # element returned
    assert status["updates_applied"] == 0
    worker = cluster.worker(server, "good")
    wait_until(lambda: server.status()["state"] == "trained", 90, "training to finish")
    ledger = server.status()["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]
    worker.kill()


def _update_pieces(lease: Lease, element: np.ndarray) -> list[bytes | memoryview]:
    from snet.protocol.framing import encode

    return encode(_update(lease, 0, element))


def test_token_is_required_and_never_sent(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "1", "--token", "s3cret-token", *SMALL_JOB
    )
    intruder = cluster.worker(server, "intruder", "--token", "wrong")
    assert intruder.wait(30) == 1
    assert "auth_failed" in cluster.log("intruder")
    anonymous = cluster.worker(server, "anonymous")
    assert anonymous.wait(30) == 1
    honest = cluster.worker(server, "honest", "--token", "s3cret-token")
    assert server.wait(90) == 0 and honest.wait(30) == 0
    assert server.final_status()["handshakes_refused"] >= 1
    assert "s3cret-token" not in server.log.read_text()


def test_a_lost_update_and_damaged_weights_cost_no_frame(cluster: Cluster) -> None:
    """The fault switch: worker 1 loses its 5th update on the way, worker 2 receives its
    9th weights damaged. The server finds the gap the lost update left and queues its
    frames again; worker 2 refuses the damaged frame, closes and joins again. Training
    completes and every training frame of every epoch is applied exactly once."""
    server = cluster.server(
        "--mode", "async", "--epochs", "2", "--linger-seconds", "30", *SMALL_JOB
    )
    status = _train_with_faults(cluster, server, "drop:update:5;duplicate:update:9")
    server_log = server.log.read_text()
    assert "updates of w1 were lost: 128 frames back in the queue" in server_log
    assert server_log.count("came again; ignored") == 1  # the 9th, delivered twice
    rows = [row for row in status["workers"] if row["name"] == "w2"]
    assert len(rows) == 2 and rows[0]["state"] == "gone"  # it joined again


def test_a_lost_update_in_sync_mode_costs_no_frame(cluster: Cluster) -> None:
    """The same faults in sync mode: after losing its update worker 1 waits for the round
    and the round for it, so no later update shows the gap; the round deadline drops it
    (``round_deadline``), it joins again, and its undelivered frames go back."""
    server = cluster.server("--mode", "sync", "--epochs", "2", "--linger-seconds", "30", *SMALL_JOB)
    _train_with_faults(cluster, server)
    assert "dropped from the sync rounds: missed the round deadline" in cluster.log("w1")
    assert server.log.read_text().count("worker w1 (numpy") == 2  # it joined again


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


def test_messages_out_of_turn_close_that_connection_only(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *SMALL_JOB
    )
    early = RawClient(server.port, "early")
    early.receive(ServerHello)
    early.send(Update(0, 1, 0, 128, 1.0, 0, 0.01, np.zeros(LAYOUT.size, np.float32)))
    refusal = early.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "protocol" and "update" in refusal.text
    assert early.closed_by_peer()

    bold = RawClient(server.port, "bold")
    bold.handshake()
    bold.receive(Lease)
    bold.send(Lease(1, 0, np.arange(4, dtype="<i8")))  # a server's message
    refusal = bold.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "protocol" and "lease" in refusal.text
    assert bold.closed_by_peer()

    status = server.status()
    assert status["frames_refused"] == 2
    assert status["queues"]["free"] == status["queues"]["pool_size"]  # the early update's
    assert [row["state"] for row in status["workers"] if row["name"] == "bold"] == ["gone"]
    worker = cluster.worker(server, "good")
    wait_until(lambda: server.status()["state"] == "trained", 90, "training to finish")
    ledger = server.status()["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]
    worker.kill()
