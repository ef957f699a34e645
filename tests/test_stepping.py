"""Fused steps change nothing (through a real server); which queued updates make a step is
tested on the policies alone in test_policies.py."""

from __future__ import annotations

import numpy as np

from snet.protocol.framing import encode_bytes
from snet.protocol.messages import Lease, Update, Weights, Welcome
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.update_rule import UpdateRule

from helpers import SMALL_JOB, Cluster, RawClient, wait_until

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
UPDATES = 40


def test_backlogged_async_steps_give_the_one_by_one_weights(cluster: Cluster) -> None:
    """A burst of updates sent back to back: whether the server applies them one by one or
    fuses the steps queued behind a running one, every update gets its own version and
    the final weights are bit for bit those of applying the updates in order."""
    server = cluster.server(
        "--mode", "async", "--updates-per-step", "1", "--epochs", "1", *SMALL_JOB
    )  # fmt: skip
    client = RawClient(server.port, "burst")
    welcome: Welcome = client.handshake()
    start: Weights = client.receive(Weights)
    lease: Lease = client.receive(Lease)
    assert len(lease.indices) >= UPDATES
    rng = np.random.default_rng(5)
    gradients = [rng.standard_normal(LAYOUT.size).astype(np.float32) for _ in range(UPDATES)]
    frames = b"".join(
        encode_bytes(Update(0, lease.lease_id, offset, 1, 0.5, 0, 0.001, gradient))
        for offset, gradient in enumerate(gradients)
    )
    client.send_bytes(frames)  # all at once: steps queue up behind the first
    wait_until(lambda: server.status()["updates_applied"] == UPDATES, 30, "every update")

    status = server.status()
    assert status["steps"] == UPDATES and status["weight_version"] == UPDATES
    assert status["staleness_max"] <= UPDATES - 1
    final = start
    while final.version < UPDATES:
        final = client.receive(Weights)
    reference = UpdateRule(start.element, welcome.job["momentum"])
    for gradient in gradients:
        reference.step([gradient], 1, final.learning_rate)
    np.testing.assert_array_equal(final.element, reference.weights)
    client.close()
