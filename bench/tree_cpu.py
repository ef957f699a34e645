"""CPU seconds used so far by a process and all its descendants (Linux ``/proc``).

On a machine other people's work keeps busy, wall-clock times swing with their load; the
CPU seconds a run needs swing much less. A run's processes' CPU up to a moment (an epoch
line) is the sum over the live tree of each process's own time plus that of its children
it has already reaped (``cutime``/``cstime``), so workers that exited are counted too.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile, or no /proc
        return None
    return text.rpartition(")")[2].split()  # after the command name, which may hold spaces


def own_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` itself so far (None: gone, or no /proc)."""
    fields = _stat_fields(pid)
    # fields[11:13]: utime, stime (stat(5) fields 14-15)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and every descendant so far (None without /proc)."""
    if _stat_fields(root) is None:
        return None
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        fields = _stat_fields(pid)
        if fields is None:
            continue
        # fields[11:15]: utime, stime, cutime, cstime (stat(5) fields 14-17)
        total += sum(int(value) for value in fields[11:15])
        pending += _children(pid)
    return total / TICKS
