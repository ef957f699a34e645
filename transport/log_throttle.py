"""``LogThrottle``: at most one log line a second for a flood of like events, each line
with the number of them since the last (a flood must not become a flood of log lines).

The worker port's refusals (server/admission.py), failed TLS handshakes
(transport/handshake_failures.py, one throttle a port and reason) and a run of failed
checkpoint writes (server/checkpointer.py, a line a minute, by cause) are said so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

EVERY_SECONDS = 1.0


class LogThrottle:
    """Counts events by key; says when a line is due for one."""

    def __init__(
        self, every_seconds: float = EVERY_SECONDS, clock: Callable[[], float] | None = None
    ) -> None:
        """``clock``: seconds, monotonic (``time.monotonic``, looked up at each event)."""
        self.every_seconds = every_seconds
        self.clock = clock
        self._unlogged: dict[Hashable, int] = {}
        self._logged_at: dict[Hashable, float] = {}

    def due(self, key: Hashable = None) -> int:
        """One more event of ``key``: how many, this one included, the line due now says
        (0: none is due; the event is counted for the next)."""
        count = self._unlogged[key] = self._unlogged.get(key, 0) + 1
        now = (self.clock or time.monotonic)()
        if key in self._logged_at and now - self._logged_at[key] < self.every_seconds:
            return 0
        self._logged_at[key], self._unlogged[key] = now, 0
        return count
