"""What a sloppy or hostile third-party worker gets from the server (protocol/README.md).

Found by writing a worker from the specification alone and then sending what such a
worker might: each test is one message the server answered other than the specification
says, and checks the answer the specification promises.
"""

from __future__ import annotations

import numpy as np

from snet.protocol.job import NetworkSpec
from snet.protocol.messages import (
    ErrorMessage,
    Frames,
    FramesWanted,
    Lease,
    Resync,
    Update,
    Weights,
)
from snet.protocol.network import ElementLayout

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, wait_until

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))  # SMALL_JOB's network


async def test_an_update_at_a_negative_offset_is_refused_and_settled(lab: Lab) -> None:
    """An offset before the lease's start covers no frames: the update is refused (and so
    settled), not taken for a second delivery and ignored, which left it unsettled and a
    worker waiting on its flow control for ever."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, "negative")
    await client.handshake()
    start: Weights = await client.receive(Weights)
    lease: Lease = await client.receive(Lease)
    gradient = np.full(LAYOUT.size, 0.01, np.float32)
    await client.send(Update(start.version, lease.lease_id, -1, 1, 0.5, 0, 0.001, gradient))
    error: ErrorMessage = await client.receive(ErrorMessage, timeout=5)
    assert error.code == "update_rejected" and not error.fatal, error
    assert (error.lease_id, error.offset) == (lease.lease_id, -1)
    settled: Weights = await client.receive(Weights)
    assert settled.settled == 1
    status = await server.status()
    assert status["updates_rejected"] == 1 and status["updates_applied"] == 0
    await client.close()


async def test_a_fatal_error_from_a_worker_ends_its_connection(lab: Lab) -> None:
    """``fatal = true`` means the sender is done; the server ends the worker's session at
    once (its frames back in the queue) rather than holding its leases until it times
    out, even when the worker does not close its end."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, "fatal")
    await client.handshake()
    await client.receive(Lease)
    await client.send(ErrorMessage("out_of_memory", "the worker cannot go on", True))
    assert await client.closed_by_peer(timeout=5), "the server kept the connection open"

    async def gone() -> dict[str, object] | None:
        status = await server.status()
        rows = [w for w in status["workers"] if w["name"] == "fatal"]
        return rows[0] if status["connections_open"] == 0 and rows[0]["left_reason"] else None

    row = await wait_until(gone, 5, "the worker to be gone from /status")
    assert "fatal error from the worker: out_of_memory" in str(row["left_reason"])
    assert "4096 frames back in the queue" in lab.log("server")


async def test_frames_wanted_again_sends_nothing_more(lab: Lab) -> None:
    """A second ``frames_wanted`` on a connection is ignored. It used to start the
    connection's inline record afresh and send every held lease's frames again: a few
    dozen bytes in, hundreds of kilobytes queued out, without bound for a peer that sent
    it in a loop and read nothing (3,000 of them took the server from 70 to 770 MB)."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, "inline")
    await client.handshake()
    await client.receive(Weights)
    await client.receive(Lease)
    await client.send(FramesWanted("reads no data"))
    await client.send(Resync("marker"))  # answered with weights after what came before it
    await client.receive(Weights)
    assert any(isinstance(m, Frames) for m in client.inbox)
    sent = (await server.status())["inline_frames"]["frames_sent"]
    assert sent > 0
    client.inbox.clear()
    for _ in range(20):
        await client.send(FramesWanted("again"))
    await client.send(Resync("marker"))
    await client.receive(Weights)
    assert not any(isinstance(m, Frames) for m in client.inbox)
    assert (await server.status())["inline_frames"]["frames_sent"] == sent
    await client.close()
