"""Short work on the event loop's own thread, long work in a thread of its own.

Both sides hand their arithmetic to a thread: the worker its bunch, the server its step.
A hand-off costs two thread switches, a wake-up of the event loop and the interpreter lock
changing hands twice (tens of microseconds of CPU on an idle machine, several times that
on a busy one) and buys the overlap of receiving with computing. For the default job's
bunch of 64 patterns or its server step over two updates (each well under a millisecond)
the hand-off costs as much as the work, and what arrives meanwhile is used only at the
next bunch or step anyway. So while the work takes less than a limit (a running mean) it
is done inline, and the event loop waits at most about that long.

The measure is the work's CPU time (``timed``), not its wall time: on a busy machine wall
time counts the moments spent waiting for a core, which had a loaded worker hand every
bunch to its thread (2 ms of wall time for 0.8 ms of CPU), paying the switches exactly
when cores were scarcest: 0.3-0.4 ms of CPU more per update on each side, measured with
``bench/update_cost.py`` while other work held the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def timed(function: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``function(*args)`` and the CPU time the calling thread spent on it."""
    started = time.thread_time()
    result = function(*args)
    return result, time.thread_time() - started


class InlineChoice:
    """Whether the next piece of work runs on the event loop's thread (``chosen``)."""

    def __init__(self, limit_seconds: float) -> None:
        """``limit_seconds``: the running mean of CPU seconds under which work is done
        inline (0: never)."""
        self.limit_seconds = limit_seconds
        self.chosen = False  # the first pieces go to the thread, and are timed
        self._mean: float | None = None

    def measured(self, cpu_seconds: float) -> None:
        """A piece of work took ``cpu_seconds`` of its thread's CPU."""
        mean = cpu_seconds if self._mean is None else 0.8 * self._mean + 0.2 * cpu_seconds
        self._mean = mean
        self.chosen = mean < self.limit_seconds
