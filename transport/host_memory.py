"""How much memory this machine can give now: one reading for every process that checks.

``snet train``, the server and the worker each refuse, before allocating it, a network
they could not hold (cli/train.py, server/footprint.py, client/footprint.py): numpy would
otherwise raise ``MemoryError`` part-way, or, with overcommit, the kernel's OOM killer end
the process later (or another process on the machine). Reading ``/proc`` is I/O, which
protocol/ must not do, and the server and the worker may not import each other: so the
reading lives here, in the layer both share; what each needs, and the words of a
refusal, are pure (protocol/memory.py's ``MemoryNeed``).
"""

from __future__ import annotations

import os


def available_bytes() -> int | None:
    """The memory this machine can give now (Linux's MemAvailable: free memory plus what
    the kernel can reclaim without swapping), None when unknown (a check then passes).
    Elsewhere the free physical pages: lower, as the page cache the kernel would give up
    is not counted in them."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
