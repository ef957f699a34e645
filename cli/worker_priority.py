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
    return [tid for process in _processes_below(pid) for tid in _threads(process)]


def _threads(pid: int) -> list[int]:
    """The threads of process ``pid`` (none once it has ended)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def _processes_below(pid: int) -> list[int]:
    """Process ``pid`` and its living descendants (``/proc``)."""
    found, frontier = [], [pid]
    while frontier:
        process = frontier.pop()
        found.append(process)
        frontier.extend(_children(process))
    return found


def _children(pid: int) -> list[int]:
    """The child processes of ``pid``: from each thread's ``children`` file, or, on a
    kernel without them, from every process's parent in ``/proc/PID/stat``."""
    children: list[int] = []
    for tid in _threads(pid):
        try:
            children += (int(child) for child in _read(f"/proc/{pid}/task/{tid}/children").split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):  # the thread is there, the file not
                return [child for child in _all_processes() if _parent(child) == pid]
        except (OSError, ValueError):  # ended meanwhile
            pass
    return children


def _all_processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        text = _read(f"/proc/{pid}/stat")
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError):
        return None


def _read(path: str) -> str:
    """A /proc file's text (no pathlib: imported before the demo starts its workers)."""
    with open(path) as file:
        return file.read()


def _busy_ticks() -> int | None:
    """Clock ticks every core has spent on work since boot (``/proc/stat``: user, nice,
    system, irq and softirq; not idle, I/O wait or time a hypervisor stole)."""
    try:
        first = _read("/proc/stat").split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in first[1:8])
    except (OSError, ValueError):
        return None
    return user + nice + system + irq + softirq if first[0] == "cpu" else None


def _process_ticks(pid: int) -> int | None:
    """Clock ticks process ``pid`` and its reaped children have run (``/proc/PID/stat``)."""
    try:
        text = _read(f"/proc/{pid}/stat")
        fields = text[text.rindex(")") + 2 :].split()  # after the command's name
        return sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    except (OSError, ValueError):
        return None


class _Sample(NamedTuple):
    at: float
    busy: int
    ours: int

    @classmethod
    def take(cls) -> _Sample | None:
        """The machine's busy ticks, and those of this process and its descendants."""
        busy = _busy_ticks()
        ours = [_process_ticks(pid) for pid in _processes_below(os.getpid())]
        if busy is None or None in ours:
            return None
        return cls(time.monotonic(), busy, sum(t for t in ours if t is not None))


class OthersLoad:
    """How busy the machine's other processes have kept it since this was made: all but
    this one (the demo) and its descendants (its workers, forked or started meanwhile)."""

    def __init__(self) -> None:
        self._start = _Sample.take()

    @property
    def measurable(self) -> bool:
        """The machine could be read when this was made (/proc is there)."""
        return self._start is not None

    @property
    def seconds(self) -> float:
        """Since this was made."""
        return time.monotonic() - self._start.at if self._start is not None else 0.0

    def cores(self) -> float | None:
        """Cores' worth of work the others did since, or None when it cannot be told
        (no /proc, too short a time)."""
        end = _Sample.take()
        if self._start is None or end is None:
            return None
        seconds = end.at - self._start.at
        if seconds < MIN_SAMPLE_SECONDS:
            return None
        ticks = (end.busy - self._start.busy) - (end.ours - self._start.ours)
        return max(ticks, 0) / os.sysconf("SC_CLK_TCK") / seconds


def chosen_priority(priority: str, load: OthersLoad | None) -> str:
    """``idle`` or ``low`` for the ``--worker-priority`` given (see the module's notes)."""
    if priority != "auto":
        return priority
    others = load.cores() if load is not None else None
    return "idle" if others is not None and others < OTHERS_BUSY_LIMIT else "low"
