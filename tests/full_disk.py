"""A real full file system for the system ring's processes: a tmpfs of ``SIZE_PAGES``
pages, mounted in a mount namespace of its own (``unshare --mount``) and filled but for
``free_pages``, so that the kernel answers a write past them with ENOSPC as a full disk
would, half-written files and all (the fast ring's tests patch a write to raise it). The
namespace, and the tmpfs with it, ends with the command: nothing is mounted on the host.
Needs root (CAP_SYS_ADMIN) and util-linux's ``unshare``; a test skips, saying why, where
that cannot be had, as the many-host test does without network namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_process, system_ring_environment

SIZE_PAGES = 16
PAGE = os.sysconf("SC_PAGE_SIZE")
NO_MOUNT = 97  # the wrapper's exit status when the tmpfs cannot be mounted


def run_on_full_disk(
    mountpoint: Path, script: str, free_pages: int = 0, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the shell ``script`` with ``$FULL`` naming a tmpfs at ``mountpoint`` full but
    for ``free_pages`` pages (its filler is ``$FULL/.fill``) and ``$PYTHON`` this test
    run's interpreter, in the system ring's environment; skips the test where no tmpfs
    can be mounted."""
    if shutil.which("unshare") is None:
        pytest.skip("a full file system needs util-linux's unshare")
    if os.geteuid() != 0:
        pytest.skip("a full file system (a tmpfs in a mount namespace) needs root")
    mountpoint.mkdir(parents=True, exist_ok=True)
    wrapper = (
        f'mount -t tmpfs -o size={SIZE_PAGES * PAGE} snet-full "$FULL" || exit {NO_MOUNT}\n'
        f'dd if=/dev/zero of="$FULL/.fill" bs={PAGE} count={SIZE_PAGES - free_pages} '
        "2>/dev/null\n" + script
    )
    env = {**system_ring_environment(), "FULL": str(mountpoint), "PYTHON": sys.executable}
    done = run_process(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", wrapper],
        env=env,
        timeout=timeout,
    )
    if done.returncode == NO_MOUNT:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return done
