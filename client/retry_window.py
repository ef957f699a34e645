"""``RetryWindow``: how long a worker keeps trying to get back to its server, and how fast.

One deadline, ``retry_seconds`` from the moment the worker started (to reach the server
at all) or the server was lost, across all the reconnections that follow; a handshake
waiting for a silent port's hello does not outlast it (client/joining.py). Joining again
does not renew it: a connection that is accepted, welcomed and dropped at once (a broken
or crash-looping server, a frame this worker refuses) joins every time, and renewing on
a join kept such a worker looping for ever, ten joins a second. A session renews it only
once it has stayed joined for ``STEADY_SECONDS``: then the server was back, and a later
loss is a new outage with a window of its own. The pause between sessions follows the
same rule: 0.1 s after a steady session (a restarted server is found at once), doubling
after each one that was not, up to ``MAX_BACKOFF_SECONDS``, so that such a server is not
hammered either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from snet.protocol.errors import ServerUnreachable
from snet.transport.dial import MAX_BACKOFF_SECONDS

STEADY_SECONDS = 1.0  # joined this long, a session shows the server back
FIRST_PAUSE_SECONDS = 0.1


class RetryWindow:
    """The retry deadline and the pause before the next session (``clock``: monotonic)."""

    def __init__(self, retry_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.retry_seconds = retry_seconds
        self.clock = clock
        self.deadline: float | None = None  # None: the server has not been lost yet
        self.pause = FIRST_PAUSE_SECONDS
        self._joined_at: float | None = None  # when the current session joined
        self._from_start = False  # the deadline is the start's, to reach the server at all

    def start(self) -> None:
        """The worker starts: it has ``retry_seconds`` to reach the server at all (a port
        that accepts and stays silent held each try 30 s: 72 s for a window of 5 s)."""
        if self.deadline is None:
            self.deadline = self.clock() + self.retry_seconds
            self._from_start = True

    def answered(self) -> None:
        """The server said hello: the window opened at the start is done with, and the
        next loss opens one of its own (a worker loading a large corpus longer than the
        window, then lost, would otherwise give up at once)."""
        if self._from_start:
            self.deadline, self._from_start = None, False

    def joined(self) -> None:
        """The current session got past the handshake."""
        self._joined_at = self.clock()

    def session_ended(self) -> None:
        """The session ended without the job done (lost, or a goodbye mid-job): open the
        window if this is a new outage, and set the pause before the next session."""
        now = self.clock()
        steady = self._joined_at is not None and now - self._joined_at >= STEADY_SECONDS
        self._joined_at = None
        if steady or self.deadline is None:
            self.deadline = now + self.retry_seconds
        self.pause = FIRST_PAUSE_SECONDS if steady else min(self.pause * 2, MAX_BACKOFF_SECONDS)

    def expired(self) -> bool:
        """The deadline has passed: give up."""
        return self.deadline is not None and self.clock() >= self.deadline

    def give_up_if_expired(self, where: str, why: Exception) -> None:
        """Raise ``ServerUnreachable`` (``where``: HOST:PORT) once the deadline has passed."""
        if self.expired():
            assert self.deadline is not None
            # the time it tried, not only its window: an attempt begun inside the window
            # ends past it (a port that accepts and never speaks holds one for seconds)
            tried = self.clock() - (self.deadline - self.retry_seconds)
            tried = math.floor(tried * 10 + 1e-9) / 10  # to a tenth, down: not over what it took
            raise ServerUnreachable(
                f"cannot join the server at {where} ({why}); gave up after {tried:.1f} s "
                f"(--retry-seconds {self.retry_seconds:g})"
            )
