"""The demo's worker processes: started, watched while the run goes on, and stopped.

The demo is their only supervisor: a worker that cannot start (a bad setting in its
environment, a crash) or that is killed leaves the server waiting for workers that will
never come, so the demo watches them and stops the run once they cannot train it: when
every one has exited, or when one has exited before all of them had joined (the server
leases nothing until then: ``min_workers`` is all of them, for repeatable runs). They
end with the demo, whatever ends it (cli/lifeline.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from snet.client.config import MAX_PROCESSES
from snet.protocol.errors import ConfigError

from .preloaded_worker import worker_environment
from .progress_bar import EXIT_INTERRUPTED, say
from .stop_signals import EXIT_TERMINATED
from .worker_priority import (
    IDLE_POLICY,
    MIN_SAMPLE_SECONDS,
    PRIORITIES,
    PRIORITY_VARIABLE,
    OthersLoad,
    chosen_priority,
    lower_priority,
    run_when_idle,
)

if TYPE_CHECKING:
    from snet.client.config import WorkerConfig
    from snet.protocol.job import JobSpec
    from snet.server.app import SnetServer

    from .preloaded_worker import PreloadedWorker

WORKER_EXIT_SECONDS = 30.0  # to exit once asked to stop
LEAVE_SECONDS = 5.0  # to leave by themselves once the server has finished
# After Ctrl-C, which a terminal sends to the workers too (they share the demo's process
# group): time to leave on that signal before they are sent SIGTERM, which a worker that
# is already stopping takes as a second signal ("exit now", status 1). A worker leaves
# in well under a second; a SIGINT sent to the demo alone costs this wait.
INTERRUPT_LEAVE_SECONDS = 3.0
WATCH_SECONDS = 0.1  # how often the demo looks at its worker processes
WORKERS_GONE = "its workers have gone"  # why the demo stopped its server
# BusyHint: others holding this share of the cores this long, with workers on idle cores
BUSY_HINT_SECONDS = 5.0
BUSY_HINT_SHARE = 0.75


class WorkerProcess(Protocol):
    """What the demo uses of a worker process: ``asyncio.subprocess.Process``, or one
    started before its event loop (cli/preloaded_worker.py)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int: ...


def worker_commands(args: argparse.Namespace, address: str) -> list[list[str]]:
    """The command lines (after ``snet``) of the demo's worker processes for the server at
    ``address``: the numpy workers' group, then one per board."""
    # One command forks the numpy workers once it has loaded their code
    # (cli/worker_group.py): N commands would each import and load the compiled step, on
    # the same cores, at once.
    commands = [["worker", "--name", "demo-worker", "--processes", str(args.workers)]]
    commands = commands if args.workers else []
    # the scale only when given: else the boards read SNET_SPERT_TIME_SCALE (a --time-scale
    # of 1 always given left it unread, and a bad one unchecked)
    scale = [] if args.spert_time_scale is None else ["--time-scale", str(args.spert_time_scale)]
    commands += [["spert", "--name", f"demo-spert-{i + 1}", *scale] for i in range(args.spert)]
    codec = ["--weights-codec", args.weights_codec] if args.weights_codec else []
    common = ["--server", address, "--log-level", "warning", *codec]
    return [[*command, *common] for command in commands]


def board_time_scale(args: argparse.Namespace) -> float:
    """How much faster than real time the demo's boards run: ``--spert-time-scale`` (no
    default of its own: given without ``--spert`` it is refused), else as the boards read
    it (``SNET_SPERT_TIME_SCALE``, else 1); ``ConfigError`` for a bad one."""
    from snet.client.spert.config import BoardConfig

    if args.spert_time_scale is None:
        from .parser import parse_command
        from .settings import ConfigFile
        from .spert import board_config

        return board_config(parse_command(["spert", "--server", "127.0.0.1:1"]),
                            ConfigFile()).time_scale  # fmt: skip
    try:
        return BoardConfig(time_scale=float(args.spert_time_scale)).time_scale
    except ConfigError as exc:  # said of the demo's flag, not the board's
        raise ConfigError(str(exc).replace("spert time_scale", "--spert-time-scale")) from None


def check_demo_flags(args: argparse.Namespace) -> None:
    """The demo's own flags; ``ConfigError`` (one line, exit 2) for the first bad one."""
    for flag, count in (("--workers", args.workers), ("--spert", args.spert)):
        # below 0 it was said as "needs at least one worker" while 2 were there by default
        if not 0 <= count <= MAX_PROCESSES:
            raise ConfigError(f"{flag} must be 0 to {MAX_PROCESSES}, got {count}")
    if args.workers + args.spert < 1:
        raise ConfigError("the demo needs at least one worker (--workers, --spert)")
    if args.spert_time_scale is not None and not args.spert:  # it was ignored
        raise ConfigError("--spert-time-scale goes with --spert (the demo's boards)")
    if args.spert:
        board_time_scale(args)  # its bounds, checked (the flag's, or the boards' variable)
    args.worker_priority = str(args.worker_priority).lower()  # any case, as every choice
    if problem := _priority_problem(args):  # its default comes from the environment
        raise ConfigError(f"--worker-priority (or {PRIORITY_VARIABLE}) {problem}")


def _priority_problem(args: argparse.Namespace) -> str:
    if args.worker_priority not in PRIORITIES:
        return f"must be one of {', '.join(PRIORITIES)}, got {args.worker_priority!r}"
    if args.worker_priority == "idle" and not args.workers:  # boards are never idle
        return "idle is for numpy workers, and there are none (--workers 0): boards run at nice +5"
    return ""


def check_worker_settings(args: argparse.Namespace, job: JobSpec) -> str:
    """Build the settings of each of the demo's worker processes as that process will
    (its flags, and the environment it inherits: ``SNET_WORKER_*``, ``SNET_SPERT_*``),
    and check its backend can be made here and that it can take ``job`` (its codecs, its
    frame limit); ``ConfigError`` for the first that fails. Run before the demo starts
    anything: a bad one made every worker exit 2 (or be refused, 4) once the server had
    started and made the out-dir, and the demo then said that running the same command
    again would go on from it. Returns the weights form of the first (the numpy workers',
    if there are any)."""
    from snet.client.backend import check_backend

    from .commands import worker_config
    from .parser import parse_command
    from .settings import ConfigFile
    from .spert import spert_configs

    # The server's port is not known yet: any address stands for it (the flag is what
    # the worker reads, whatever SNET_WORKER_SERVER says).
    forms = []
    for words in worker_commands(args, "127.0.0.1:1"):
        parsed = parse_command(words)
        if parsed.command == "spert":
            config = spert_configs(parsed)[0]
        else:  # the demo gives its workers no --config: the file's [worker] is not read
            config = worker_config(parsed, ConfigFile())
            check_backend(config.backend)
            _check_takes_job(config, job)
        forms.append(config.weights_codec)
    return forms[0]


def _check_takes_job(config: WorkerConfig, job: JobSpec) -> None:
    """What the server's handshake and the worker's welcome would refuse, said now."""
    from snet.client.frame_limit import check_job
    from snet.client.joining import np_unused_codecs
    from snet.protocol.codecs.handshake import worker_capabilities
    from snet.protocol.errors import ConfigError, UnknownCodec
    from snet.protocol.framing import MIB
    from snet.server.policies import make_step_policy

    check_job(job, config.max_frame_mb * MIB)  # as the worker will at its welcome
    if job.mode == "np" and (unused := np_unused_codecs(config.compress, config.weights_codec)):
        # a worker only warns (it learns the mode at its welcome); the demo knows it now
        raise ConfigError(f"the demo's workers: {unused} (their flags and SNET_WORKER_* "
                          "variables); leave them out")  # fmt: skip
    # the codecs as the handshake agrees them, from what the worker will say in its hello
    capabilities = worker_capabilities(config.compress, config.weights_codec)
    try:
        make_step_policy(job).combination.agreed_codecs(capabilities, job.compress)
    except UnknownCodec as exc:
        raise ConfigError(f"the demo's workers cannot take the job: {exc}") from None


class BusyHint:
    """Says once when, with the workers on idle cores (cli/worker_priority.py), other
    processes kept most of the machine's cores busy for ``BUSY_HINT_SECONDS``: the workers
    then crawl (a stranger saw a 1 s epoch take 14), and the policy cannot be left."""

    def __init__(self, idle: bool, load: Callable[[], OthersLoad] = OthersLoad) -> None:
        self._load = load() if idle else None

    def look(self) -> None:
        if self._load is None or self._load.seconds < BUSY_HINT_SECONDS:
            return
        others = self._load.cores(restart=True)  # the next window starts where this ends
        if others is not None and others >= BUSY_HINT_SHARE * (os.cpu_count() or 1):
            self._load = None  # once
            say(f"snet demo: other processes have kept {others:.1f} cores busy for "
                f"{BUSY_HINT_SECONDS:g} s, and its workers run on idle cores (SCHED_IDLE), "
                "which leaves them almost nothing; --worker-priority low gives them "
                "a share")  # fmt: skip


@dataclass
class DemoWorkers:
    """The demo's worker processes: one ``snet worker --processes N`` (forking the numpy
    workers), then one ``snet spert`` per emulated board."""

    processes: list[WorkerProcess]
    workers: int  # how many workers they are (the group counts N)
    group: int | None = None  # the numpy workers' process (its pid), if any
    # the numpy workers': "idle" (SCHED_IDLE) or "low" (nice +5): cli/worker_priority.py
    priority: str = "low"
    terminated: set[int] = field(default_factory=set)  # pids the demo sent SIGTERM

    @classmethod
    async def start(
        cls, args: argparse.Namespace, address: str, preloaded: PreloadedWorker | None = None
    ) -> DemoWorkers:
        """Start the demo's worker processes (numpy workers, then boards) for ``address``,
        at nice +5; the numpy workers in ``preloaded`` if given (which is discarded when
        there are none)."""
        environment = worker_environment()
        commands = worker_commands(args, address)
        processes: list[WorkerProcess] = []
        if preloaded is not None and args.workers:  # the numpy workers' group is first
            processes.append(preloaded.run(commands.pop(0)))
        elif preloaded is not None:
            preloaded.discard()
        for command in commands:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "snet.cli", *command, env=environment
            )
            lower_priority(process.pid)
            processes.append(process)
        group = processes[0].pid if args.workers else None
        return cls(processes, args.workers + args.spert, group)

    async def settle_priority(self, asked: str, load: OthersLoad) -> None:
        """Put the numpy workers on idle cores if ``asked`` (``--worker-priority``) says
        so, ``auto`` once the demo has watched the machine long enough to tell; a refused
        ``idle`` leaves them at nice +5, and says so."""
        if self.group is None:
            return
        if asked == "auto" and load.measurable and IDLE_POLICY is not None:
            await asyncio.sleep(max(MIN_SAMPLE_SECONDS - load.seconds, 0.0))
        if chosen_priority(asked, load) != "idle":
            return
        if run_when_idle(self.group):
            self.priority = "idle"
        elif asked == "idle":
            say("snet demo: the system refused its workers the idle policy (SCHED_IDLE): "
                "they run at nice +5")  # fmt: skip

    def codes(self) -> list[int | None]:
        """Each process's exit code (None: still running)."""
        return [process.returncode for process in self.processes]

    def said_codes(self) -> str:
        """The exit codes as the last line shows them: a process the demo stopped while it
        was still starting is said so (its -15 read as a failure, in a run that exited 0)."""
        by_sigterm = (EXIT_TERMINATED, -signal.SIGTERM)
        said = [
            "stopped while starting"
            if process.returncode in by_sigterm and process.pid in self.terminated
            else str(process.returncode)
            for process in self.processes
        ]
        return f"[{', '.join(said)}]"

    def stopped_cleanly(self, interrupted: bool = False) -> bool:
        """Every process exited 0, or was stopped by the SIGTERM the demo sent it while
        still starting, before it did anything (status 143, cli/stop_signals.py; killed
        by it, before that handler is in), or, when a terminal's Ctrl-C reached them all
        (``interrupted``), was stopped by it while still starting (status 130)."""
        by_sigterm = (EXIT_TERMINATED, -signal.SIGTERM)
        return all(
            process.returncode == 0
            or (process.returncode in by_sigterm and process.pid in self.terminated)
            or (interrupted and process.returncode == EXIT_INTERRUPTED)
            for process in self.processes
        )

    def cannot_train(self, server: SnetServer, all_joined: bool) -> str | None:
        """Why the workers cannot train the run any more, or None while they can:
        every process has exited, or one has before all the workers had joined."""
        codes = self.codes()
        exited = [code for code in codes if code is not None]
        if not exited:
            return None
        if len(exited) == len(codes):
            return (
                f"its worker processes have all exited, with exit codes {exited}, before "
                "training finished"
            )
        coordinator = server.coordinator
        if not all_joined and coordinator.desk.holding_back(len(coordinator.sessions)):
            return (
                f"{len(exited)} of its {len(codes)} worker processes exited, with exit codes "
                f"{exited}, before all {self.workers} workers had joined: training cannot "
                "start"
            )
        return None

    async def watch(self, server: SnetServer) -> None:
        """Until training is finished or the run stopped: stop the run, as SIGTERM does
        (the run is kept), once the workers cannot train it, saying why in one line."""
        coordinator = server.coordinator
        all_joined = False
        busy = BusyHint(self.priority == "idle")
        while not (coordinator.finished.is_set() or server.stopping.is_set()):
            # Seen once, never forgotten: workers may later leave and rejoin (np mode's
            # desk keeps no quorum of its own, so ``holding_back`` alone cannot tell).
            all_joined = all_joined or len(coordinator.sessions) >= self.workers
            busy.look()
            why = self.cannot_train(server, all_joined)
            if why is not None:
                kept = f"the run is kept in {server.config.out_dir}"
                # a worker that refused its settings (2) or was refused the job (4: e.g. a
                # board without the memory the network needs) would do so again
                again = {2, 4} & set(self.codes())
                after = (
                    f"{kept}; the job or a worker's settings must change first (see above)"
                    if again
                    else f"{kept}: the same command goes on from it"
                )
                print(f"snet demo: stopping: {why} ({after})", file=sys.stderr, flush=True)
                server.request_stop(WORKERS_GONE)
                return
            await asyncio.sleep(WATCH_SECONDS)

    async def stop(self, grace: float = 0.0, after_training: bool = False) -> None:
        """Stop the workers once they have had ``grace`` seconds to leave by themselves
        (a finished server sends them home; a terminal's Ctrl-C reached them too), or at
        once. Those still there are asked to stop (SIGTERM, a worker's graceful exit),
        then killed if slow. ``after_training``: say how many had to be stopped (one the
        server had dropped, and which was reconnecting when training ended, would retry
        for minutes)."""
        waits = [asyncio.create_task(process.wait()) for process in self.processes]
        if grace > 0 and waits:
            await asyncio.wait(waits, timeout=grace)
        late = [process for process in self.processes if process.returncode is None]
        for process in late:  # stopped before a word is said: saying it may fail
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
                self.terminated.add(process.pid)
        if late and after_training:
            say(
                f"snet demo: {len(late)} worker process(es) had not left {grace:g} s "
                "after training ended (dropped and reconnecting): stopping them"
            )
        for process, waiting in zip(self.processes, waits, strict=True):
            try:
                await asyncio.wait_for(asyncio.shield(waiting), WORKER_EXIT_SECONDS)
            except TimeoutError:
                process.kill()
                await waiting
