"""Fused steps change nothing (through a real server, in process); which queued updates
make a step is tested on the policies alone in test_policies.py."""

from __future__ import annotations

import numpy as np
import pytest

from snet.protocol.framing import encode_bytes
from snet.protocol.messages import Lease, Update, Weights, Welcome
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.update_rule import UpdateRule

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, wait_until

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
UPDATES = 40


# 0: every pass in the step thread; 60: every pass after the first on the event loop's
# thread (transport/inline.py); the default chooses by each pass's CPU time.
@pytest.mark.parametrize("inline_step", ["0", "60"])
async def test_backlogged_async_steps_give_the_one_by_one_weights(
    lab: Lab, inline_step: str
) -> None:
    """A burst of updates sent back to back: whether the server applies them one by one or
    fuses the steps queued behind a running one, in the step thread or on the loop, every
    update gets its own version and the final weights are bit for bit those of applying
    the updates in order."""
    server = await lab.server(
        "--mode", "async", "--updates-per-step", "1", "--epochs", "1",
        "--inline-step-seconds", inline_step, *SMALL_JOB,
    )  # fmt: skip
    client = await AsyncRawClient.connect(server.port, "burst")
    welcome: Welcome = await client.handshake()
    start: Weights = await client.receive(Weights)
    lease: Lease = await client.receive(Lease)
    assert len(lease.indices) >= UPDATES
    rng = np.random.default_rng(5)
    gradients = [rng.standard_normal(LAYOUT.size).astype(np.float32) for _ in range(UPDATES)]
    frames = b"".join(
        encode_bytes(Update(0, lease.lease_id, offset, 1, 0.5, 0, 0.001, gradient))
        for offset, gradient in enumerate(gradients)
    )
    await client.send_bytes(frames)  # all at once: steps queue up behind the first

    async def all_applied() -> bool:
        return bool((await server.status())["updates_applied"] == UPDATES)

    await wait_until(all_applied, 30, "every update")

    status = await server.status()
    assert status["steps"] == UPDATES and status["weight_version"] == UPDATES
    assert status["staleness_max"] <= UPDATES - 1
    final = start
    while final.version < UPDATES:
        final = await client.receive(Weights)
    reference = UpdateRule(start.element, welcome.job["momentum"])
    for gradient in gradients:
        reference.step([gradient], 1, final.learning_rate)
    np.testing.assert_array_equal(final.element, reference.weights)
    await client.close()
