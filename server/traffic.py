"""``WorkerTraffic``: what a mode does with its workers' traffic, beyond the parts every
mode shares (the lease book, the epochs, the statistics, the CV scoring, the weights).

The coordinator hands each such event to its mode's traffic and never asks which mode
runs. The data-parallel modes (sync, async, bmuf) lease frames to workers and take their
updates (``UpdateTraffic``: the lease desk, and the coordinator's update intake and step
queue); np runs bunches through the holders of the hidden units' slices (``SliceRounds``,
server/slice_rounds.py). The mode's step policy (server/policies.py) says which traffic
it makes, so a further mode is a further traffic and a policy, not more branches in the
coordinator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import FramesWanted, SliceReply

from .epochs import EpochControl
from .evaluations import Evaluations
from .leasing import LeaseDesk
from .pool import Received
from .session import WorkerSession
from .stats import BunchFigures, TrainingStats


class WorkerTraffic(Protocol):
    """The events of a worker's traffic that depend on the mode."""

    # whether the workers hold the whole network (sent whole copies of the weights, and
    # scoring CV with them) or a part of it (np: slices, told by the traffic itself)
    whole_weights: bool

    def joined(self, session: WorkerSession) -> None:
        """A worker has been welcomed (and sent what every mode sends)."""

    def leaving(self, session: WorkerSession) -> bool:
        """A worker is leaving, before its frames go back: whether it held a part of the
        network that the others must now take over."""

    def left(self, session: WorkerSession, held: bool) -> None:
        """A worker has left and the coordinator is done with it."""

    def fill(self) -> None:
        """Give the workers work: frames to train on, or bunches to run."""

    def frames_wanted(self, session: WorkerSession, message: FramesWanted) -> None:
        """The worker cannot read the data."""

    def on_message(self, session: WorkerSession, message: SliceReply) -> None:
        """A slice report or a bunch's partial outputs (``RejectedUpdate`` if the mode
        takes none)."""

    def on_update(self, session: WorkerSession, received: Received) -> None:
        """An update (``RejectedUpdate`` if refused). What it does not keep (a queued
        update's loan: ``Received.keep``) the connection gives back to the pool."""

    def holding_back(self) -> bool:
        """Whether it still waits for more workers before any work starts."""

    def hold(self) -> None:
        """A roll-back (newbob) is being carried out: no new work meanwhile."""

    def restart(self) -> None:
        """The roll-back is done: the workers go on from the restored weights."""

    def not_in_weights(self) -> list[BunchFigures]:
        """Bunches counted (steps, versions, figures) that the weights a checkpoint saves
        do not include: np's after its last report; none in the other modes."""


class UpdateTraffic:
    """The data-parallel modes: frames leased to workers, each update taken by the
    coordinator's intake (``take_update``) and applied by its steps."""

    whole_weights = True

    def __init__(
        self, mode: str, desk: LeaseDesk, epochs: EpochControl, stats: TrainingStats,
        evaluations: Evaluations, sessions: Mapping[int, WorkerSession],
        take_update: Callable[[WorkerSession, Received], None],
    ) -> None:  # fmt: skip
        self.mode = mode
        self.desk, self.epochs, self.stats = desk, epochs, stats
        self.evaluations = evaluations
        self.sessions = sessions  # the workers present (read only)
        self.take_update = take_update

    def joined(self, session: WorkerSession) -> None:
        """Nothing more than the leases ``fill`` gives it."""

    def leaving(self, session: WorkerSession) -> bool:
        return False  # its frames go back through the lease desk, as everyone's

    def left(self, session: WorkerSession, held: bool) -> None:
        """Nothing more: the lease desk has its frames back."""

    def fill(self) -> None:
        if not self.epochs.waiting_for_cv:  # newbob decides the next epoch's rate first
            self.desk.fill(self.sessions.values(), self.epochs.rate)
            self.stats.leasing(bool(self.desk.book.granted))

    def frames_wanted(self, session: WorkerSession, message: FramesWanted) -> None:
        """Its frames are sent inline from now on."""
        evaluating = bool(self.evaluations.held_by(session.worker_id))
        self.desk.frames_wanted(session, message, evaluating)

    def on_message(self, session: WorkerSession, message: SliceReply) -> None:
        raise RejectedUpdate(f"{message.TYPE} is np mode's; this job's mode is {self.mode}")

    def on_update(self, session: WorkerSession, received: Received) -> None:
        self.take_update(session, received)

    def holding_back(self) -> bool:
        return self.desk.holding_back(len(self.sessions))

    def hold(self) -> None:
        """Nothing to hold: the roll-back's weights go to every worker."""

    def restart(self) -> None:
        """Nothing to restart: the workers' next leases are on the restored weights."""

    def not_in_weights(self) -> list[BunchFigures]:
        return []  # a checkpoint is taken between steps: every step is in its weights
