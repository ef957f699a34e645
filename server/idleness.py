"""``IdleWatch``: workers that trained on nothing for a whole epoch, said out loud.

A worker that is connected while an epoch's frames are handed out but is given none of
them (too few chunks for the workers, or always beaten to them) costs a machine and shows
nothing in the accuracy; before, nothing said so. A worker counts for an epoch when it was
connected at the epoch's start, or joined while frames were still waiting; at the epoch's
end each such worker that was leased no frame is counted in its /status row
(``idle_epochs``, every epoch) and reported in the log, sparingly: at its 1st, 2nd, 4th,
8th, ... idle epoch (a worker that never trains had a warning every epoch, hundreds in one
run, drowning what else was said; the doubling still says now and then that it idles).
State is plain attributes (checkpointable).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from snet.protocol.numbering import shown_epoch

from .session import WorkerSession

log = logging.getLogger("snet.server")


class IdleWatch:
    """Which workers could have been given frames this epoch."""

    def __init__(self) -> None:
        self.eligible: set[int] = set()
        self.idle_worker_epochs = 0  # (worker, epoch) pairs without frames, the whole run

    def start_epoch(self, sessions: Iterable[WorkerSession]) -> None:
        self.eligible = {s.worker_id for s in sessions}

    def joined(self, session: WorkerSession, frames_waiting: bool) -> None:
        if frames_waiting:
            self.eligible.add(session.worker_id)

    def end_epoch(
        self, epoch: int, sessions: Iterable[WorkerSession], granted: dict[int, int]
    ) -> list[WorkerSession]:
        """The eligible workers leased no frame in ``epoch``: logged and counted."""
        idle = [
            s for s in sessions if s.worker_id in self.eligible and not granted.get(s.worker_id)
        ]
        for session in idle:
            session.idle_for_an_epoch()
            self.idle_worker_epochs += 1
            count = session.idle_epochs
            if count & (count - 1):  # logged at powers of two only (module docstring)
                continue
            # one whose leases were taken back is leased nothing until it delivers; one far
            # slower than the others, whose last leases went to them, is expected to be
            why = ("its leases were taken back and it has delivered nothing since"
                   if session.probation else "too few chunks for the workers?")  # fmt: skip
            expected = session.probation and session.handed_over
            level = logging.INFO if expected else logging.WARNING
            if expected:
                why = "far slower than the others, its last leases were handed over to them"
            if count == 1:
                log.log(level, "worker %s trained on no frames in epoch %d (%s); said again "
                        "at its 2nd, 4th, 8th, ... such epoch", session.name,
                        shown_epoch(epoch), why)  # fmt: skip
            else:
                held = f" ({why})" if session.probation else ""
                log.log(level, "worker %s trained on no frames in %d epochs so far, the "
                        "latest epoch %d%s", session.name, count, shown_epoch(epoch),
                        held)  # fmt: skip
        return idle
