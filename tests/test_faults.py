"""Bad input never corrupts training: bad frames, wrong shapes, NaN, wrong tokens (with
an in-process server and workers: the fast ring)."""

from __future__ import annotations

import numpy as np
import pytest

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

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, wait_until
from short_data import short_data, short_job

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


def _update(lease: Lease, offset: int, element: np.ndarray) -> Update:
    return Update(0, lease.lease_id, offset, 128, 1.0, 0, 0.01, element)


async def test_bad_clients_are_refused_and_training_state_is_untouched(lab: Lab) -> None:
    # bunches of 128, as the hand-driven client sends, on a third of the data: the good
    # worker's epoch shows that training goes on and loses nothing (it scores 60-66%)
    job = [*SMALL_JOB, "--data", short_data()]
    server = await lab.server("--mode", "async", "--epochs", "1", "--linger-seconds", "30", *job)
    weights_before = await server.get("/weights")

    garbage = await AsyncRawClient.connect(server.port, "garbage")
    await garbage.receive(ServerHello)
    await garbage.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
    refusal = await garbage.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "malformed_frame" and "magic" in refusal.text
    assert await garbage.closed_by_peer()

    oversized = await AsyncRawClient.connect(server.port, "oversized")
    await oversized.receive(ServerHello)
    await oversized.send_bytes(PREFIX.pack(MAGIC, 1, 0, 10, 2**40))
    refusal = await oversized.receive(ErrorMessage)
    assert refusal.code == "frame_too_large" and await oversized.closed_by_peer()

    bad = await AsyncRawClient.connect(server.port, "bad-updates")
    await bad.handshake()
    await bad.receive(Weights)
    lease = await bad.receive(Lease)
    wrong_shape = np.ones(LAYOUT.size - 1, dtype=np.float32)
    await bad.send(_update(lease, 0, wrong_shape))
    refusal = await bad.receive(ErrorMessage)
    assert not refusal.fatal and refusal.code == "update_rejected" and "shape" in refusal.text
    poisoned = np.zeros(LAYOUT.size, dtype=np.float32)
    poisoned[123] = np.nan
    await bad.send(_update(lease, 128, poisoned))
    refusal = await bad.receive(ErrorMessage)
    assert not refusal.fatal and "NaN" in refusal.text
    await bad.send(Heartbeat(0.0))  # the connection survived both refusals
    await bad.send(WorkerReport(0.0, {"board": {"modelled_busy_seconds": 1.5}}))

    async def reported() -> bool:
        rows = (await server.status())["workers"]
        reports = [r["report"] for r in rows if r["name"] == "bad-updates"]
        return reports == [{"board": {"modelled_busy_seconds": 1.5}}]

    await wait_until(reported, 10, "the worker report")
    assert (await server.status())["updates_rejected"] == 2

    status = await server.status()
    assert status["weight_version"] == 0 and status["updates_applied"] == 0
    assert status["frames_refused"] == 2
    assert await server.get("/weights") == weights_before  # bit for bit
    rows = {row["name"]: row for row in status["workers"]}
    assert rows["bad-updates"]["updates_rejected"] == 2 and rows["bad-updates"]["state"] != "gone"
    assert rows["bad-updates"]["report"] == {"board": {"modelled_busy_seconds": 1.5}}
    await bad.close()  # its leases (and the refused frames) go back to the queue

    lab.worker(server, "good")
    await wait_until(lambda: _state_is(server, "trained"), 90, "training to finish")
    status = await server.status()
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0
    assert ledger["requeued_frames"] >= 256
    assert status["cv_accuracy"] > 0.5
    assert await server.get("/weights") != weights_before


async def test_truncated_frame_then_disconnect_loses_nothing(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *short_job()
    )
    client = await AsyncRawClient.connect(server.port, "truncated")
    await client.handshake()
    lease = await client.receive(Lease)
    frame = b"".join(
        bytes(p) for p in _update_pieces(lease, np.zeros(LAYOUT.size, dtype=np.float32))
    )
    # half an update, straight into a pooled element
    await client.send_bytes(frame[: len(frame) // 2])
    await wait_until(
        lambda: _pool_in_use(server),
        10,
        "the payload to be received into a pooled element",
    )
    await client.close()
    await wait_until(lambda: _live_is(server, 0), 10, "the client to be dropped")
    status = await server.status()
    assert status["queues"]["free"] == status["queues"]["pool_size"]  # element returned
    assert status["updates_applied"] == 0
    lab.worker(server, "good")
    await wait_until(lambda: _state_is(server, "trained"), 90, "training to finish")
    ledger = (await server.status())["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]


def _update_pieces(lease: Lease, element: np.ndarray) -> list[bytes | memoryview]:
    from snet.protocol.framing import encode

    return encode(_update(lease, 0, element))


async def test_token_is_required_and_never_sent(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--token", "s3cret-token", *short_job()
    )
    intruder = lab.worker(server, "intruder", "--token", "wrong")
    assert await intruder.wait(30) == 4  # refused: EXIT_REFUSED
    assert "auth_failed" in lab.log("intruder")
    assert "HTTP on 127.0.0.1:" in lab.log("server") and "(no TLS, token required)" in lab.log(
        "server"
    )  # the start line says how the ports are guarded
    refusals = lab.log("server").count("auth_failed: wrong or missing token proof")
    anonymous = lab.worker(server, "anonymous")
    assert await anonymous.wait(30) == 4
    told = "the server requires a token (--token, --token-file or SNET_TOKEN)"
    assert told in lab.log("anonymous")
    # the server says so too (it said nothing for a worker without a token)
    await wait_until(lambda: lab.log("server").count("wrong or missing token") > refusals,
                     10, "the server to log the refusal")  # fmt: skip
    honest = lab.worker(server, "honest", "--token", "s3cret-token")
    assert await server.wait(90) == "trained" and await honest.wait(30) == 0
    assert server.final_status()["handshakes_refused"] >= 1
    assert "s3cret-token" not in lab.log("server")
    assert "s3cret-token" not in lab.capture.text()  # nor in what its threads logged


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the transport tests run both
async def test_messages_out_of_turn_close_that_connection_only(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *SMALL_JOB
    )
    early = await AsyncRawClient.connect(server.port, "early")
    await early.receive(ServerHello)
    await early.send(Update(0, 1, 0, 128, 1.0, 0, 0.01, np.zeros(4, np.float32)))
    refusal = await early.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "protocol" and "update" in refusal.text
    assert await early.closed_by_peer()
    # a whole element before the handshake is refused on its size, before anything is
    # allocated for it (bounded before trust)
    greedy = await AsyncRawClient.connect(server.port, "greedy")
    await greedy.receive(ServerHello)
    await greedy.send(Update(0, 1, 0, 128, 1.0, 0, 0.01, np.zeros(LAYOUT.size, np.float32)))
    refusal = await greedy.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "frame_too_large" and "limit 4096" in refusal.text
    assert await greedy.closed_by_peer()

    bold = await AsyncRawClient.connect(server.port, "bold")
    await bold.handshake()
    await bold.receive(Lease)
    await bold.send(Lease(1, 0, np.arange(4, dtype="<i8")))  # a server's message
    refusal = await bold.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "protocol" and "lease" in refusal.text
    assert await bold.closed_by_peer()

    status = await server.status()
    assert status["frames_refused"] == 3
    assert status["queues"]["free"] == status["queues"]["pool_size"]  # nothing was lent
    assert [row["state"] for row in status["workers"] if row["name"] == "bold"] == ["gone"]
    assert status["queues"]["leases_out"] == 0  # its leases are back in the queue


async def _state_is(server: LabServer, state: str) -> bool:
    return bool((await server.status())["state"] == state)


async def _live_is(server: LabServer, workers: int) -> bool:
    return bool((await server.status())["workers_live"] == workers)


async def _pool_in_use(server: LabServer) -> bool:
    queues = (await server.status())["queues"]
    return bool(queues["free"] < queues["pool_size"])
