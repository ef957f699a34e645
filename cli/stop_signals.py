"""What a stop signal means, for every long-running command (one rule, two ways to hear it).

The first SIGTERM or SIGINT asks for a graceful stop; a second one insists: exit now. The
same signal again within ``REPEAT_SECONDS`` of the first is that first request delivered
twice, not a second: GNU ``timeout`` signals its command and then its own process group,
which holds the command, so ``timeout 3600 snet server`` got SIGTERM twice a few
milliseconds apart and exited 1 at once instead of stopping gracefully.

The daemons hear signals on their event loop (cli/runtime.py's ``install_stop_signals``);
``snet train``, which has none, in a plain handler (cli/train.py).
"""

from __future__ import annotations

import time
from enum import Enum

REPEAT_SECONDS = 0.5


class Meaning(Enum):
    STOP = "stop"  # the first: stop gracefully
    REPEAT = "repeat"  # the first again, at once: nothing new
    INSIST = "insist"  # a second: exit now


class StopSignals:
    """The signals received so far, and what the next one means."""

    def __init__(self) -> None:
        self._first: tuple[int, float] | None = None

    def meaning(self, signum: int) -> Meaning:
        now = time.monotonic()
        if self._first is None:
            self._first = (signum, now)
            return Meaning.STOP
        if self._first[0] == signum and now - self._first[1] < REPEAT_SECONDS:
            return Meaning.REPEAT
        return Meaning.INSIST
