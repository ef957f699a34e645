"""How much memory this process can have: one reading for every process that checks.

``snet train``, the server and the worker each check, before allocating it, a network
they could not hold (cli/train.py, server/footprint.py, client/footprint.py): numpy would
otherwise raise ``MemoryError`` part-way, or, with overcommit, the kernel's OOM killer end
the process later (or another process on the machine). Reading ``/proc`` and ``/sys`` is
I/O, which protocol/ must not do, and the server and the worker may not import each
other: so the reading lives here, in the layer both share; what each needs, and the words
of a refusal, are pure (protocol/memory.py's ``MemoryNeed``).

Two figures, for two answers. ``total`` is the most this process could ever have: the
machine's memory, or its container's limit (a cgroup's ``memory.max``, v1's
``limit_in_bytes``) where that is lower, as under the Kubernetes manifests in deploy/,
whose /proc/meminfo shows the whole host's. A need above it can never be met: refused.
``available`` is what can be had now (MemAvailable, and the container's limit less what
it uses): a need above it only may not be met, as other processes may free memory or the
kernel reclaim it, so the daemons warn and go on. Refusing it would make a brief squeeze
at a restart final: the service units do not restart a process that exits for its
configuration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

UNLIMITED = 1 << 60  # a cgroup v1 "limit" this large means none (it prints 2^63 - 4096)


@dataclass(frozen=True)
class HostMemory:
    """This process's memory, in bytes (None: unknown, and no check is made on it)."""

    available: int | None  # what it can have now
    total: int | None  # the most it could ever have
    bounded_by: str = "this machine's memory"  # what ``total`` is, as a refusal says it


def host_memory() -> HostMemory:
    """The machine's memory (Linux's MemTotal and MemAvailable: free memory plus what the
    kernel can reclaim without swapping), within its container's limit if it has one.
    Elsewhere the physical pages (free pages for ``available``: lower, as the page cache
    the kernel would give up is not counted in them)."""
    total, available = _meminfo("MemTotal"), _meminfo("MemAvailable")
    if total is None:
        total = _pages("SC_PHYS_PAGES")
    if available is None:
        available = _pages("SC_AVPHYS_PAGES")
    limit, used = _cgroup_limit()
    if limit is None or (total is not None and limit >= total):
        return HostMemory(available, total)
    headroom = max(limit - (used or 0), 0)
    available = headroom if available is None else min(available, headroom)
    return HostMemory(available, limit, "this container's memory limit")


def available_bytes() -> int | None:
    """What this process can have now (``host_memory().available``)."""
    return host_memory().available


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pages(name: str) -> int | None:
    try:
        return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _cgroup_limit(root: Path = Path("/sys/fs/cgroup")) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, (None, None) when it has no limit
    or none can be read: v2's ``memory.max``/``memory.current``, else v1's
    ``memory.limit_in_bytes``/``memory.usage_in_bytes``, in the process's own cgroup
    (/proc/self/cgroup) or, inside a container's namespace, at the root."""
    v2, v1 = _own_cgroups()
    for directory in dict.fromkeys((root / v2.lstrip("/"), root)):
        limit = _read_number(directory / "memory.max")
        if limit is not None:
            return limit, _read_number(directory / "memory.current")
    for directory in dict.fromkeys((root / "memory" / v1.lstrip("/"), root / "memory")):
        limit = _read_number(directory / "memory.limit_in_bytes")
        if limit is not None:
            return limit, _read_number(directory / "memory.usage_in_bytes")
    return None, None


def _own_cgroups() -> tuple[str, str]:
    """This process's v2 cgroup path and v1 memory cgroup path ("" when not found)."""
    v2 = v1 = ""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _read_number(path: Path) -> int | None:
    """A cgroup file's number; None when missing, unreadable, "max" or a v1 no-limit."""
    try:
        value = int(path.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return value if 0 < value < UNLIMITED else None
