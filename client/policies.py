"""Modes as policies, the worker's side: whether it may compute the next bunch now.

The compute loop (client/worker.py, a turn at a time: client/update_steps.py) asks its
policy at every bunch boundary, with what it knows then (``ComputeState``); it does not
know which mode runs. The server's side of each mode is server/policies.py.

- ``SyncCompute``: after sending an update the worker waits for the weights of the step
  that update is part of (a newer version than the one it computed on), unless the server
  refused the update (settled it without a step): then the round still waits for this
  worker, on the same version.
- ``AsyncCompute`` (SNet v2): it never waits for weights; it keeps at most
  ``max_in_flight`` updates unsettled, since without that bound a fast worker filled the
  socket buffers and the server's queue with ever staler updates and training collapsed.

  Under bounded staleness ``S`` (protocol/staleness.py) at most ``max(S, 1)``, so an
  update is rarely computed on weights the server will find more than ``S`` versions old
  (the server refuses those: with ``S + 1`` in flight a fifth of them were, at 4 workers).
  The policy comes with the job and may change while training (``follow``: the server's
  ``policy`` message), so the bound is worked out again from the job's at each change.

- ``SliceCompute`` (np, network parallelism): no updates at all; the worker answers the
  server's slices and bunches in order (``slice_work``, client/slice_work.py).

Block-wise model-update filtering (bmuf, ``BlockCompute``) computes a block of bunches
locally and sends the model delta at the block's end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.messages import PolicyChange
from snet.protocol.network import ElementLayout
from snet.protocol.slices import slice_network
from snet.protocol.staleness import StalenessSetting

from .backend import ComputeBackend
from .blocks import LocalTrainer
from .data import Corpus
from .slice_work import SliceWork

T = TypeVar("T")  # what a turn of the compute loop is (client/worker.py)
# (weights, frames, out, rate) -> (loss sum, correct, patterns used); in the compute thread
Compute = Callable[[np.ndarray, np.ndarray, np.ndarray, float], tuple[float, int, int]]


class Overlap(Protocol):
    """How updates computed ahead of the weights they are sent on move onto those weights
    (bmuf with overlap: client/blocks.py LocalTrainer); both called on the event loop."""

    def offer(self, weights: np.ndarray) -> None:
        """Newer weights the update being computed may move onto at its next bunch."""

    def rebase(self, weights: np.ndarray) -> None:
        """Move the computed update onto ``weights`` (the compute thread idle)."""


@dataclass(frozen=True)
class ComputeState:
    """What the compute loop knows at a bunch boundary."""

    version: int  # of the newest weights it holds
    last_base: int  # the version its last update was computed on (-1: none yet)
    in_flight: int  # updates sent and not yet settled (applied or refused)


class ComputePolicy:
    """The worker side of a mode."""

    name = ""
    holds_whole_network = True  # its weights and updates are the whole element's
    local_copies = 0  # whole copies of the element it trains on beside its weights
    # update elements being written or sent (client/buffers.py SendBuffers): one on its way
    # while the next is computed
    send_buffers = 2

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight

    def may_compute(self, state: ComputeState) -> bool:
        raise NotImplementedError

    def may_send(self, state: ComputeState) -> bool:
        """Whether an update computed now may be sent now (bmuf with overlap holds a
        block's delta until the weights hold its previous one); every other mode: yes."""
        return True

    def follow(self, setting: StalenessSetting) -> None:
        """The server put another staleness policy in force; only async acts on one."""

    def frames_per_update(self, job: JobSpec) -> int:
        """How many of a lease's frames one update covers at most: one bunch."""
        return job.bunch_size

    def make_turn(
        self, job: JobSpec, corpus: Corpus, backend: object,
        updates: Callable[[], T], slices: Callable[[SliceWork], T],
    ) -> T:  # fmt: skip
        """What a turn of the compute loop does in this mode: compute and send an update
        (``updates``: client/update_steps.py), or np's next slice or bunch (``slices``,
        given the queue this makes); each made only when chosen."""
        return updates()

    def prepare_backend(self, backend: ComputeBackend, job: JobSpec, corpus: Corpus) -> None:
        """Set the backend up for the job (compute thread), as it computes here."""
        backend.prepare(job, corpus)

    def make_compute(
        self, backend: ComputeBackend, layout: ElementLayout, job: JobSpec
    ) -> tuple[Compute, Overlap | None]:
        """What one update is: the gradient sum of a bunch on the weights given; and how
        updates held for ``may_send`` move onto newer weights (None: they are never held)."""

        def gradient(
            weights: np.ndarray, frames: np.ndarray, out: np.ndarray, rate: float
        ) -> tuple[float, int, int]:
            loss, correct = backend.gradient(weights, frames, out)
            return loss, correct, len(frames)

        return gradient, None


class SyncCompute(ComputePolicy):
    name = "sync"

    def may_compute(self, state: ComputeState) -> bool:
        return state.version > state.last_base or state.in_flight == 0


class AsyncCompute(ComputePolicy):
    name = "async"

    def __init__(self, max_in_flight: int, staleness: StalenessSetting | None = None) -> None:
        super().__init__(max_in_flight)
        self.job_max_in_flight = max_in_flight  # the job's bound, before any staleness bound
        self.follow(staleness or StalenessSetting())

    def follow(self, setting: StalenessSetting) -> None:
        bound = max(setting.bound, 1) if setting.policy == "bounded" else self.job_max_in_flight
        self.max_in_flight = min(self.job_max_in_flight, bound)

    def may_compute(self, state: ComputeState) -> bool:
        return state.in_flight < self.max_in_flight


class BlockCompute(ComputePolicy):
    """bmuf: an update is a block of bunches trained locally (client/blocks.py); with
    synchronous blocks the worker waits for the block's filtered weights; with
    asynchronous ones for the step of its own last delta only, never for the others'.

    A block is trained from the weights it starts on and sent as the difference, so it
    must start on weights that hold this worker's previous delta: begun on older ones
    (as a per-bunch async update may be), it would train its own last block's progress
    again, and the server would apply that twice (one async worker ended its first epoch
    at 35 % CV, where one sync worker, snet train's equal, is at 84 %).

    With ``overlap`` the rule moves from a block's start to its delta's sending: the
    worker trains the next block while its last delta is unsettled (one at most), and
    holds that block's delta until the weights hold the last one; it is then moved onto
    them (``LocalTrainer.rebase``) and sent as computed on them."""

    name = "bmuf"

    def __init__(self, max_in_flight: int, sync: bool, overlap: bool = False) -> None:
        super().__init__(max_in_flight)
        self.sync, self.overlap = sync, overlap
        # the local trainer's weights, velocity and gradient, and with overlap the block's
        # start and the weights offered meanwhile (client/blocks.py)
        self.local_copies = 5 if overlap else 3
        # overlap: one more, held for the weights while the next block is computed (with
        # two, the next block waited for the last delta to leave: 2 ms a block at 1 Gbit/s)
        self.send_buffers = 3 if overlap else 2
        # async blocks: one delta in flight at most, so the next block starts once the
        # weights held say the last one was settled (applied, hence in them, or refused)
        self._waits: ComputePolicy = SyncCompute(max_in_flight) if sync else AsyncCompute(1)

    def may_compute(self, state: ComputeState) -> bool:
        if self.overlap:  # the block before is sent (update_steps holds one at most)
            return state.in_flight <= 1
        return self._waits.may_compute(state)

    def may_send(self, state: ComputeState) -> bool:
        return not self.overlap or self._waits.may_compute(state)

    def frames_per_update(self, job: JobSpec) -> int:
        if job.block_seconds:  # the block ends by the clock, or at the lease's end
            return 1 << 62
        return job.block_bunches * job.bunch_size

    def make_compute(
        self, backend: ComputeBackend, layout: ElementLayout, job: JobSpec
    ) -> tuple[Compute, Overlap | None]:
        trainer = LocalTrainer(backend, layout, job)
        return trainer.block, trainer if self.overlap else None


class SliceCompute(ComputePolicy):
    """np: the worker holds a slice of the hidden units and answers the server's bunches
    (client/slice_work.py); it never computes an update of the whole network."""

    name = "np"
    holds_whole_network = False

    def may_compute(self, state: ComputeState) -> bool:
        return False

    def make_turn(
        self, job: JobSpec, corpus: Corpus, backend: object,
        updates: Callable[[], T], slices: Callable[[SliceWork], T],
    ) -> T:  # fmt: skip
        return slices(SliceWork(job, corpus, backend))

    def prepare_backend(self, backend: ComputeBackend, job: JobSpec, corpus: Corpus) -> None:
        """For its data and its device only: the network it holds is a slice, told
        later (a board's memory is checked against the slice, not the whole network)."""
        backend.prepare(job.with_changes(network=slice_network(job.network, 1)), corpus)


def make_compute_policy(job: JobSpec) -> ComputePolicy:
    """The policy of a job's ``mode`` (and, in async mode, its staleness policy)."""
    if job.mode == "bmuf":
        return BlockCompute(job.max_in_flight, job.block_sync, job.block_overlap)
    if job.mode == "async":
        return AsyncCompute(job.max_in_flight, StalenessSetting.parse(job.staleness))
    policies: dict[str, type[ComputePolicy]] = {"sync": SyncCompute, "np": SliceCompute}
    return policies[job.mode](job.max_in_flight)


def follow_change(job: JobSpec, policy: ComputePolicy, change: PolicyChange) -> JobSpec:
    """The server changed its staleness policy: ``policy`` acts on it from the next bunch
    (the message was checked when decoded: the text is a policy); the job as it is now,
    read as a welcome's job is (a policy where its mode has nothing stale, which no snet
    server sends, at none: protocol/modes.py), not a ConfigError out of the inbox."""
    policy.follow(StalenessSetting.parse(change.staleness))
    logging.getLogger("snet.worker").info(
        "the server's staleness policy is now %s (after version %d): at most %d updates "
        "unsettled", change.staleness, change.version, policy.max_in_flight,
    )  # fmt: skip
    return JobSpec.from_dict({**job.to_dict(), "staleness": change.staleness})
