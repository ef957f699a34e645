"""Bad input never corrupts training: bad frames, wrong shapes, NaN, wrong tokens."""

from __future__ import annotations

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

from helpers import SMALL_JOB, Cluster, RawClient, wait_until

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
    assert intruder.wait(30) == 4  # refused: EXIT_REFUSED
    assert "auth_failed" in cluster.log("intruder")
    anonymous = cluster.worker(server, "anonymous")
    assert anonymous.wait(30) == 4
    honest = cluster.worker(server, "honest", "--token", "s3cret-token")
    assert server.wait(90) == 0 and honest.wait(30) == 0
    assert server.final_status()["handshakes_refused"] >= 1
    assert "s3cret-token" not in server.log.read_text()
