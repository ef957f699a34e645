"""The benchmarks of a source checkout, run as a child process (``snet bench``,
``snet plan --calibrate``).

``bench/`` is not part of the installed package: the product never imports it. When snet
runs from a checkout (an editable install, or the current directory is one), these
commands start ``python -m bench...`` there with the checkout first on PYTHONPATH;
otherwise they say in one line how to run the benchmarks from a checkout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from snet.protocol.errors import ConfigError

NO_CHECKOUT = (
    "the benchmarks are not installed with snet: in a source checkout run "
    "`python -m bench` (or `make bench`)"
)


def find_checkout() -> Path | None:
    """The checkout this code runs from (an editable install resolves into it), else the
    current directory when it is one; None when neither holds ``bench/``."""
    here = Path(__file__).resolve().parent.parent  # cli/ -> the checkout, if editable
    for candidate in (here, Path.cwd()):
        if (candidate / "bench" / "__main__.py").is_file():
            return candidate
    return None


def bench_process(
    module: str, args: list[str], capture: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module ARGS`` (``bench`` or ``bench.X``) from the checkout."""
    argv, env = _in_checkout(module, args)
    return subprocess.run(argv, env=env, capture_output=capture, text=True, check=False)


def _in_checkout(module: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``python -m module ARGS`` in the checkout."""
    checkout = find_checkout()
    if checkout is None:
        raise ConfigError(NO_CHECKOUT)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(checkout), path)))}
    return [sys.executable, "-m", module, *args], env


def run_bench(args: list[str]) -> int:
    """``snet bench ARGS``: ``python -m bench ARGS`` in the checkout; its exit status. The
    suite runs in a process group of its own, and a SIGTERM or Ctrl-C is passed on to the
    whole group and waited for: the servers and workers a benchmark started stop too (a
    SIGTERM had ended ``snet bench`` alone, the benchmark running on)."""
    from .progress_bar import say
    from .stop_signals import EXIT_TERMINATED, stopped_unhandled

    argv, env = _in_checkout("bench", args)
    forwarded: list[int] = []
    with subprocess.Popen(argv, env=env, process_group=0) as suite:

        def forward(signum: int, frame: object) -> None:
            forwarded.append(signum)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(suite.pid, signum)

        previous = signal.signal(signal.SIGTERM, forward)
        try:
            status = suite.wait()  # resumed after the handler: waits for the group's end
        except KeyboardInterrupt as exc:  # Ctrl-C reached this process alone
            forward(signal.SIGINT, None)
            suite.wait()
            return stopped_unhandled("bench", exc)
        finally:
            signal.signal(signal.SIGTERM, previous)
    if forwarded:
        say("snet bench: stopped by SIGTERM")
        return EXIT_TERMINATED
    return status
