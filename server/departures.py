"""``Departures``: workers that left, remembered within a bound.

A server runs for days while workers come and go (preemptible machines, restarts, or a
peer that connects and leaves on purpose: 50,000 churned handshakes grew a server to
412 MB and /status to 37.7 MB, issue 12). So the last ``DEPARTED_KEPT`` departed workers
keep their full row in /status, and every departed worker, kept or not, is folded into
totals: how many left and why, what they delivered, and their compression ledger's sums.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from .session import WorkerSession

DEPARTED_KEPT = 64  # full rows of the most recent departures in /status
REASONS_KEPT = 16  # distinct departure reasons counted by name (the rest as "other")


class Departures:
    """The most recent departed workers in full, all of them summed."""

    def __init__(self, kept: int = DEPARTED_KEPT) -> None:
        self.recent: deque[WorkerSession] = deque(maxlen=kept)
        self.count = 0
        # what the workers no longer among the recent delivered (while a row is kept, its
        # figures are read from it: an update a worker left queued is applied or refused
        # after it left, and was counted as it stood at its leaving: 7 refusals summed
        # where 1,893 were made, a probe's churned NaN peers; one refused after its row
        # went, 64 departures later, is missed still)
        self._folded: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.compression_sums: Counter[str] = Counter()
        self.codecs: Counter[str] = Counter()

    def add(self, session: WorkerSession) -> None:
        if len(self.recent) == self.recent.maxlen:  # the oldest row goes: its figures stay
            self._folded.update(_delivered(self.recent[0]))
        self.recent.append(session)
        self.count += 1
        reason = session.left_reason.split(":", 1)[0][:40]
        if reason not in self.reasons and len(self.reasons) >= REASONS_KEPT:
            reason = "other"
        self.reasons[reason] += 1
        if session.ledger is not None:
            self.compression_sums.update(session.ledger.totals())
            self.codecs[session.ledger.update_codec] += 1

    def summary(self) -> dict[str, Any]:
        """The totals for /status (the rows of the recent ones are in its workers list)."""
        delivered = Counter(self._folded)
        for session in self.recent:
            delivered.update(_delivered(session))
        return {
            "workers": self.count,
            "rows_kept": len(self.recent),
            "updates": delivered["updates"],
            "updates_rejected": delivered["updates_rejected"],
            "patterns": delivered["patterns"],
            "reasons": dict(self.reasons),
        }


def _delivered(session: WorkerSession) -> dict[str, int]:
    return {"updates": session.updates_sent, "updates_rejected": session.updates_rejected,
            "patterns": session.patterns}  # fmt: skip
