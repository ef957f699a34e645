"""``Evaluations``: the cross-validation jobs, who scores each, and the results.

After each epoch the weights it ended with are scored on the CV frames by one worker while
the others train on. A job goes to a worker that has delivered updates (a newcomer may
never compute), preferring the one with the fewest frames left to train on. A job not
returned in time (server/progress.py's deadline with the CV set's size at the worker's
measured rate) is asked of another worker; a result is accepted only from the worker that
was asked, for the version it was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import EvalResult
from snet.protocol.numbering import shown_epoch

from .plausible import eval_figures_problem
from .session import WorkerSession

log = logging.getLogger("snet.server")


@dataclass
class EvalJob:
    """One epoch's weights to be scored on the CV frames."""

    epoch: int
    version: int
    weights: np.ndarray
    worker_id: int | None = None
    assigned_at: float = 0.0  # monotonic


class Evaluations:
    """The CV jobs not yet scored."""

    def __init__(self) -> None:
        self._jobs: dict[int, EvalJob] = {}

    def add(self, epoch: int, version: int, weights: np.ndarray) -> None:
        self._jobs[epoch] = EvalJob(epoch, version, weights)

    def checkpoint_state(self) -> list[dict[str, Any]]:
        """The jobs not yet scored (whoever held them is gone after a restart)."""
        return [{"epoch": j.epoch, "version": j.version, "weights": j.weights}
                for j in self._jobs.values()]  # fmt: skip

    def restore_checkpoint(self, state: list[dict[str, Any]]) -> None:
        for saved in state:
            self.add(int(saved["epoch"]), int(saved["version"]), saved["weights"])

    def held_by(self, worker_id: int) -> list[EvalJob]:
        return [job for job in self._jobs.values() if job.worker_id == worker_id]

    def worker_gone(self, worker_id: int) -> None:
        for job in self.held_by(worker_id):
            job.worker_id = None

    def assign(
        self,
        sessions: Iterable[WorkerSession],
        frames_left: Callable[[int], int],
        now: float,
    ) -> list[tuple[WorkerSession, EvalJob]]:
        """Give every unassigned job a worker; returns whom to send which job."""
        candidates = list(sessions)
        sent: list[tuple[WorkerSession, EvalJob]] = []
        for job in self._jobs.values():
            if job.worker_id is not None or not candidates:
                continue
            session = min(
                candidates,
                key=lambda s: (not s.clock.delivered or s.probation, frames_left(s.worker_id)),
            )
            job.worker_id, job.assigned_at = session.worker_id, now
            session.evaluations += 1
            sent.append((session, job))
        return sent

    def take_result(self, session: WorkerSession, result: EvalResult, cv_frames: int) -> EvalJob:
        """The job ``result`` answers (``RejectedUpdate`` if it was not asked of ``session``,
        or its figures are implausible: then the job is asked of another worker)."""
        job = self._jobs.get(result.epoch)
        if job is None or job.version != result.version or job.worker_id != session.worker_id:
            epoch = shown_epoch(result.epoch)
            raise RejectedUpdate(f"no evaluation of epoch {epoch} was asked of you")
        problem = eval_figures_problem(result.frames, result.correct, result.loss_sum, cv_frames)
        if problem:
            job.worker_id = None
            session.probation = True  # not asked again before it delivers something
            raise RejectedUpdate(problem)
        del self._jobs[result.epoch]
        return job

    def overdue(
        self,
        now: float,
        allowed: Callable[[WorkerSession], float],
        sessions: dict[int, WorkerSession],
    ) -> list[tuple[WorkerSession, EvalJob]]:
        """Jobs held longer than ``allowed(worker)`` seconds (while another worker could
        take them over): unassigned, and returned with the worker that sat on them."""
        late: list[tuple[WorkerSession, EvalJob]] = []
        if len(sessions) < 2:
            return late
        for job in self._jobs.values():
            session = sessions.get(job.worker_id) if job.worker_id is not None else None
            if session is not None and now - job.assigned_at > allowed(session):
                job.worker_id = None
                late.append((session, job))
        return late
