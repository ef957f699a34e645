"""Short work on the event loop's own thread, long work in a thread of its own.

Both sides hand their arithmetic to a thread: the worker its bunch, the server its step.
A hand-off costs two thread switches, a wake-up of the event loop and the interpreter lock
changing hands twice (tens of microseconds of CPU on an idle machine, several times that
on a busy one) and buys the overlap of receiving with computing. For the default job's
bunch of 64 patterns or its server step over two updates (each well under a millisecond)
the hand-off costs as much as the work, and what arrives meanwhile is used only at the
next bunch or step anyway. So work expected to take less than a limit of CPU is done
inline: the running mean per unit (a bunch; an update of a step pass) times the units
of the piece at hand, so that a backlog of fused steps, many updates in one pass, goes
to the thread even when single updates ran inline.

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
    """Whether the next piece of work runs on the event loop's thread."""

    def __init__(self, limit_seconds: float) -> None:
        """``limit_seconds``: the CPU seconds under which a piece of work is done inline
        (0: never)."""
        self.limit_seconds = limit_seconds
        self._mean: float | None = None  # CPU seconds per unit; None: nothing timed yet

    @property
    def chosen(self) -> bool:
        """A piece of one unit (a bunch) runs inline."""
        return self.chosen_for(1)

    def chosen_for(self, units: int) -> bool:
        """A piece of ``units`` units runs inline (the first pieces go to the thread, and
        are timed)."""
        return self._mean is not None and self._mean * units < self.limit_seconds

    def measured(self, cpu_seconds: float, units: int = 1) -> None:
        """A piece of ``units`` units took ``cpu_seconds`` of its thread's CPU."""
        each = cpu_seconds / max(units, 1)
        self._mean = each if self._mean is None else 0.8 * self._mean + 0.2 * each
