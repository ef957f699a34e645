"""``Evaluations``: the cross-validation jobs, who scores each, and the results.

After each epoch the weights it ended with are scored on the CV frames by one worker while
the others train on. A job goes to a worker that has delivered updates (a newcomer may
never compute), preferring the one with the fewest frames left to train on. A job not
returned in time (``ProgressWatch.scoring_deadline``: the CV set at the rate the server
saw the worker train at, at most 10x the others') is asked of another worker, never again
of the late one (``overdue``: with none to ask, the server scores it in the end); a
result is accepted only from the worker that was asked, for the version it was sent. A
result with implausible figures (another count of CV frames, say: a worker that cut the
CV set otherwise) is refused, and that job is not
asked of that worker again: it would answer the same, and when it was the only worker the
job went back to it ten times a second and the epoch never ended. When every connected
worker has had its result for a job refused, the server scores the job itself.

With ``--verify-cv`` (``copies=2``) each epoch's job is asked of two different workers and
their results must agree (``results_agree``: the same frames, correct counts within 0.1 %
of them, losses within 0.1 %). When they do not, or no second worker is there to ask, the
server scores the weights itself (``CvReferee``, server/cv_referee.py); its own score is
the epoch's, and a worker whose result differs from it is refused (counted in
``figures()``) and not asked again before it delivers an update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import EvalResult
from snet.protocol.numbering import shown_epoch

from .progress import far_slower, quickest
from .reported import eval_figures_problem
from .session import WorkerSession

log = logging.getLogger("snet.server")

CV_CORRECT_TOLERANCE = 1e-3  # two scores of the same weights: correct counts this close
CV_LOSS_TOLERANCE = 1e-3  # and summed losses (relative)
SELF_SCORE_FACTOR = 4  # deadlines a job nobody else may take waits before the server scores it


@dataclass
class EvalJob:
    """One epoch's weights to be scored on the CV frames (``copy``: which of its scorers)."""

    epoch: int
    version: int
    weights: np.ndarray
    worker_id: int | None = None
    assigned_at: float = 0.0  # monotonic
    copy: int = 0
    refused_by: set[int] = field(default_factory=set)  # workers whose result was refused
    taken_from: set[int] = field(default_factory=set)  # workers it was late with

    @property
    def barred(self) -> set[int]:
        """Workers it may not go to (again): its result refused, or late with it."""
        return self.refused_by | self.taken_from


@dataclass
class Verdict:
    """What a CV result settles: ``result`` is the epoch's (None: not yet; ``disputed``:
    the server must score the epoch itself, as ``referee``)."""

    job: EvalJob
    result: EvalResult | None = None
    disputed: bool = False


def results_agree(a: EvalResult, b: EvalResult) -> bool:
    """Two scores of the same weights on the same CV set, up to rounding (two backends,
    float32 against the server's float64, may differ on near ties and in the last bits)."""
    if a.frames != b.frames:
        return False
    loss_slack = CV_LOSS_TOLERANCE * max(abs(a.loss_sum), abs(b.loss_sum)) + 1e-6 * a.frames
    return (
        abs(a.correct - b.correct) <= max(1, int(CV_CORRECT_TOLERANCE * a.frames))
        and abs(a.loss_sum - b.loss_sum) <= loss_slack
    )


class Evaluations:
    """The CV jobs not yet scored (``copies``: by how many workers each, 1 or 2)."""

    def __init__(self, copies: int = 1) -> None:
        self.copies = copies
        self._jobs: dict[tuple[int, int], EvalJob] = {}
        self._answers: dict[int, dict[int, EvalResult]] = {}  # epoch -> worker -> result
        self._disputed: dict[int, tuple[EvalJob, dict[int, EvalResult]]] = {}  # the server's
        self.agreed = 0  # epochs two workers scored alike
        self.refereed = 0  # epochs the server scored itself
        self.refused = 0  # worker results that differed from the server's score

    def add(self, epoch: int, version: int, weights: np.ndarray) -> None:
        for copy in range(self.copies):
            self._jobs[epoch, copy] = EvalJob(epoch, version, weights, copy=copy)

    def checkpoint_state(self) -> list[dict[str, Any]]:
        """The jobs not yet scored (whoever held them is gone after a restart; a job
        being verified is scored anew)."""
        epochs = {j.epoch: j for j in self._jobs.values()}
        epochs.update({epoch: job for epoch, (job, _) in self._disputed.items()})
        return [{"epoch": j.epoch, "version": j.version, "weights": j.weights}
                for j in epochs.values()]  # fmt: skip

    def figures(self) -> dict[str, int]:
        """For /status: how the CV results were checked."""
        return {"scorers": self.copies, "agreed": self.agreed, "refereed": self.refereed,
                "refused": self.refused}  # fmt: skip

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
        """Give every unassigned job a worker; returns whom to send which job: of those
        proven, one not ``FAR_SLOWER`` than the quickest at its pace, the one with the
        fewest frames left (it has the least to finish first). The one with the fewest was
        an emulated board, at 0.2 s a bunch, whose last leases had just been handed over:
        the epoch's score came 1.5 s late. (Not the soonest done at the paces' face value:
        between workers of one speed their noise sent the CV set to one still training.)"""
        candidates = list(sessions)
        fastest = quickest(s.clock for s in candidates)

        def choice(session: WorkerSession) -> tuple[bool, bool, int]:
            held = not session.proven or session.scoring_held
            return held, far_slower(session.clock.pace, fastest), frames_left(session.worker_id)

        sent: list[tuple[WorkerSession, EvalJob]] = []
        for job in self._jobs.values():
            others = self._scorers(job.epoch)  # a second opinion is another worker's
            eligible = [s for s in candidates if s.worker_id not in others | job.barred]
            if job.worker_id is not None or not eligible:
                continue
            session = min(eligible, key=choice)
            job.worker_id, job.assigned_at = session.worker_id, now
            session.asked_to_score()
            sent.append((session, job))
        return sent

    def take_result(self, session: WorkerSession, result: EvalResult, cv_frames: int) -> Verdict:
        """What ``result`` settles (``RejectedUpdate`` if it was not asked of ``session``,
        or its figures are implausible: then the job is asked of another worker)."""
        asked = (j for j in self._jobs.values() if j.worker_id == session.worker_id)
        job = next((j for j in asked if j.epoch == result.epoch), None)
        if job is None or job.version != result.version:
            epoch = shown_epoch(result.epoch)
            raise RejectedUpdate(f"no evaluation of epoch {epoch} was asked of you")
        problem = eval_figures_problem(result.frames, result.correct, result.loss_sum, cv_frames)
        if problem:
            job.worker_id = None
            job.refused_by.add(session.worker_id)
            session.hold_scoring()  # not asked again before it delivers something
            raise RejectedUpdate(problem)
        del self._jobs[job.epoch, job.copy]
        answers = self._answers.setdefault(job.epoch, {})
        answers[session.worker_id] = result
        if any(j.epoch == job.epoch for j in self._jobs.values()):
            return Verdict(job)  # the other scorer's result is still to come
        del self._answers[job.epoch]
        first, *rest = answers.values()
        if all(results_agree(first, other) for other in rest):
            self.agreed += 1 if rest else 0
            return Verdict(job, first)
        self._disputed[job.epoch] = job, answers
        return Verdict(job, disputed=True)

    def without_second_scorer(self, sessions: Iterable[WorkerSession]) -> list[EvalJob]:
        """Jobs one worker has scored whose other copy no connected worker may take (the
        one that scored it is alone): the server scores them itself."""
        present = {s.worker_id for s in sessions}
        stranded: list[EvalJob] = []
        for epoch, answers in list(self._answers.items()):
            waiting = [j for j in self._jobs.values() if j.epoch == epoch]
            if all(j.worker_id is None for j in waiting) and present <= set(answers):
                for j in waiting:
                    del self._jobs[epoch, j.copy]
                self._disputed[epoch] = waiting[0], self._answers.pop(epoch)
                stranded.append(waiting[0])
        return stranded

    def refused_everywhere(self, sessions: Iterable[WorkerSession]) -> list[EvalJob]:
        """Jobs no connected worker may take because each has had its result for them
        refused, or was late with them (``overdue``), or scored the epoch's other copy: the
        server scores them itself."""
        present = {s.worker_id for s in sessions}
        stranded: list[EvalJob] = []
        for epoch in sorted({j.epoch for j in self._jobs.values()}):
            waiting = [j for j in self._jobs.values() if j.epoch == epoch]
            answered = set(self._answers.get(epoch, {}))
            if present and all(
                j.worker_id is None and j.barred and present <= j.barred | answered for j in waiting
            ):
                for j in waiting:
                    del self._jobs[epoch, j.copy]
                self._disputed[epoch] = waiting[0], self._answers.pop(epoch, {})
                stranded.append(waiting[0])
        return stranded

    def referee(self, epoch: int, own: EvalResult, sessions: dict[int, WorkerSession]) -> None:
        """The server scored ``epoch`` itself as ``own``: a worker whose result differs is
        refused, and not asked to score again before it delivers an update."""
        _, answers = self._disputed.pop(epoch)
        self.refereed += 1
        for worker_id, result in answers.items():
            if results_agree(result, own):
                continue
            self.refused += 1
            session = sessions.get(worker_id)
            log.warning("epoch %d: worker %s's CV result (%d correct, loss %.4g) differs from "
                        "the server's (%d, %.4g); refused", shown_epoch(epoch),
                        session.name if session else worker_id, result.correct, result.loss_sum,
                        own.correct, own.loss_sum)  # fmt: skip
            if session is not None:
                session.cv_refused()

    def _scorers(self, epoch: int) -> set[int]:
        held = {j.worker_id for j in self._jobs.values() if j.epoch == epoch}
        return {w for w in held if w is not None} | set(self._answers.get(epoch, {}))

    def overdue(
        self,
        now: float,
        allowed: Callable[[WorkerSession], float],
        sessions: dict[int, WorkerSession],
    ) -> list[tuple[WorkerSession, EvalJob]]:
        """Jobs held longer than ``allowed(worker)`` seconds, taken back (returned with the
        worker that sat on them) for a worker ``assign`` will give them to: a proven one
        not held from scoring, not barred from the job, one per job; the holder is barred
        from it. Before, a job went back to its holder when it was the only one, or the
        others were newcomers: an emulated board under --verify-cv was asked the same job
        27 times in 4 epochs (a review). A job nobody else should take stays with its
        holder until ``SELF_SCORE_FACTOR`` deadlines have passed; then it is taken back
        all the same, and, nobody left to ask, the server scores it itself
        (``refused_everywhere``): a scorer that never answers held a newbob run."""
        overrun = []  # (job, its holder, how many of its deadlines it has waited)
        for job in sorted(self._jobs.values(), key=lambda j: j.assigned_at):
            session = sessions.get(job.worker_id) if job.worker_id is not None else None
            if session is not None and now - job.assigned_at > (limit := allowed(session)):
                overrun.append((job, session, (now - job.assigned_at) / limit))
        holders = {session.worker_id for _, session, _ in overrun}  # late: no takers
        takers = {w for w, s in sessions.items()
                  if s.proven and not s.scoring_held and w not in holders}  # fmt: skip
        late: list[tuple[WorkerSession, EvalJob]] = []
        for job, session, deadlines in overrun:
            free = takers - self._scorers(job.epoch) - job.barred
            if free:
                takers.discard(min(free))  # (assign picks among them: one fewer for the rest)
            elif deadlines <= SELF_SCORE_FACTOR:
                continue
            job.taken_from.add(session.worker_id)
            job.worker_id = None
            late.append((session, job))
        return late
