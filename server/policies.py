"""Modes as policies: which queued updates make a step, and what a late worker costs.

The coordinator, the pool, the lease book and the update rule do not know which mode runs.
What differs between modes is decided here, by a policy object, from a plain snapshot of
the queue and the workers (``QueueView``): no server, no sockets, no clock. So each mode is
tested by handing it a list of pending updates (tests/test_policies.py), and a new mode is a
new class, not a branch in every module.

- ``SyncSteps`` (SNet v1, v2's safe mode): one step over every update of the round, once
  every worker that holds frames has delivered (one that joined after this server's first
  step, once it has delivered its first: until then it may be loading its data, or never
  send a thing); an update must be on the current version (the next round's, while a
  step runs); a worker that misses the round deadline is dropped, since the round cannot
  go on without it otherwise (a latecomer that never delivered has its leases taken back
  instead, as in async mode: server/lateness.py).
- ``AsyncSteps`` (SNet v2): a step per ``updates_per_step`` updates (default: one per
  worker that is keeping up), whoever sent them; the queue is flushed when no worker that
  is keeping up could still add to it. A late worker is simply not counted; its frames go
  to the others when they run dry.

Every policy may take several steps at once (a backlog that built up while the last step
was applied: they are applied in one fused pass, each with its own version), at most
``MAX_FUSED_STEPS``.

How a step's updates combine is the policy's ``Combination``: gradient sums under the
momentum rule, or (``BlockDeltas``, bmuf mode) model deltas of blocks of local steps,
filtered with block momentum (server/block_filter.py); it also says which codecs fit and
how large a lease is. bmuf is sync or async stepping over block deltas.

Further modes fit the same interface: bounded staleness holds an update whose base is too
old (``take`` skips it) or tells its worker to wait. Network-parallel training (``np``,
``SliceSteps``) has every worker see every pattern and exchanges partial outputs instead
of updates: its bunches are run by the coordinator's np part (slice_rounds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from snet.protocol.codecs import bmuf_update_problem
from snet.protocol.codecs.handshake import agree_codecs
from snet.protocol.errors import UnknownCodec
from snet.protocol.job import JobSpec

from .block_filter import BlockFilter
from .slice_master import AssembledElement
from .traffic import WorkerTraffic
from .update_rule import StepRule, UpdateRule

SLIVER_CODECS = ("topk", "powersgd")  # send part of a change: the rest waits for later copies

MAX_FUSED_STEPS = 16  # steps applied in one pass when updates pile up (bounds latency)

LateAction = Literal["drop", "revoke"]


@dataclass(frozen=True)
class PendingView:
    """One queued update as a policy sees it."""

    worker_id: int
    base_version: int


@dataclass(frozen=True)
class WorkerView:
    """One connected worker as a policy sees it."""

    worker_id: int
    holds_frames: bool  # leased frames for which no update has arrived yet
    late: bool  # past its delivery deadline (server/progress.py)
    proven: bool  # it has proved itself with an update (server/session.py)
    joined_late: bool = False  # it joined once this server had started a step


@dataclass(frozen=True)
class QueueView:
    """The queue of received updates, oldest first, and the workers, at one moment."""

    pending: tuple[PendingView, ...]
    workers: tuple[WorkerView, ...]
    version: int  # the current weights version


class Combination:
    """How a step's updates combine: gradient sums under the momentum update rule."""

    # whole copies of the element its rule holds (server/footprint.py): the weights, the
    # next step's fresh weights while the published ones are still sent, two velocities
    rule_copies = 4
    state_arrays = 2  # of a checkpoint's state: the weights and the velocity

    def make_rule(self, weights: np.ndarray, job: JobSpec) -> StepRule:
        return UpdateRule(weights, job.momentum)

    def codec_problem(self, update_codec: str) -> str:
        """Why a worker may not send updates in ``update_codec`` ("" if it may)."""
        return ""

    def weights_problem(self, weights_form: str) -> str:
        """Why a worker may not take its weights as ``weights_form`` ("" if it may)."""
        return ""

    def agreed_codecs(self, capabilities: tuple[str, ...], job_compress: str) -> dict[str, str]:
        """The codecs of a worker with these ``capabilities`` (its hello's), as the
        handshake agrees them (``agree_codecs``); ``UnknownCodec`` for one this server
        does not know or this mode refuses: the handshake's refusal, and the demo's
        before it starts its workers."""
        codecs = agree_codecs(capabilities, job_compress)
        if problem := self.codec_problem(codecs["update"]) or self.weights_problem(
            codecs["weights"]
        ):
            raise UnknownCodec(problem)
        return codecs

    def chunk_frames(self, job: JobSpec) -> int:
        """Frames per lease."""
        return job.chunk_frames

    def lookahead_copies(self, job: JobSpec) -> int:
        """Copies of the element a look-ahead point holds beside the rule's (none)."""
        return 0

    def update_frames(self, job: JobSpec) -> int:
        """The frames of one update: leases are cut in whole ones (server/leases.py)."""
        return job.bunch_size


class BlockDeltas(Combination):
    """bmuf: model deltas of blocks of local steps, filtered with block momentum."""

    state_arrays = 4  # and the filter's snapshot and model

    def make_rule(self, weights: np.ndarray, job: JobSpec) -> StepRule:
        return BlockFilter(weights, job)

    def codec_problem(self, update_codec: str) -> str:
        return bmuf_update_problem(update_codec, "update codec")

    def weights_problem(self, weights_form: str) -> str:
        # A block starts from the weights a worker holds, sent once per block: a delta
        # codec that sends a sliver of each change (the largest 1 %, a rank-2 factor) left
        # the workers' copies far from W, their blocks trained from there and the run
        # collapsed (3 epochs of the default job: CV 33 % with delta:topk:0.01, 15 % with
        # delta:powersgd:2, 84 % in float32, delta:int8 and fp16).
        family = weights_form.removeprefix("delta:").partition(":")[0]
        if weights_form.startswith("delta:") and family in SLIVER_CODECS:
            return (
                f"weights codec {weights_form} sends a sliver of each change; bmuf workers "
                "start every block from the weights they hold: use none, fp16, delta:int8 "
                "or delta:sign"
            )
        return ""

    def chunk_frames(self, job: JobSpec) -> int:
        """A lease holds whole blocks (at least one), so blocks are not cut at lease ends."""
        if job.block_seconds:
            return job.chunk_frames
        block = job.block_bunches * job.bunch_size
        return max(job.chunk_frames // block, 1) * block

    def update_frames(self, job: JobSpec) -> int:
        """A block's frames: a lease cut to one bunch would end every block after one
        bunch, an exchange per bunch (0 for blocks of seconds: fixed chunks)."""
        return 0 if job.block_seconds else job.block_bunches * job.bunch_size

    def lookahead_copies(self, job: JobSpec) -> int:
        """nbm and nesterov publish a look-ahead point: it and the next step's."""
        return 2 if job.block_filter in ("nbm", "nesterov") else 0


class StepPolicy:
    """The server side of a mode: which queued updates make a step (``take``), which
    versions it accepts, what a late worker costs; and how the updates combine (its
    ``combination``). Subclasses decide; the coordinator carries out."""

    name = ""
    late_action: LateAction = "revoke"
    # whether an update may be applied on a newer version than its base (what a
    # staleness policy acts on); sync rounds and np's slices never are. The job's rule
    # says the same of ``staleness`` (protocol/modes.py; tests/test_staleness.py)
    stale_updates = True
    # whether the workers hold whole weights to score CV with (np's hold slices: the
    # server scores)
    workers_score_cv = True
    pools_updates = True  # whether updates arrive in the element pool (np's send none)

    def __init__(self, updates_per_step: int = 0, combination: Combination | None = None) -> None:
        self.updates_per_step = updates_per_step
        self.combination = combination or Combination()

    @property
    def hands_over_the_end(self) -> bool:
        """Whether a far slower worker's last leases go to idle workers at an epoch's end
        (server/lateness.py): async's gradients; a bmuf worker's block would be lost whole."""
        return False

    def take(self, view: QueueView) -> list[list[int]]:
        """The steps that are ready now: each a list of indexes into ``view.pending``, in
        the order the steps are to be applied (an empty list: wait)."""
        raise NotImplementedError

    def make_traffic(
        self, updates: WorkerTraffic, rounds: Callable[[], WorkerTraffic]
    ) -> WorkerTraffic:
        """Its workers' traffic (server/traffic.py): leases and ``updates``, or np's
        ``rounds`` of bunches (made only when chosen)."""
        return updates

    def refusal(self, base_version: int, version: int) -> str:
        """Why an update computed on ``base_version`` cannot be queued ("" if it can)."""
        if not 0 <= base_version <= version:
            return f"update names unknown weights version {base_version}"
        return ""

    @staticmethod
    def _waiting_for(view: QueueView, workers: list[WorkerView]) -> int:
        """Of ``workers``, those that hold undelivered frames and have nothing queued."""
        queued = {p.worker_id for p in view.pending}
        return sum(1 for w in workers if w.holds_frames and w.worker_id not in queued)


class SyncSteps(StepPolicy):
    """One step over the whole round, once nobody who holds frames is still computing."""

    name = "sync"
    late_action: LateAction = "drop"
    stale_updates = False

    def take(self, view: QueueView) -> list[list[int]]:
        # A round waits for the workers there from the start, and for one that joined
        # later only once it has delivered: a peer that joined and said nothing held
        # every round to its deadline (12 s), was dropped, and could join again at once
        # (0.2 steps a second, against 381). A latecomer's first update joins the round it
        # is on time for, or is refused as stale (intake.py) and its frames leased again;
        # from then on the rounds wait for it.
        waited = [w for w in view.workers if w.proven or not w.joined_late]
        if not view.pending or self._waiting_for(view, waited or list(view.workers)) > 0:
            return []
        return [list(range(len(view.pending)))]

    def refusal(self, base_version: int, version: int) -> str:
        reason = super().refusal(base_version, version)
        if not reason and base_version != version:
            reason = f"a synchronous round: update on version {base_version}, round is {version}"
        return reason


class AsyncSteps(StepPolicy):
    """A step per ``updates_per_step`` updates, whoever sent them; nobody is waited for
    past their deadline."""

    name = "async"

    @property
    def hands_over_the_end(self) -> bool:
        return not isinstance(self.combination, BlockDeltas)

    def counted(self, view: QueueView) -> list[WorkerView]:
        """The workers a step is sized for and waits for: those keeping up. Once any has
        delivered, only those that have (a newcomer may still be loading its data: its
        updates are welcome, but nobody waits for its first)."""
        timely = [w for w in view.workers if not w.late]
        proven = [w for w in timely if w.proven]
        return proven or timely

    def take(self, view: QueueView) -> list[list[int]]:
        counted = self.counted(view)
        wanted = self.updates_per_step or max(len(counted), 1)
        queued = len(view.pending)
        groups: list[list[int]] = []
        start = 0
        while queued - start >= wanted and len(groups) < MAX_FUSED_STEPS:
            groups.append(list(range(start, start + wanted)))
            start += wanted
        rest = view.pending[start:]
        if rest and len(groups) < MAX_FUSED_STEPS:
            others = QueueView(rest, view.workers, view.version)
            if self._waiting_for(others, counted) == 0:
                groups.append(list(range(start, queued)))
        return groups


class SliceAssembly(Combination):
    """np mode: the rule holds the element assembled from the workers' slices."""

    rule_copies = 6  # and the slice master's element and momentum

    def make_rule(self, weights: np.ndarray, job: JobSpec) -> StepRule:
        return AssembledElement(weights, job)


class SliceSteps(StepPolicy):
    """np mode: no worker sends updates (server/slice_rounds.py runs the bunches), so
    nothing is ever queued for a step."""

    name = "np"
    late_action: LateAction = "drop"  # every bunch waits for every holder
    stale_updates = False
    workers_score_cv = False
    pools_updates = False

    def __init__(self, updates_per_step: int = 0, combination: Combination | None = None) -> None:
        super().__init__(updates_per_step, combination or SliceAssembly())

    def take(self, view: QueueView) -> list[list[int]]:
        return []

    def make_traffic(
        self, updates: WorkerTraffic, rounds: Callable[[], WorkerTraffic]
    ) -> WorkerTraffic:
        return rounds()  # bunches through the slice holders, no leases, no updates

    def refusal(self, base_version: int, version: int) -> str:
        return "np mode: workers send partial outputs, not updates"


def make_step_policy(job: JobSpec) -> StepPolicy:
    """The policy of a job's ``mode`` (bmuf: sync or async blocks, ``block_sync``)."""
    if job.mode == "bmuf":  # a block is a step of its own when blocks are asynchronous
        return SyncSteps(0, BlockDeltas()) if job.block_sync else AsyncSteps(1, BlockDeltas())
    policies: dict[str, type[StepPolicy]] = {
        "sync": SyncSteps,
        "async": AsyncSteps,
        "np": SliceSteps,
    }
    return policies[job.mode](job.updates_per_step)
