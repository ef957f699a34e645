"""What a stop signal means, for every long-running command (one rule, two ways to hear it).

The first SIGTERM or SIGINT asks for a graceful stop; a second one insists: exit now. The
same signal again within ``REPEAT_SECONDS`` of the first is that first request delivered
twice, not a second: GNU ``timeout`` signals its command and then its own process group,
which holds the command, so ``timeout 3600 snet server`` got SIGTERM twice a few
milliseconds apart and exited 1 at once instead of stopping gracefully.

The daemons hear signals on their event loop (cli/runtime.py's ``install_stop_signals``);
``snet train``, which has none, in the handlers of ``raised_on_stop`` below.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

REPEAT_SECONDS = 0.5


class Meaning(Enum):
    STOP = "stop"  # the first: stop gracefully
    REPEAT = "repeat"  # the first again, at once: nothing new
    INSIST = "insist"  # a second: exit now


class StopSignals:
    """The signals received so far, and what the next one means."""

    def __init__(self) -> None:
        self._first: tuple[int, float] | None = None

    def meaning(self, signum: int) -> Meaning:
        now = time.monotonic()
        if self._first is None:
            self._first = (signum, now)
            return Meaning.STOP
        if self._first[0] == signum and now - self._first[1] < REPEAT_SECONDS:
            return Meaning.REPEAT
        return Meaning.INSIST


EXIT_TERMINATED = 128 + signal.SIGTERM  # 143: stopped before the end, as Ctrl-C's 130


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``docker stop``, Slurm, systemd): stopped as Ctrl-C stops."""

    signal_name, exit_status = "SIGTERM", EXIT_TERMINATED


class HungUp(Terminated):
    """SIGHUP (a terminal or SSH session closed): stopped as on SIGTERM (it ended
    ``snet train`` at once, every trained epoch lost)."""

    signal_name, exit_status = "SIGHUP", 128 + signal.SIGHUP


def hangup_taken() -> list[signal.Signals]:
    """[SIGHUP], unless this process started with it ignored (nohup, a shell's background
    job): then it stays so. The daemons, the worker group and ``snet train`` take it as a
    graceful stop (it ended them at once, with no checkpoint and no goodbye)."""
    return [] if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else [signal.SIGHUP]


@contextmanager
def raised_on_stop() -> Iterator[None]:
    """For a command without an event loop: the first SIGINT raises ``KeyboardInterrupt``
    and the first SIGTERM ``Terminated`` in the main thread, the first again at once is
    nothing, and a second exits 1 now, as the daemons do. Without it SIGTERM ended
    ``snet train`` on the spot, with every trained epoch lost."""
    received = StopSignals()

    def stop(signum: int, frame: object) -> None:
        meaning = received.meaning(signum)
        if meaning is Meaning.INSIST:
            print(f"second signal ({signal.Signals(signum).name}): exiting now", file=sys.stderr)
            os._exit(1)
        if meaning is Meaning.STOP:
            raise {signal.SIGTERM: Terminated, signal.SIGHUP: HungUp}.get(
                signal.Signals(signum), KeyboardInterrupt
            )

    # A signal ignored when this process started stays ignored (a background job of a
    # shell, nohup): Python itself leaves SIGINT so.
    stops = (signal.SIGINT, signal.SIGTERM)
    taken = [s for s in stops if signal.getsignal(s) != signal.SIG_IGN] + hangup_taken()
    previous = {signum: signal.signal(signum, stop) for signum in taken}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_at_once_on_sigterm(command: str) -> None:
    """Until ``command`` takes its stop signals over: SIGTERM says so in one line and
    exits 143 at once (nothing is kept yet to save). It ended a server's first 0.35 s
    silently, where Ctrl-C said it was stopped (found by a probe). Not raised as an
    exception, as Ctrl-C's is: one raised from a signal handler can land inside the
    import system's locks and leave them held (a server starting under load hung so, in
    CI). Left alone if SIGTERM is ignored."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        said = f"snet {command}: stopped by SIGTERM\n" if command else "snet: stopped by SIGTERM\n"

        def stopped(signum: int, frame: object) -> None:
            with contextlib.suppress(OSError):
                os.write(2, said.encode())
            os._exit(EXIT_TERMINATED)

        signal.signal(signal.SIGTERM, stopped)


def stopped_unhandled(command: str, interrupt: KeyboardInterrupt) -> int:
    """Say that ``command`` was stopped by a signal it had not taken over yet (Ctrl-C while
    a server, a worker or a group loading the compiled step imports and loads, or in a
    command that never takes it; snet train's SIGTERM before its run), in one line; its
    exit status. It printed a traceback of whatever import it fell in, and exited 1."""
    from .progress_bar import EXIT_INTERRUPTED, say

    who = f"snet {command}" if command else "snet"  # before its command was known
    if isinstance(interrupt, Terminated):
        say(f"{who}: stopped by {interrupt.signal_name}")
        return interrupt.exit_status
    say(f"{who}: stopped by Ctrl-C")
    return EXIT_INTERRUPTED
