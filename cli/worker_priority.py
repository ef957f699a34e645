"""How the demo's worker processes share the machine's cores with its server.

Every worker waits for the server's steps (its weights, the settling of its updates), while
the server waits for no one worker: a core the server has to wait for stalls them all. At
the server's own priority, 2 async workers on 2 cores left the cores idle 41-50 % of the
time; 5 below it (``nice -n 5``), 28-37 % (session 19), still about 20 % in an epoch's
steady state (session 21, ``perf sched``). What is left is placement, not priority: the
kernel puts a task woken through a socket beside the one that woke it, and it moves a task
that ran within the last half millisecond to an idle core only reluctantly, so the server
and one worker took turns on one core while the other core idled between the other
worker's bunches.

So on a machine that is otherwise idle the demo runs its numpy workers under Linux's
``SCHED_IDLE`` policy: a core that runs only such tasks counts as free when the server
wakes (it takes that core at once), and they move to whichever core falls idle (they are
never held back as cache-hot). The cores stood idle 3 % of the time, and an epoch took a
tenth less (docs/time-to-accuracy.md, session 21).

The price: such a task runs only when no other task wants the core, and an unprivileged
process cannot leave the policy again (``RLIMIT_NICE``). On a machine other work keeps
busy the workers would crawl, so ``auto`` chooses it only when, over the demo's start (at
least ``MIN_SAMPLE_SECONDS`` of it, from the moment its workers' process was started to
the moment its server is ready), the other processes used less than ``OTHERS_BUSY_LIMIT``
of a core (``/proc/stat``, less the demo's own processes); else (and where there is no
such policy or /proc), and with ``--worker-priority low`` (or
``SNET_DEMO_WORKER_PRIORITY=low``), they run at ``WORKER_NICENESS`` below the server, as
before. Emulated boards always do: their sleeps model their time, and a sleeper woken
late by the policy would model it wrongly.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import NamedTuple

from snet.transport import cpu_time

PRIORITIES = ("auto", "idle", "low")
PRIORITY_VARIABLE = "SNET_DEMO_WORKER_PRIORITY"  # the flag's default, as the tests set it
# How much lower the scheduling priority of the demo's workers and boards is than its
# server's when they do not run under SCHED_IDLE (as ``nice -n 5``).
WORKER_NICENESS = 5
# Cores the machine's other processes may have used since the demo started for ``auto``
# to choose SCHED_IDLE. A quarter of one: an editor, a browser's idle tabs; not a build.
OTHERS_BUSY_LIMIT = 0.25
# The least time ``auto`` watches the machine (the demo's start is about 0.4 s of it): at
# 100 clock ticks a second a quarter of a core is 6 ticks in that time, against one tick
# of rounding for each of the counters read.
MIN_SAMPLE_SECONDS = 0.25


def default_priority() -> str:
    """The flag's default: ``SNET_DEMO_WORKER_PRIORITY``, else ``auto``."""
    return os.environ.get(PRIORITY_VARIABLE) or "auto"


def lower_priority(pid: int) -> None:
    """Give the demo's worker process ``pid`` the priority ``WORKER_NICENESS`` below the
    demo's (raising a process's niceness needs no privilege). Only a speed-up: a process
    that has already exited, or a system that refuses, leaves it as it is."""
    with contextlib.suppress(OSError):
        niceness = os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS
        os.setpriority(os.PRIO_PROCESS, pid, min(niceness, 19))


IDLE_POLICY: int | None = getattr(os, "SCHED_IDLE", None)  # Linux's; None elsewhere


def run_when_idle(pid: int) -> bool:
    """Put process ``pid`` and its descendants, every thread of them, under
    ``SCHED_IDLE`` (what they start later inherits it); False where the system has no
    such policy, refuses it, or ``pid`` has gone, which leaves ``pid`` as it was."""
    policy = IDLE_POLICY
    if policy is None:
        return False
    try:  # the process's main thread first: whatever it starts from now on inherits it
        os.sched_setscheduler(pid, policy, os.sched_param(0))
    except OSError:
        return False
    done = {pid}
    while fresh := set(_threads_below(pid)) - done:  # again, until none is new
        for tid in fresh:
            with contextlib.suppress(OSError):  # ended meanwhile (or refused: left as is)
                os.sched_setscheduler(tid, policy, os.sched_param(0))
        done |= fresh
    return True


def _threads_below(pid: int) -> list[int]:
    """The threads of process ``pid`` and of its descendants."""
    return [tid for process in cpu_time.descendants(pid) for tid in cpu_time.threads(process)]


class _Sample(NamedTuple):
    at: float
    busy: int  # the machine's busy ticks
    ours: int  # this process's and its descendants' ticks

    @classmethod
    def take(cls) -> _Sample | None:
        busy = cpu_time.busy_ticks()
        ours = [cpu_time.process_ticks(pid) for pid in cpu_time.descendants(os.getpid())]
        if busy is None or None in ours:
            return None
        return cls(time.monotonic(), busy, sum(t for t in ours if t is not None))


class OthersLoad:
    """How busy the machine's other processes have kept it since this was made (or
    since the last ``cores()``, with ``restart``): all but this one (the demo) and its
    descendants (its workers, forked or started meanwhile)."""

    def __init__(self) -> None:
        self._start = _Sample.take()

    @property
    def measurable(self) -> bool:
        """The machine could be read (/proc is there)."""
        return self._start is not None

    @property
    def seconds(self) -> float:
        """Since the start of what ``cores()`` will measure."""
        return time.monotonic() - self._start.at if self._start is not None else 0.0

    def cores(self, restart: bool = False) -> float | None:
        """Cores' worth of work the others did since, or None when it cannot be told (no
        /proc, a process gone meanwhile, too short a time); ``restart``: measure from
        here next time."""
        end = _Sample.take()
        start = self._start
        if restart:
            self._start = end
        if start is None or end is None or end.at - start.at < MIN_SAMPLE_SECONDS:
            return None
        ticks = (end.busy - start.busy) - (end.ours - start.ours)
        return max(ticks, 0) / cpu_time.TICKS / (end.at - start.at)


def chosen_priority(priority: str, load: OthersLoad) -> str:
    """``idle`` or ``low`` for the ``--worker-priority`` given (see the module's notes)."""
    if priority != "auto":
        return priority
    if IDLE_POLICY is None:
        return "low"
    others = load.cores()
    return "idle" if others is not None and others < OTHERS_BUSY_LIMIT else "low"
