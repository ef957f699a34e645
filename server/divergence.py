"""``DivergenceWatch``: tells a run that has stopped moving, its every update refused.

A job whose learning rate is too high grows its weights until every gradient is huge, NaN
or infinite. The server refuses each such update (server/plausible.py, the step's check
for non-finite values), which changes nothing: the frames go back to the queue, the
workers compute the same gradients on the same weights, and the run went on refusing for
ever (12,646 refusals in a few minutes, an ETA still shown), saying nothing but the
refusals themselves. So once no update has been applied while every live worker has had
``PER_WORKER`` of its own refused, and ``MIN_REFUSED`` in all, the run is said to have
diverged and is stopped (server/app.py: exit status 1, the checkpoints kept).

Only refusals for an update's numbers count (not finite, or beyond the plausible: the
step's checks and the intake's of its loss and counts), not those for whom or when it was
sent (a lease it does not hold, a stale version, a pool share taken): a lone peer naming
unknown leases stopped a fresh run as "diverged" in 0.4 s. And every live worker must
have had its own refused, counted since the last applied update and among the workers
there now (a departed one's count goes with it): a peer sending garbage is refused as
fast as it sends, but an honest worker's next update is applied and starts the count
over, so no one peer can stop a run that others are training. A run with one worker, all
of whose updates are refused for their numbers, trains nothing either way.

np mode is the exception (server/slice_rounds.py): every bunch needs the partial outputs
of every slice holder, so one holder's non-finite answer (its slice has overflowed) stops
every bunch; refused, it left the bunch waiting until the holder was dropped as late, its
units were cut anew, it joined again, and so on for ever, the run still ``training``. So
there the first non-finite answer says the run has diverged (np trusts its holders with
part of the network in any case: docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from snet.protocol.errors import DIVERGED_AFTER

if TYPE_CHECKING:
    from .session import WorkerSession

log = logging.getLogger("snet.server")

MIN_REFUSED = DIVERGED_AFTER  # refused updates in a row, none applied (protocol/errors.py)
PER_WORKER = 3  # of them from each live worker at least


class DivergenceWatch:
    """Refused updates since the last applied one, by worker."""

    def __init__(
        self, live: Iterable[int], min_refused: int = MIN_REFUSED, per_worker: int = PER_WORKER
    ) -> None:
        self.live = live  # the ids of the workers training now (a live view, read only)
        self.min_refused = min_refused
        self.per_worker = per_worker
        self.refused: dict[int, int] = {}  # worker id -> its updates refused in a row
        self.names: dict[int, str] = {}  # worker id -> who it is, as the verdict names it
        self.diverged = ""  # why, once said (it is said once)

    def applied(self) -> None:
        """An update was applied: the count starts over."""
        self.refused.clear()
        self.names.clear()

    def refuse(self, session: WorkerSession, reason: str, version: int) -> str | None:
        """An update of ``session`` was refused for its numbers (``reason``), the weights
        being of ``version``. Why the run has diverged, the first time it has (logged as
        an error), else None."""
        live = set(self.live)
        self.refused = {w: n for w, n in self.refused.items() if w in live}  # gone: forgotten
        self.names = {w: name for w, name in self.names.items() if w in live}
        self.refused[session.worker_id] = self.refused.get(session.worker_id, 0) + 1
        self.names[session.worker_id] = f"{session.name} from {session.address}"
        total = sum(self.refused.values())
        if self.diverged or total < self.min_refused:
            return None
        if any(self.refused.get(worker, 0) < self.per_worker for worker in live):
            return None
        # who they came from: a lone peer sending garbage, not a diverged job, ends a run
        # nobody else trains this way too (its operator can tell, and restart it)
        who = ", ".join(self.names[worker] for worker in sorted(self.refused))
        return self.say(
            f"the last {total} updates, from every worker ({who[:200]}), were refused and none "
            f"applied to version {version} (the last: {reason[:160]})"
        )

    def say(self, what: str) -> str:
        """The run has diverged (``what`` shows it): why, as said once (logged as an error)."""
        if not self.diverged:
            self.diverged = (
                f"training diverged: {what}; a lower learning rate, started over with "
                "--fresh, may train"
            )
            log.error("%s", self.diverged)
        return self.diverged
