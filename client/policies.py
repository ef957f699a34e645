"""Modes as policies, the worker's side: whether it may compute the next bunch now.

The compute loop (client/worker.py) asks its policy at every bunch boundary, with what it
knows then (``ComputeState``); it does not know which mode runs. The server's side of each
mode is server/policies.py.

- ``SyncCompute``: after sending an update the worker waits for the weights of the step
  that update is part of (a newer version than the one it computed on), unless the server
  refused the update (settled it without a step): then the round still waits for this
  worker, on the same version.
- ``AsyncCompute`` (SNet v2): it never waits for weights; it keeps at most
  ``max_in_flight`` updates unsettled, since without that bound a fast worker filled the
  socket buffers and the server's queue with ever staler updates and training collapsed.

- ``BoundedCompute`` (async with bounded staleness ``S``, protocol/staleness.py): as
  async, but with at most ``max(S, 1)`` updates unsettled, so an update is rarely
  computed on weights the server will find more than ``S`` versions old (the server
  refuses those: with ``S + 1`` in flight a fifth of them were, at 4 workers).

Further modes fit here too: block-wise model-update filtering computes a block of bunches
locally and sends the model delta at the block's end.
"""

from __future__ import annotations

from dataclasses import dataclass

from snet.protocol.staleness import StalenessSetting


@dataclass(frozen=True)
class ComputeState:
    """What the compute loop knows at a bunch boundary."""

    version: int  # of the newest weights it holds
    last_base: int  # the version its last update was computed on (-1: none yet)
    in_flight: int  # updates sent and not yet settled (applied or refused)


class ComputePolicy:
    """The worker side of a mode."""

    name = ""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight

    def may_compute(self, state: ComputeState) -> bool:
        raise NotImplementedError


class SyncCompute(ComputePolicy):
    name = "sync"

    def may_compute(self, state: ComputeState) -> bool:
        return state.version > state.last_base or state.in_flight == 0


class AsyncCompute(ComputePolicy):
    name = "async"

    def may_compute(self, state: ComputeState) -> bool:
        return state.in_flight < self.max_in_flight


class BoundedCompute(AsyncCompute):
    name = "bounded"

    def __init__(self, max_in_flight: int, bound: int) -> None:
        super().__init__(min(max_in_flight, max(bound, 1)))
        self.bound = bound


def make_compute_policy(mode: str, max_in_flight: int, staleness: str = "none") -> ComputePolicy:
    """The policy of a job's ``mode`` (and, in async mode, its staleness policy)."""
    setting = StalenessSetting.parse(staleness)
    if mode == "async" and setting.policy == "bounded":
        return BoundedCompute(max_in_flight, setting.bound)
    policies: dict[str, type[ComputePolicy]] = {"sync": SyncCompute, "async": AsyncCompute}
    return policies[mode](max_in_flight)
