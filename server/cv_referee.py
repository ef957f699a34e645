"""``CvReferee``: the server scores an epoch's weights on the CV set itself (``--verify-cv``).

Workers score each epoch's weights on the CV frames, and newbob decides the learning rate
(and whether to keep the epoch) from the result: a forged result can stop a job early or
keep a bad epoch (issue 12). With ``--verify-cv`` two workers score each epoch and must
agree (server/evaluations.py); when they do not, or only one worker is there, the server
scores the weights itself, once, with the same forward pass as the test file
(server/testset.py: float64, the frames read and normalised as the workers do), in the
step thread, and its score is the epoch's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from snet.protocol.job import JobSpec
from snet.protocol.messages import EvalResult
from snet.protocol.numbering import shown_epoch

from .dataplan import DataPlan
from .evaluations import EvalJob
from .testset import score_frames

log = logging.getLogger("snet.server")


class CvReferee:
    """Scores weights on the job's CV frames, off the event loop."""

    def __init__(self, job: JobSpec, plan: DataPlan, executor: Executor) -> None:
        self.job = job
        self.plan = plan
        self.executor = executor

    def score_now(self, epoch: int, version: int, weights: np.ndarray) -> EvalResult:
        """The CV result of ``weights`` (blocking: call it in the executor)."""
        centres = self.plan.cv_frames
        correct, loss = score_frames(self.job.network, weights, self.plan.source, centres,
                                     self.plan.norms, self.job.data.context)  # fmt: skip
        return EvalResult(version, epoch, len(centres), correct, loss)

    def score(self, epoch: int, version: int, weights: np.ndarray) -> asyncio.Future[EvalResult]:
        """The CV result of ``weights``, scored in the executor (the step thread)."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executor, self.score_now, epoch, version, weights)

    def referee(
        self,
        job: EvalJob,
        decided: Callable[[EvalJob, EvalResult], None],
        failed: Callable[[str], None],
    ) -> None:
        """Score ``job`` (the workers disagreed, or no second worker was there): its score
        is the epoch's and goes to ``decided``; ``failed`` is told if scoring broke."""
        log.info("epoch %d: the server scores the CV set itself", shown_epoch(job.epoch))

        def scored(done: asyncio.Future[EvalResult]) -> None:
            if done.cancelled():
                return
            if done.exception() is not None:
                log.error("scoring the CV set failed: %r", done.exception())
                failed("CV scoring failed")
                return
            decided(job, done.result())

        self.score(job.epoch, job.version, job.weights).add_done_callback(scored)
