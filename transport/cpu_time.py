"""CPU time from Linux ``/proc``: a process tree's and the whole machine's.

The demo reads it to tell whether other processes keep the machine busy
(cli/worker_priority.py), the benchmarks to count the CPU a run's processes used
(bench/). Reading ``/proc`` is I/O, so it lives here. Everything is in clock ticks
(``TICKS`` a second) or seconds, and every reader answers None (or nothing) where there is
no ``/proc`` or the process has gone meanwhile.
"""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str:
    """A /proc file's text (plain ``open``: the demo reads these before it loads more)."""
    with open(path) as file:
        return file.read()


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command's name (which may hold spaces and brackets):
    fields[1] is the parent, fields[11:15] utime, stime, cutime, cstime (stat(5) 4, 14-17)."""
    try:
        text = _read(f"/proc/{pid}/stat")
    except (OSError, ValueError):
        return None
    return text[text.rindex(")") + 2 :].split()


def process_ticks(pid: int) -> int | None:
    """Ticks process ``pid`` and the children it has reaped have run."""
    fields = _stat_fields(pid)
    return None if fields is None else sum(int(value) for value in fields[11:15])


def own_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` itself so far."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and every living descendant so far, with the children each
    has reaped (so workers that exited count too)."""
    if _stat_fields(root) is None:
        return None
    ticks = (process_ticks(pid) for pid in descendants(root))
    return sum(t for t in ticks if t is not None) / TICKS


def busy_ticks() -> int | None:
    """Ticks every core has spent on work since boot (``/proc/stat``: user, nice,
    system, irq and softirq; not idle, I/O wait or time a hypervisor stole)."""
    try:
        first = _read("/proc/stat").split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in first[1:8])
    except (OSError, ValueError):
        return None
    return user + nice + system + irq + softirq if first[0] == "cpu" else None


def threads(pid: int) -> list[int]:
    """The threads of process ``pid``."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def children(pid: int) -> list[int]:
    """The child processes of ``pid``: from each thread's ``children`` file, or, on a
    kernel without them, from every process's parent."""
    found: list[int] = []
    for tid in threads(pid):
        try:
            found += (int(child) for child in _read(f"/proc/{pid}/task/{tid}/children").split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):  # the thread is there, the file not
                return [child for child in _all_processes() if _parent(child) == pid]
        except (OSError, ValueError):  # ended meanwhile
            pass
    return found


def descendants(pid: int) -> list[int]:
    """Process ``pid`` and its living descendants, ``pid`` first."""
    found, frontier = [], [pid]
    while frontier:
        process = frontier.pop()
        found.append(process)
        frontier.extend(children(process))
    return found


def _all_processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])
