"""A process that ends when the process that started it dies, whatever killed that one.

``snet demo`` starts its workers (``snet worker --processes N``, ``snet spert``) as
child processes and is their only supervisor: killed with ``kill -9`` or by the OOM
killer, it cannot stop them, and they would retry its vanished server for
``retry_seconds`` (5 minutes by default), logging to the terminal. So a child asks the
kernel to send it SIGTERM (its graceful stop) when its parent dies: Linux's
``prctl(PR_SET_PDEATHSIG)``, which ``cli/worker_group.py`` uses for its forked workers.

The request is made in the child, first thing in ``main``, and not by the parent
between fork and exec (``preexec_fn``): the demo runs an event loop and numpy's BLAS
threads by then, and Python documents ``preexec_fn`` as unsafe with threads (it also
stops ``subprocess`` from using ``vfork``). The parent names itself in
``SNET_SUPERVISOR_PID``; the child, once its request is made, compares that pid with its
own parent's: a parent that died before the request (the child reparented already)
would never send the signal, so the child leaves at once, as the signal would have made
it. Elsewhere than Linux there is no such request: the child only makes that check, and
a supervisor killed later leaves its children to their own timeouts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from snet.protocol.numbering import is_plain_int

from .stop_signals import EXIT_TERMINATED

SUPERVISOR_VARIABLE = "SNET_SUPERVISOR_PID"  # set by a parent for the snet it starts
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def supervised_environment() -> dict[str, str]:
    """The environment for an ``snet`` command this process starts and must not outlive
    it: this one's, naming this process as its supervisor."""
    return {**os.environ, SUPERVISOR_VARIABLE: str(os.getpid())}


def end_with_parent(parent: int, signum: int = signal.SIGTERM) -> bool:
    """Have ``signum`` sent to this process when its parent dies (Linux); False when the
    parent is not ``parent`` any more (it died first: no signal would ever come)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)
    # After the request, not before: a parent that dies in between is seen either way.
    return os.getppid() == parent


def follow_supervisor() -> None:
    """If a supervisor started this process (``SUPERVISOR_VARIABLE``), end with it; if it
    is gone already, end now, as its death's SIGTERM would have (before any handler)."""
    named = os.environ.pop(SUPERVISOR_VARIABLE, "")  # for this process, not its children
    if not is_plain_int(named):
        return
    if not end_with_parent(int(named)):
        sys.stderr.flush()
        os._exit(EXIT_TERMINATED)  # as killed by it: nobody is left to read a word
