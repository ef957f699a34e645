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
        self.updates = 0
        self.updates_rejected = 0
        self.patterns = 0
        self.reasons: Counter[str] = Counter()
        self.compression_sums: Counter[str] = Counter()
        self.codecs: Counter[str] = Counter()

    def add(self, session: WorkerSession) -> None:
        self.recent.append(session)
        self.count += 1
        self.updates += session.updates_sent
        self.updates_rejected += session.updates_rejected
        self.patterns += session.patterns
        reason = session.left_reason.split(":", 1)[0][:40]
        if reason not in self.reasons and len(self.reasons) >= REASONS_KEPT:
            reason = "other"
        self.reasons[reason] += 1
        if session.ledger is not None:
            self.compression_sums.update(session.ledger.totals())
            self.codecs[session.ledger.update_codec] += 1

    def summary(self) -> dict[str, Any]:
        """The totals for /status (the rows of the recent ones are in its workers list)."""
        return {
            "workers": self.count,
            "rows_kept": len(self.recent),
            "updates": self.updates,
            "updates_rejected": self.updates_rejected,
            "patterns": self.patterns,
            "reasons": dict(self.reasons),
        }
