"""``snet worker --processes N``: N workers of one machine forked from one loaded process.

A worker spends most of its start-up importing its code and loading the compiled bunch
step (numba, client/fused.py): about 0.45 s of CPU, as much as two epochs of the default
job on one core. N workers started as N commands pay it N times, all at once, on the same
cores. Here one process pays it, then forks the N workers, which inherit the loaded code
(and, with the numpy backend, the backend itself, made before the fork) and start at once.

The parent stays as a small supervisor: it passes SIGTERM on to every worker, and exits
with the worst of their exit codes (0 only when every worker exits 0, or was ended by the
SIGTERM passed on to it while it was still starting). The workers and
the supervisor leave with ``os._exit``, skipping the interpreter's teardown (with numba
loaded, 0.2 s of CPU each, at the end of every run). A terminal's
Ctrl-C reaches the workers directly (they share its process group), so the parent lets
it pass instead of sending a second signal, which a worker takes as "exit now". A worker
whose parent dies is sent SIGTERM (Linux: cli/lifeline.py), so that no worker outlives
its group unseen; one whose parent died before it could ask for that leaves at once.
It needs ``os.fork`` (not on Windows: there, start N commands).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

from snet.client.config import WorkerConfig

if TYPE_CHECKING:
    from snet.client.backend import ComputeBackend


def member_config(config: WorkerConfig, index: int) -> WorkerConfig:
    """The settings of the group's worker ``index`` (from 0): named NAME-(index+1), or
    hostname-pid by default (each forked worker has its own pid)."""
    name = f"{config.name}-{index + 1}" if config.name else ""
    return dataclasses.replace(config, name=name, processes=1)


def run_worker_group(config: WorkerConfig) -> int:
    """Run ``config.processes`` workers (``run_worker_process`` each); the worst exit code."""
    from snet.client.backend import check_backend
    from snet.client.joining import tls_context
    from snet.protocol.errors import ConfigError
    from snet.protocol.heap import settle

    from .commands import run_worker_process

    if config.processes == 1:
        return run_worker_process(config)
    if not hasattr(os, "fork"):
        raise ConfigError("processes > 1 needs os.fork: start one worker command per process")
    # here: a worker that cannot start said so N times (its backend, its TLS files)
    check_backend(config.backend)
    tls_context(config)
    backend = _loaded_backend(config)
    parent = os.getpid()
    children: list[int] = []
    for index in range(config.processes):
        pid = os.fork()
        if pid == 0:  # the child: one worker, then out, never back into the parent's stack
            os._exit(_child(member_config(config, index), backend, parent))
        children.append(pid)
    settle()  # the parent only waits for its workers from here (protocol/heap.py)
    return _supervise(children)


def _loaded_backend(config: WorkerConfig) -> ComputeBackend | None:
    """The numpy backend, made before the fork, or None: other backends are made by each
    worker (torch's thread pools must not cross a fork).

    The compiled step is loaded here too, once for the whole group, before the job is known
    (each worker would otherwise load it for itself once the job says it pays, and it is a
    group's job that is big enough to want several processes); a small job's workers then
    leave it unused (client/kernel_choice.py)."""
    from snet.client.backend import make_backend, torch_available
    from snet.client.kernel_choice import load_kernels
    from snet.client.worker import Worker  # noqa: F401  (imported once, for every worker)

    if config.backend == "numpy" or (config.backend == "auto" and not torch_available()):
        load_kernels()
        return make_backend("numpy", config.threads)
    return None


def _child(config: WorkerConfig, backend: ComputeBackend | None, parent: int) -> int:
    from snet.protocol.errors import ConfigError, DataError

    from .commands import run_worker_process
    from .lifeline import end_with_parent
    from .progress_bar import EXIT_INTERRUPTED
    from .stop_signals import EXIT_TERMINATED

    if not end_with_parent(parent):  # the group's parent died before this worker asked
        return EXIT_TERMINATED  # as that death's SIGTERM would have ended it
    try:
        return run_worker_process(config, backend)
    except (ConfigError, DataError) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before its loop took it over: stopped, said by
        return EXIT_INTERRUPTED  # the group's parent (a traceback of an import, before)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _supervise(children: list[int]) -> NoReturn:
    from .stop_signals import EXIT_TERMINATED, hangup_taken

    forwarded: set[int] = set()

    def forward(signum: int, frame: object) -> None:
        forwarded.add(signum)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):  # that one has exited already
                os.kill(pid, signum)

    for signum in (signal.SIGTERM, *hangup_taken()):  # SIGHUP: a graceful stop, as theirs
        signal.signal(signum, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the workers directly
    worst = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if (code < 0 and -code in forwarded) or (
            code == EXIT_TERMINATED and signal.SIGTERM in forwarded
        ):
            # Ended by the stop passed on to it before it could take it as one (still
            # starting: the early handler's 143, cli/stop_signals.py, or killed by it):
            # stopped as asked, not a failure.
            code = 0
        elif code < 0:  # killed from outside (OOM killer, kill -9): say so, it cannot
            print(f"snet: worker process {pid} was killed by {signal.Signals(-code).name}",
                  file=sys.stderr)  # fmt: skip
        worst = max(worst, code if code >= 0 else 1)  # killed by a signal: a failure
    # Out without the interpreter's teardown, as the workers do: with numba loaded it
    # costs about 0.2 s of CPU, and nothing is left to clean up here.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(worst)
