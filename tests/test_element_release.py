"""Every pooled element comes back, at its owner's one release point (server/pool.py): the
connection gives back each update the coordinator did not queue (refused at intake, on
an unknown lease, repeated, or np's, which takes none), the step queue each queued one
after its step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from snet.protocol.messages import ErrorMessage, Lease, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, wait_until
from short_data import short_data

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
JOB = [*SMALL_JOB, "--data", short_data(), "--epochs", "1", "--linger-seconds", "30"]


def _update(lease_id: int, offset: int, element: np.ndarray) -> Update:
    return Update(0, lease_id, offset, 128, 1.0, 0, 0.01, element)


async def _all_free(server: LabServer) -> dict[str, Any]:
    queues: dict[str, Any] = (await server.status())["queues"]
    assert queues["free"] == queues["pool_size"], queues
    return queues


async def _settled(server: LabServer, updates: int) -> bool:
    status = await server.status()
    return bool(status["updates_applied"] + status["updates_rejected"] >= updates)


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the pool's rule, not the loop's
async def test_each_update_not_queued_gives_its_element_back(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--pool-size", "4", *JOB)
    peer = await AsyncRawClient.connect(server.port, "peer")
    await peer.handshake()
    await peer.receive(Weights)
    lease = await peer.receive(Lease)
    poisoned = np.zeros(LAYOUT.size, dtype=np.float32)
    poisoned[7] = np.nan
    for update in (_update(lease.lease_id, 0, poisoned), _update(999, 0, poisoned * 0)):
        await peer.send(update)  # refused: not finite (at its step), an unknown lease
        assert (await peer.receive(ErrorMessage)).code == "update_rejected"
        await _all_free(server)
    good = _update(lease.lease_id, 128, np.full(LAYOUT.size, 1e-4, np.float32))
    await peer.send(good)  # queued, stepped, given back by the step queue
    await wait_until(lambda: _settled(server, 3), 10, "the good update's step")
    await peer.send(good)  # the same delivery again: ignored, nothing kept
    await peer.send(_update(lease.lease_id, 256, poisoned))  # behind it, to know it was read
    assert (await peer.receive(ErrorMessage)).code == "update_rejected"
    status = await server.status()
    assert (status["updates_applied"], status["updates_rejected"]) == (1, 3)
    await _all_free(server)
    await peer.close()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_np_mode_refuses_an_update_and_gives_its_element_back(lab: Lab) -> None:
    server = await lab.server("--mode", "np", "--pool-size", "4", *JOB)
    peer = await AsyncRawClient.connect(server.port, "peer")
    await peer.handshake()
    await peer.send(_update(1, 0, np.zeros(LAYOUT.size, np.float32)))
    refusal = await peer.receive(ErrorMessage)
    assert "np mode: workers send partial outputs, not updates" in refusal.text
    await _all_free(server)
    await peer.close()
