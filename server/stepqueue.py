"""``StepQueue``: the updates waiting for a step, the step running, and the moments between.

The coordinator queues each accepted update here; its policy chooses which queued
updates make the next step (``start``), and the step runs as a task of its own:
``StepRunner`` applies it in the step thread, the coordinator publishes the outcome, and
every pooled element of the step is released here, its one release point. One step runs
at a time.

Between two steps (never while one runs: the step thread writes the velocity and the
norm bounds) the parts' states agree with each other: the moment for a consistent
checkpoint. ``offer`` hands each such moment to ``on_between_steps`` (server/checkpointer.py),
with ``boundary`` true after an epoch end or a CV decision; one that comes during a step
is deferred to the step's end.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Container, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from snet.protocol.staleness import StalenessSetting

from .policies import PendingView, QueueView, WorkerView
from .stepping import PendingUpdate, StepOutcome, StepRunner

if TYPE_CHECKING:
    from .session import WorkerSession

log = logging.getLogger("snet.server")

Groups = list[list[PendingUpdate]]


class StepQueue:
    """Queued updates and the one step that runs at a time."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner
        self._queued: deque[PendingUpdate] = deque()
        self._running = False
        self.started = 0  # steps started by this server (not restored: a restart's are new)
        self._in_step: set[int] = set()  # workers with an update in the running step
        self._task: asyncio.Task[None] | None = None
        self._boundary = False  # an epoch ended or a CV decision came during a step
        # Called between steps (True after an epoch end or a CV decision): the moments a
        # consistent checkpoint can be taken.
        self.on_between_steps: Callable[[bool], None] | None = None
        self.broken = False  # a step failed half-way: the state must not be checkpointed
        self.failure = ""  # why, once broken

    def call_between_steps(self, callback: Callable[[bool], None]) -> None:
        """Have ``callback`` called between steps (``offer``)."""
        self.on_between_steps = callback

    def __len__(self) -> int:
        return len(self._queued)

    def append(self, pending: PendingUpdate) -> None:
        self._queued.append(pending)

    def queued(self) -> tuple[PendingUpdate, ...]:
        """Updates accepted and not yet in a step (for a checkpoint: not in the weights)."""
        return tuple(self._queued)

    def view(
        self,
        sessions: Iterable[WorkerSession],
        holders: Container[int],
        late: Callable[[WorkerSession], bool],
        version: int,
    ) -> QueueView:
        """The queue and the workers as the mode's policy sees them (``holders``: the
        workers holding frames no update has come for, ``LeaseBook.holders``)."""
        pending = tuple(PendingView(p.session.worker_id, p.message.base_version)
                        for p in self._queued)  # fmt: skip
        workers = tuple(
            WorkerView(
                s.worker_id,
                s.worker_id in holders,
                late(s),
                s.proven,
                joined_late=s.joined_late,
            )
            for s in sessions
        )
        return QueueView(pending, workers, version)

    def remove(self, indices: set[int]) -> list[tuple[int, PendingUpdate]]:
        """Take the queued updates at ``indices`` out (a refusal before their step); their
        pooled elements are released."""
        queued = list(self._queued)
        self._queued = deque(p for index, p in enumerate(queued) if index not in indices)
        removed = [(index, queued[index]) for index in sorted(indices)]
        _free(pending for _, pending in removed)
        return removed

    def pending_workers(self) -> set[int]:
        """Workers with an update queued or in the running step (they wait on the server)."""
        return {p.session.worker_id for p in self._queued} | self._in_step

    @property
    def running(self) -> bool:
        """A step is running (``not between_steps``)."""
        return self._running

    @property
    def between_steps(self) -> bool:
        """No step is running: the parts' states agree with each other."""
        return not self._running

    def start(
        self, chosen: list[list[int]], step: Callable[[Groups], Coroutine[Any, Any, None]]
    ) -> None:
        """Take the ``chosen`` queued updates (groups of indices into ``queued()``, one
        group per consecutive step) out of the queue and run ``step`` on them as a task."""
        queued = list(self._queued)
        taken = {index for group in chosen for index in group}
        groups = [[queued[index] for index in group] for group in chosen]
        self._queued = deque(p for index, p in enumerate(queued) if index not in taken)
        self._running = True
        self.started += 1
        self._in_step = {p.session.worker_id for group in groups for p in group}
        self._task = asyncio.get_running_loop().create_task(step(groups))

    async def run(
        self,
        groups: Groups,
        rate: float,
        publish: Callable[[StepOutcome, float], None],
        version: int = 0,
        setting: StalenessSetting | None = None,
    ) -> bool:
        """Apply ``groups`` at ``rate`` (from weights ``version``, under the staleness
        ``setting``) and ``publish`` the outcome; False if that failed (``failure`` says
        why), after which no checkpoint is taken."""
        try:
            outcome = await self.runner.run(groups, rate, version, setting)
            publish(outcome, rate)
        except Exception as exc:
            # A bug, never a peer's doing (sending to a peer cannot raise). Training
            # cannot go on from a half-published step: say so loudly and stop the
            # server, rather than freeze silently while /status looks healthy.
            log.critical("the step machinery failed; stopping", exc_info=True)
            self.broken, self.failure = True, f"step failed: {exc!r}"
            return False
        finally:
            _free(pending for group in groups for pending in group)
            self._running = False
            self._in_step = set()
        self.offer(False)
        return True

    def offer(self, boundary: bool) -> None:
        """Offer the moment for a checkpoint (deferred to the step's end if one runs)."""
        if self._running:
            self._boundary = self._boundary or boundary
            return
        boundary, self._boundary = boundary or self._boundary, False
        if self.on_between_steps is not None:
            self.on_between_steps(boundary)

    def mark_boundary(self) -> None:
        """An epoch ended during the running step: its end offers a forced checkpoint."""
        self._boundary = True

    async def settle(self) -> None:
        """Wait for the running step, if any, to be published (at shutdown)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.shield(task)


def _free(updates: Iterable[PendingUpdate]) -> None:
    """The one release point of a queued update's element: after its step, whatever
    happened in it, or when a refusal takes it out of the queue before its step."""
    for pending in updates:
        if pending.element is not None:
            pending.element.release()
