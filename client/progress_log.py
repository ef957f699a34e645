"""``ProgressLog``: what a worker says about its own progress while it trains.

Every ``progress_seconds`` (a worker's config; 0: never) one INFO line: the updates sent
since the last line and in all, the patterns they covered, the rate in patterns per
second, and how far behind its weights were: the versions between the weights an update
was computed on and the newest this worker had received when it sent the update (the
server's staleness adds what arrives while the update travels and waits). A worker that
sent nothing since the last line says so, with what it waits for. At DEBUG, one line per
update sent. The structured fields go to ``--log-format json`` as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("snet.worker")


@dataclass
class ProgressLog:
    """Counts of updates sent, and the periodic line made of them."""

    every_seconds: float
    since: float  # monotonic time of the last line (or of the start)
    updates: int = 0  # in all, over every connection of this process
    patterns: int = 0
    _updates_then: int = 0
    _patterns_then: int = 0
    _lag_sum: int = 0
    _lag_max: int = 0

    def bunches_answered(self, bunches: int, patterns: int) -> None:
        """np: ``bunches`` of ``patterns`` in all answered (partial outputs): a slice
        holder's updates."""
        self._count(bunches, patterns, 0)

    def _count(self, updates: int, patterns: int, lag: int) -> None:
        self.updates += updates
        self.patterns += patterns
        self._lag_sum += lag
        self._lag_max = max(self._lag_max, lag)

    def update_sent(
        self, lease_id: int, offset: int, patterns: int, base: int, newest: int, seconds: float
    ) -> None:
        """An update went out: ``patterns`` computed on weights ``base`` in ``seconds``,
        when the newest weights received were ``newest``."""
        lag = max(newest - base, 0)
        self._count(1, patterns, lag)
        log.debug(
            "update %d: lease %d at frame %d, %d patterns on weights %d (%d behind), %.1f ms",
            self.updates, lease_id, offset, patterns, base, lag, 1000 * seconds,
        )  # fmt: skip

    def tick(self, now: float) -> None:
        """Log the progress line if ``every_seconds`` have passed since the last one."""
        interval = now - self.since
        if self.every_seconds <= 0 or interval < self.every_seconds:
            return
        updates = self.updates - self._updates_then
        patterns = self.patterns - self._patterns_then
        fields = {
            "updates_sent": self.updates,
            "patterns": self.patterns,
            "patterns_per_second": round(patterns / interval, 1),
            "weights_behind_mean": round(self._lag_sum / updates, 2) if updates else None,
            "weights_behind_max": self._lag_max,
        }
        if updates:
            log.info(
                "progress: %d updates in the last %.0f s (%d in all), %d patterns, %.0f "
                "patterns/s, weights %.2f versions behind on average (max %d)",
                updates, interval, self.updates, patterns, patterns / interval,
                self._lag_sum / updates, self._lag_max, extra=fields,
            )  # fmt: skip
        else:
            log.info(
                "progress: no update in the last %.0f s (%d in all): waiting for frames, "
                "weights or the server", interval, self.updates, extra=fields,
            )  # fmt: skip
        self.since, self._updates_then, self._patterns_then = now, self.updates, self.patterns
        self._lag_sum = self._lag_max = 0
