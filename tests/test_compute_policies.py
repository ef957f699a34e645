"""Each data-parallel mode's worker side (client/policies.py): when a worker may compute
its next update, and when it may send one it holds back (bmuf with overlap). The server
side of each mode is tests/test_policies.py's."""

from __future__ import annotations

import pytest

from snet.client.policies import (
    AsyncCompute,
    BlockCompute,
    ComputeState,
    SyncCompute,
    make_compute_policy,
)
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec


def test_sync_worker_waits_for_the_step_of_its_update_unless_refused() -> None:
    policy = make_compute_policy(JobSpec(mode="sync", max_in_flight=2))
    assert isinstance(policy, SyncCompute)
    assert policy.may_compute(ComputeState(version=0, last_base=-1, in_flight=0))  # first
    assert not policy.may_compute(ComputeState(version=3, last_base=3, in_flight=1))
    assert policy.may_compute(ComputeState(version=4, last_base=3, in_flight=0))  # stepped
    assert policy.may_compute(ComputeState(version=3, last_base=3, in_flight=0))  # refused


def test_async_block_starts_on_the_weights_that_hold_the_workers_last_delta() -> None:
    """bmuf with async blocks: a block is sent as the difference from the weights it began
    on, so the next begins only once its own last delta is settled, whatever the job's
    in-flight bound (which a bmuf job therefore refuses: protocol/modes.py); it never
    waits for the other workers' blocks."""
    assert isinstance(make_compute_policy(JobSpec(mode="bmuf", block_sync=False)), BlockCompute)
    only_async = r"^max_in_flight 4 applies to async mode only, and this job is in bmuf mode,"
    with pytest.raises(ConfigError, match=only_async):
        JobSpec(mode="bmuf", block_sync=False, max_in_flight=4)
    policy = BlockCompute(4, sync=False)  # what make_compute_policy made of that bound
    assert not policy.may_compute(ComputeState(version=9, last_base=3, in_flight=1))
    assert policy.may_compute(ComputeState(version=9, last_base=3, in_flight=0))
    assert policy.may_compute(ComputeState(version=0, last_base=-1, in_flight=0))  # first
    rounds = BlockCompute(4, sync=True)
    assert not rounds.may_compute(ComputeState(version=3, last_base=3, in_flight=1))
    assert rounds.may_compute(ComputeState(version=4, last_base=3, in_flight=0))
    assert rounds.may_send(ComputeState(version=3, last_base=3, in_flight=1))  # never held


@pytest.mark.parametrize("sync", [True, False])
def test_overlapping_blocks_compute_while_a_delta_is_out_and_send_once_it_is_in(
    sync: bool,
) -> None:
    """With overlap the wait moves from a block's start to its delta's sending: the next
    block is computed while one delta is unsettled, and held until the weights hold it."""
    policy = make_compute_policy(JobSpec(mode="bmuf", block_sync=sync, block_overlap=True))
    assert isinstance(policy, BlockCompute)
    assert policy.local_copies == 5 and policy.send_buffers == 3
    sent_one = ComputeState(version=3, last_base=3, in_flight=1)
    assert policy.may_compute(sent_one) and not policy.may_send(sent_one)
    assert not policy.may_compute(ComputeState(version=3, last_base=3, in_flight=2))
    # the step that applied it came (sync blocks: a newer version; async: it is settled)
    assert policy.may_send(ComputeState(version=4, last_base=3, in_flight=0))
    assert policy.may_send(ComputeState(version=0, last_base=-1, in_flight=0))  # the first
    assert BlockCompute(1, sync).local_copies == 3


def test_async_worker_never_waits_for_weights_only_for_its_in_flight_bound() -> None:
    policy = make_compute_policy(JobSpec(mode="async", max_in_flight=2))
    assert isinstance(policy, AsyncCompute)
    assert policy.may_compute(ComputeState(version=3, last_base=3, in_flight=1))
    assert not policy.may_compute(ComputeState(version=9, last_base=3, in_flight=2))
