"""The demo's numpy workers, started before the demo knows their command line.

A worker group spends its start-up importing numpy and numba and loading the compiled
bunch step (cli/worker_group.py): about 0.8 s of one core. The demo could start it only
once it had imported its own code, parsed its flags, checked its workers' settings and
opened the server's socket, another 0.35 s, while the machine's second core had nothing
to do; its server then waited some 0.8 s for workers still loading. So the demo starts,
first thing, a process that loads what a worker needs and then waits for its command
line (as multiprocessing's fork server and Android's zygote do): one line of JSON on
its standard input, which it then runs as ``snet worker`` would. A demo that stops
before it has a command for it (a bad flag, no numpy workers) kills it: it has done
nothing but load code. None is started for ``--help``.

Run as ``python -m snet.cli.preloaded_worker``; the demo's side is ``PreloadedWorker``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import NoReturn

from .blas import early_blas_limit
from .lifeline import supervised_environment

MODULE = "snet.cli.preloaded_worker"
POLL_SECONDS = 0.02  # how often a wait looks whether the process has exited
MAX_COMMAND_BYTES = 1 << 20  # a command line is a few hundred bytes


class StartedProcess:
    """A process started with ``subprocess`` (before the demo's event loop ran), seen
    through ``asyncio.subprocess.Process``'s methods, as the demo watches its others."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status, or None while it runs (reaped here once it has exited)."""
        return self._process.poll()

    def terminate(self) -> None:
        self._process.terminate()  # nothing is sent to a process already reaped

    def kill(self) -> None:
        self._process.kill()

    async def wait(self) -> int:
        """Its exit status, once it has exited."""
        import asyncio  # here: the demo starts this process before it imports asyncio

        while (code := self._process.poll()) is None:
            await asyncio.sleep(POLL_SECONDS)
        return code


def worker_environment() -> dict[str, str]:
    """The environment of the demo's worker processes."""
    # Each ends when the demo dies, however it dies (kill -9, the OOM killer): it would
    # retry the server that died with the demo for minutes (cli/lifeline.py).
    environment = supervised_environment()
    # One data cache for the demo's processes: SNET_DATA_CACHE is the server's variable,
    # and the workers' own (SNET_WORKER_DATA_CACHE) follows it unless set.
    if "SNET_DATA_CACHE" in environment:
        environment.setdefault("SNET_WORKER_DATA_CACHE", environment["SNET_DATA_CACHE"])
    return environment


class PreloadedWorker:
    """The demo's side: a process loading a worker's code, to be given its command."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        from .worker_priority import OthersLoad

        self._process = process
        self._given = False
        # the machine's other work from here on, for the workers' priority
        self.load = OthersLoad()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The process itself (its pid, its exit status)."""
        return self._process

    @classmethod
    def start(cls, environment: dict[str, str]) -> PreloadedWorker:
        """Start loading, in ``environment`` (the one its command is to run in)."""
        from .worker_priority import lower_priority

        command = [sys.executable, "-m", MODULE]
        # Started with Ctrl-C blocked (a mask survives exec), until it ignores it: one in
        # its first imports was a traceback. Here, one that comes meanwhile waits, not lost.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, env=environment)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        lower_priority(process.pid)  # the demo's workers' priority, from their start
        return cls(process)

    def run(self, words: list[str]) -> StartedProcess:
        """Have it run ``snet WORDS`` (once it has loaded); the process, to be watched."""
        assert self._process.stdin is not None and not self._given
        self._given = True
        # It may have exited already (a terminal's Ctrl-C reached it while it loaded): its
        # exit status says so to the demo, which watches it from now on.
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.write(json.dumps(words).encode() + b"\n")
            self._process.stdin.close()
        return StartedProcess(self._process)

    def discard(self) -> None:
        """Unless it was given a command: end it, which loses nothing, and reap it."""
        if self._given:
            return
        self._given = True  # and discarded: never given one now
        self._process.kill()
        self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()  # nothing was written to it: nothing to flush


def _preload() -> None:
    """Load what ``snet worker`` will: its code, and the compiled step when its backend
    is to be numpy (with torch installed, ``auto`` is torch, which loads its own)."""
    early_blas_limit(["worker"])  # before numpy is imported: the demo gives no --threads
    from snet.client.backend import torch_available
    from snet.client.kernel_choice import load_kernels

    from . import commands  # noqa: F401  (the worker's command, and the worker itself)

    if not torch_available():
        # "auto": none with SNET_KERNELS=numpy or without numba. Loaded before the job is
        # known, beside the demo's own start; a job too small for it leaves it unused
        # (client/kernel_choice.py), the demo's default job uses it.
        load_kernels()


def _command() -> list[str] | None:
    """The command line the demo sends, or None when it closed the pipe without one."""
    line = sys.stdin.buffer.readline(MAX_COMMAND_BYTES)
    if not line:
        return None
    words = json.loads(line)
    if not (isinstance(words, list) and all(isinstance(word, str) for word in words)):
        raise ValueError(f"a command line is a list of words, not {line[:100]!r}")
    return words


def entry() -> NoReturn:
    """``python -m snet.cli.preloaded_worker``: load, read the command line, run it."""
    # Until it has a command, a terminal's Ctrl-C (sent to the demo's whole process group)
    # is the demo's to act on: it kills this process if it has not given it one yet, and
    # once it has, the command takes the signal as a worker does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # as the demo started it
    from snet.protocol.heap import start_quietly

    from .lifeline import follow_supervisor

    start_quietly()  # no collections while it loads what its workers keep (protocol/heap.py)
    from .main import finish, main
    from .progress_bar import EXIT_INTERRUPTED

    try:
        follow_supervisor()  # first, as every command the demo starts: not to outlive it
        # What fails to load here fails again in the command, which says what it was.
        with contextlib.suppress(Exception):
            _preload()
        words = _command()
    except KeyboardInterrupt:  # one that came before it was ignored: the demo's, as above
        os._exit(EXIT_INTERRUPTED)
    if words is None:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    finish(words, main(words))


if __name__ == "__main__":
    entry()
