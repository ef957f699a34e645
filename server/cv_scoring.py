"""``CvScoring``: who scores each epoch's weights on the CV frames, and what comes back.

The coordinator adds each epoch's weights to ``Evaluations`` (evaluations.py); this part
hands the jobs out and takes the answers in: to workers (with the CV frames inline to
those that cannot read the data), a second worker with ``--verify-cv``, and the server's
``CvReferee`` (cv_referee.py) when two scores differ or no second worker is there. In np
mode (``by_server``) the server scores every epoch itself: no worker need hold the whole
network, which in np mode none may be able to (a board's memory).

An accepted score goes to the coordinator's ``accept`` (the epoch's decision: newbob,
the next epoch, the end); a refused one's job is handed out again, to another worker, or
scored by the server when every worker there has had its result for it refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import EvalResult, Evaluate

from .cv_referee import CvReferee
from .dataplan import DataPlan
from .evaluations import EvalJob, Evaluations
from .inline import InlineFrames
from .session import WorkerSession

SERVER_ID = 0  # the server, as the evaluations' scorer in np mode (real workers start at 1)


def _nothing(_: object) -> None:
    """The server scorer's send and close: the server does not message itself."""


class CvScoring:
    """Hands out the CV jobs of ``evaluations`` and passes accepted scores to ``accept``."""

    def __init__(
        self,
        evaluations: Evaluations,
        referee: CvReferee,
        inline: InlineFrames,
        plan: DataPlan,
        sessions: dict[int, WorkerSession],
        remaining: Callable[[int], int],
        by_server: bool,
        accept: Callable[[EvalJob, EvalResult], None],
        fail: Callable[[str], None],
        closed: Callable[[], bool],
    ) -> None:
        self.evaluations = evaluations
        self.referee = referee
        self.inline = inline
        self.plan = plan
        self.sessions = sessions  # the coordinator's workers (read only)
        self.remaining = remaining  # a worker id's frames left to train on (lease book)
        self.by_server = by_server
        self.scorer = WorkerSession(SERVER_ID, "server", "", "server", (), _nothing, _nothing)
        self.scoring: set[asyncio.Task[None]] = set()
        self.accept = accept  # an accepted score: the epoch's decision (the coordinator)
        self.fail = fail  # the referee broke
        self.closed = closed  # shutting down: a score that comes after is dropped

    def assign(self) -> None:
        """Hand out the jobs waiting for a scorer (np mode: score them here)."""
        now = time.monotonic()
        if self.by_server:
            for _, job in self.evaluations.assign([self.scorer], lambda _: 0, now):
                task = asyncio.get_running_loop().create_task(self._score(job))
                self.scoring.add(task)
                task.add_done_callback(self.scoring.discard)
            return
        workers = self.sessions.values()
        for session, job in self.evaluations.assign(workers, self.remaining, now):
            self.inline.send(session, self.plan.cv_frames)
            session.send(Evaluate(job.version, job.epoch, job.weights))
        stranded = self.evaluations.without_second_scorer(workers)
        stranded += self.evaluations.refused_everywhere(workers)
        for job in stranded:
            self.referee.referee(job, self._refereed, self.fail)

    def result(self, session: WorkerSession, message: EvalResult) -> None:
        """A worker's score (RejectedUpdate if refused: its job is handed out again)."""
        try:
            verdict = self.evaluations.take_result(session, message, len(self.plan.cv_frames))
        except RejectedUpdate:
            self.assign()  # a refused result's job goes to another worker
            raise
        if verdict.disputed:
            self.referee.referee(verdict.job, self._refereed, self.fail)
        if verdict.result is None:  # --verify-cv: a second opinion still to come
            self.assign()
            return
        self.accept(verdict.job, verdict.result)

    async def _score(self, job: EvalJob) -> None:
        result = await self.referee.score(job.epoch, job.version, job.weights)  # step thread
        if not self.closed():
            self.result(self.scorer, result)

    def _refereed(self, job: EvalJob, result: EvalResult) -> None:
        if not self.closed():
            self.evaluations.referee(job.epoch, result, self.sessions)
            self.accept(job, result)
