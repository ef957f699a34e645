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
    Lease,
    Update,
    Weights,
)
from snet.protocol.network import ElementLayout

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab

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
