"""Which queued updates make a step, and that fused steps change nothing (through a real
server, in process)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest
from async_raw import AsyncRawClient
from inprocess import Lab, wait_until

from snet.protocol.framing import encode_bytes
from snet.protocol.job import JobSpec
from snet.protocol.messages import Lease, Update, Weights, Welcome
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.stepping import MAX_FUSED_STEPS, PendingUpdate, Stepping
from snet.server.update_rule import UpdateRule

from helpers import SMALL_JOB

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
UPDATES = 40


async def test_backlogged_async_steps_give_the_one_by_one_weights(lab: Lab) -> None:
    """A burst of updates sent back to back: whether the server applies them one by one or
    fuses the steps queued behind a running one, every update gets its own version and
    the final weights are bit for bit those of applying the updates in order."""
    server = await lab.server(
        "--mode", "async", "--updates-per-step", "1", "--epochs", "1", *SMALL_JOB
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


# ---------------------------------------------------------------- grouping, in process


@dataclass
class _Session:
    worker_id: int


@dataclass
class _Book:
    remaining: dict[int, int]  # frames each worker holds without an update for them yet

    def remaining_frames(self, worker_id: int) -> int:
        return self.remaining.get(worker_id, 0)


@dataclass
class _Queue(Stepping):
    """Only the state ``_take_groups`` reads: the job, the workers and the queue."""

    job: JobSpec
    sessions: dict[int, Any]
    book: Any
    _received: deque[PendingUpdate] = field(default_factory=deque)


def _queue(mode: str, per_step: int, workers: int, still_computing: int) -> _Queue:
    sessions = {i: _Session(i) for i in range(workers)}
    book = _Book({i: 100 for i in range(still_computing)})
    return _Queue(JobSpec(mode=mode, updates_per_step=per_step), sessions, book)


def _push(queue: _Queue, *workers: int) -> None:
    for worker in workers:
        pending = PendingUpdate(cast(Any, _Session(worker)), cast(Any, None), np.zeros(0), None)
        queue._received.append(pending)


def _shape(groups: list[list[PendingUpdate]]) -> list[list[int]]:
    return [[p.session.worker_id for p in group] for group in groups]


def test_a_backlog_is_taken_as_consecutive_steps_up_to_the_limit() -> None:
    queue = _queue("async", 1, workers=1, still_computing=1)
    _push(queue, *[0] * (MAX_FUSED_STEPS + 5))
    assert _shape(queue._take_groups()) == [[0]] * MAX_FUSED_STEPS
    assert len(queue._received) == 5  # the rest waits for the next pass
    assert _shape(queue._take_groups()) == [[0]] * 5
    assert queue._take_groups() == [] and not queue._received


def test_async_groups_keep_updates_per_step_and_wait_for_computing_workers() -> None:
    queue = _queue("async", 0, workers=3, still_computing=3)  # one step per 3 updates
    _push(queue, 0, 1, 2, 0, 1)
    assert _shape(queue._take_groups()) == [[0, 1, 2]]
    assert [p.session.worker_id for p in queue._received] == [0, 1]
    assert queue._take_groups() == []  # worker 2 is still computing: wait for it
    queue.book.remaining[2] = 0  # ...until it has nothing left to send
    assert _shape(queue._take_groups()) == [[0, 1]]


@pytest.mark.parametrize("computing", [0, 1])
def test_sync_takes_the_whole_round_once_nobody_is_expected(computing: int) -> None:
    queue = _queue("sync", 0, workers=3, still_computing=3)
    queue.book.remaining = {2: computing}
    _push(queue, 0, 1)
    groups = queue._take_groups()
    assert _shape(groups) == ([] if computing else [[0, 1]])
    assert len(queue._received) == (2 if computing else 0)
