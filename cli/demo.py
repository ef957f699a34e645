"""``snet demo``: a server in this process and N worker processes on 127.0.0.1.

``--spert N`` adds N emulated Spert-II boards (``snet spert``) to the numpy workers.
It trains the default job on the bundled data, prints each epoch's cross-validation
accuracy as it comes, says where the status page is, and exits 0 once training is done
and every worker has left, or once the user has stopped it (SIGTERM, Ctrl-C) and every
worker stopped cleanly. It watches its worker processes (cli/demo_workers.py) and stops
the run, which is kept, once they cannot train it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Container
from typing import TYPE_CHECKING

from snet.protocol.errors import ConfigError, OutputNotWritten
from snet.protocol.job import JobSpec
from snet.protocol.modes import SHARED_BUNCH_MODES, block_length, blocks_said
from snet.protocol.numbering import counted, shown_epoch
from snet.protocol.schedule import stopped_early
from snet.server.config import ServerConfig

from .demo_workers import (
    INTERRUPT_LEAVE_SECONDS,
    LEAVE_SECONDS,
    DemoWorkers,
    board_time_scale,
    check_demo_flags,
    check_worker_settings,
)
from .flags import given_job
from .progress_bar import EXIT_READER_GONE, ProgressBar, bar_text, detach_stdout, say
from .runtime import install_stop_signals, loop_name, run, setup_logging
from .settings import as_given, build_job, read_toml, say_unread_tables
from .worker_priority import WORKER_NICENESS, OthersLoad

if TYPE_CHECKING:
    from snet.server.app import SnetServer

    from .preloaded_worker import PreloadedWorker

READER_GONE = "its output's reader has gone"  # why the demo stopped its server
BAR_SECONDS = 0.2  # how often the progress bar is redrawn


def _print_epochs(
    server: SnetServer, started: float, bar: ProgressBar, printed: set[int],
    untimed: Container[int],
) -> None:  # fmt: skip
    """Print each epoch not in ``printed`` whose cross-validation result is in, with the
    seconds since ``started``, but none for the epochs in ``untimed``: those scored before
    this start (a resumed run's, a finished run's shown again), whose times were not kept."""
    epochs = server.coordinator.job.epochs
    for record in server.coordinator.stats.epochs:
        if record.epoch in printed:
            continue
        row = record.as_dict()
        if row["cv_accuracy"] is None:
            continue
        printed.add(record.epoch)
        when = ""
        if record.epoch not in untimed:
            when = f"  ({time.monotonic() - started:5.1f} s)"
        kept = "" if row["kept"] is not False else "  (rolled back)"  # as snet train says it
        bar.print(
            f"epoch {shown_epoch(record.epoch):>2}/{epochs}  "
            f"lr {row['learning_rate']:<7g} train {100 * (row['train_accuracy'] or 0):6.2f}%  "
            f"CV {100 * row['cv_accuracy']:6.2f}%{kept}{when}"
        )


async def _progress(
    server: SnetServer, started: float, bar: ProgressBar, printed: set[int],
    untimed: Container[int],
) -> None:  # fmt: skip
    """Print each epoch once its cross-validation result is in; on a terminal, a bar.
    If the output's reader goes (``snet demo | head``), or it cannot be written (a full
    disk), the run stops as on SIGTERM."""
    epochs = server.coordinator.job.epochs
    drawn = 0.0
    while True:
        try:
            _print_epochs(server, started, bar, printed, untimed)
            now = time.monotonic()
            if bar.enabled and now - drawn >= BAR_SECONDS:
                drawn = now
                figures = server.meter.figures(server.coordinator, now)
                epoch = shown_epoch(server.coordinator.epoch)
                rate, eta = figures["frames_per_second"], figures["eta_seconds"]
                bar.draw(bar_text(figures["fraction"], epoch, epochs, rate, eta), force=True)
        except (BrokenPipeError, OutputNotWritten) as exc:
            _output_lost(server, exc)
            return
        # an epoch line late by at most this (the benchmarks time them; 50 ms made the
        # demo 25 ms later to a CV target on average): a look costs a few microseconds
        await asyncio.sleep(0.01)


def _output_lost(server: SnetServer, exc: BrokenPipeError | OutputNotWritten) -> bool:
    """Nobody reads the demo's output any more, or it cannot be written (a full disk):
    stop the run, which is kept (SIGTERM's graceful stop: its checkpoint and results
    written), and print nothing more. Whether it was a failure (the exit status is 1)."""
    failed = isinstance(exc, OutputNotWritten)
    why = f"its output cannot be written ({exc})" if failed else READER_GONE
    detach_stdout()
    server.request_stop(why)  # first: the line below may find stderr gone too
    if not server.coordinator.finished.is_set():
        say(
            f"snet demo: stopping: {why} (the run is kept in {server.config.out_dir}: the "
            "same command goes on from it)"
        )
    elif failed:  # trained: its last lines are what is lost
        say(f"snet demo: {why}; the run is trained, its results in {server.config.out_dir}")
    return failed


def _print_start(
    args: argparse.Namespace,
    job: JobSpec,
    weights: str,
    out_dir: str,
    http_port: int,
    already_trained: bool,
    priority: str,
) -> None:
    """The demo's first lines: what it trains, and where its dashboard is."""
    if already_trained:
        print(
            f"snet demo: {out_dir} holds this job's finished run, shown below and not "
            "trained again (add --fresh --force, or give another --out-dir, to train anew)",
            flush=True,
        )
    url = f"http://127.0.0.1:{http_port}"
    boards = (
        f" and {counted(args.spert, 'emulated Spert-II board')} (x{board_time_scale(args):g})"
        if args.spert
        else ""
    )
    blocks = ""
    if job.mode == "bmuf":  # its blocks, as a user would check them
        length = block_length(job.block_bunches, job.block_seconds)
        blocks = f" ({job.block_filter}, {blocks_said(job.block_sync, length, job.block_overlap)})"
    print(
        f"snet demo: {job.mode} mode{blocks}, {counted(args.workers, 'worker')}{boards}, "
        f"network {job.network.describe()}, {counted(job.epochs, 'epoch')}, "
        # np: every worker computes its slice of each whole bunch
        f"bunch {job.bunch_size} {'split by units' if job.mode == 'np' else 'per worker'}, "
        f"updates {job.compress}, "
        # np's workers hold slices of the weights: no whole copies to send any way
        f"{'' if job.mode == 'np' else f'weights {weights}, '}{loop_name()} loop"
        # a finished run shown again: its workers are stopped at once, at no priority
        f"{'' if already_trained else _priority_said(args, priority)}",
        flush=True,
    )
    if not already_trained:  # a finished run's server stops at once: nothing to watch
        print(f"dashboard: {url}/  status: {url}/status  (or: snet status --url {url})")


def _priority_said(args: argparse.Namespace, priority: str) -> str:
    """Who runs at what priority beside the server (cli/worker_priority.py)."""
    nice = f"at nice +{WORKER_NICENESS}"
    if priority == "idle":  # the numpy workers only: boards never are
        return ", workers on idle cores" + (f", boards {nice}" if args.spert else "")
    who = [name for name, count in (("workers", args.workers), ("boards", args.spert)) if count]
    return f", {' and '.join(who)} {nice}"


# The server settings the demo takes from its own flags, as its errors name them.
DEMO_FLAGS = {"http_port": "--http-port", "out_dir": "--out-dir", "fresh": "--fresh",
              "force": "--force"}  # fmt: skip


def divided_size(bunch: int, mode: str, workers: int) -> int:
    """Each worker's bunch in the demo when no bunch size was chosen. Data division as in
    SNet for the modes that sum shares of one global bunch (``SHARED_BUNCH_MODES``): the
    job's bunch split among the workers, 8 at least (docs/convergence.md: 128 per worker
    instead cost 2-3 CV points at N=4). bmuf's workers train on whole bunches
    (docs/bmuf.md), and np's each see every whole bunch."""
    return max(bunch // max(workers, 1), 8) if mode in SHARED_BUNCH_MODES else bunch


def _read_job(args: argparse.Namespace) -> tuple[JobSpec, bool]:
    """The job its flags, environment and [job] table make, its bunch divided among the
    workers unless one of them chose it; and whether it was divided."""
    document = read_toml(args.config)
    say_unread_tables(document, "demo")  # its http_port, min_workers...
    values, where = document.table("job")
    flags = given_job(args)
    chosen = args.bunch_size is not None or "bunch_size" in values
    if chosen or "SNET_JOB_BUNCH_SIZE" in os.environ:
        return build_job(values, flags, where), False
    # Divided before the job is made, so that its checks see the bunch the workers train
    # on (--chunk-frames 100 is enough for bunches of 64); the mode it is divided for, as
    # the job reads it, from a first making with a bunch every other setting allows.
    mode = build_job(values, {**flags, "bunch_size": 1}, where).mode
    workers = args.workers + args.spert
    size = divided_size(JobSpec().bunch_size, mode, workers)
    try:
        return build_job(values, {**flags, "bunch_size": size}, where), True
    except ConfigError as exc:  # a check against a --bunch-size the user never gave
        said = f"each worker's bunch of {size} (the job's {JobSpec().bunch_size} divided among "
        said += f"{counted(workers, 'worker')}; --bunch-size sets it)"
        raise ConfigError(str(exc).replace(f"--bunch-size ({size})", said)) from None


async def _demo(
    args: argparse.Namespace,
    preloaded: PreloadedWorker | None,
    job: JobSpec,
    divided: bool,
    load: OthersLoad,
    weights: str,
) -> int:
    """``weights``: the form the workers take their weights in (the banner says it)."""
    try:
        config = ServerConfig(
            port=0,
            http_port=args.http_port,
            out_dir=args.out_dir,
            fresh=args.fresh,
            force=args.force,
            # the server's variable (its workers are told the same: DemoWorkers.start)
            data_cache=os.environ.get("SNET_DATA_CACHE", ""),
            job=job,
            name="snet-demo",
            log_level="warning",
            min_workers=args.workers + args.spert,  # all start together: repeatable runs
            resumed_linger_seconds=0,  # a completed run's workers are its own, stopped
        )
    except ConfigError as exc:  # its checks name fields: said with the demo's flags
        raise as_given(exc, DEMO_FLAGS) from None
    # Start-up overlaps: the workers start (import, connect) while this process imports
    # the server and loads the data. They connect to a socket that already listens and
    # wait in its backlog until the server takes it over (no refused first attempts).
    listening = socket.create_server(("127.0.0.1", 0))
    started = time.monotonic()
    # The stop signals are taken before the workers start: a SIGTERM while the server is
    # still being made stops it as soon as it is, where it had ended this process at once
    # and left the workers retrying their vanished server for minutes.
    early: list[str] = []
    server: SnetServer | None = None

    def stop(reason: str) -> None:
        if server is None:
            early.append(reason)
        else:
            server.request_stop(reason)

    install_stop_signals(stop, logging.getLogger("snet.demo"))
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    workers = await DemoWorkers.start(args, address, preloaded)
    from snet.server.app import NOT_WRITTEN, SnetServer  # here: while the workers start
    from snet.server.durability import OtherJob

    server = SnetServer(config, listening)
    server.out_lock.holder = "snet demo"  # what another process refused its out-dir is told
    for reason in early:
        server.request_stop(reason)
    try:
        await server.startup()
    except BaseException as exc:
        listening.close()
        await workers.stop()
        if divided and isinstance(exc, OtherJob) and "bunch_size" in exc.differing:
            # the refusal of another job names a setting the user never gave
            raise ConfigError(
                f"{exc} (the demo divides the job's bunch among its workers, so --workers "
                "and --spert change bunch_size; --bunch-size sets it)"
            ) from None
        raise
    finished = server.coordinator.finished
    already_trained = finished.is_set()  # resumed a run that had completed
    # epochs scored before this start (a finished run's, a resumed one's): their times were
    # not kept, and the seconds since this start would pass for them (4.3 s shown as 1.0 s);
    # taken now, before the workers' priority is settled (a wait while they train)
    untimed = {r.epoch for r in server.coordinator.stats.epochs if r.cv_frames}
    unwritten = False  # its lines could not be written (a full disk): exit status 1
    await workers.settle_priority(args.worker_priority, load)  # the banner says which
    try:
        _print_start(args, job, weights, config.out_dir, server.http_port, already_trained,
                     workers.priority)  # fmt: skip
    except (BrokenPipeError, OutputNotWritten) as exc:  # stopped before it trains
        unwritten = _output_lost(server, exc)
    bar = ProgressBar(sys.stdout)  # on a terminal only: plain lines in pipes and logs
    printed: set[int] = set()
    loop = asyncio.get_running_loop()
    progress = loop.create_task(_progress(server, started, bar, printed, untimed))
    watch = loop.create_task(workers.watch(server))
    reason = "stopped"  # what a stop that raised leaves the workers to
    try:
        reason = await server.run_until_stopped()
    finally:
        for chore in (progress, watch):
            chore.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chore
        try:
            _print_epochs(server, started, bar, printed, untimed)  # the last ones, at once
            bar.clear()
        except (BrokenPipeError, OutputNotWritten) as exc:
            unwritten = _output_lost(server, exc)
        # results not written: the workers were told so and wait for a restarted server
        sent_home = finished.is_set() and not reason.startswith(NOT_WRITTEN)
        await workers.stop(*_leave_time(reason, sent_home and not already_trained))
    scored = _final_score(server)
    # workers of a run that had completed were stopped by the demo: nothing to report
    workers_said = (
        "workers stopped: nothing to train"
        if already_trained
        else f"worker process exit codes {workers.said_codes()}"  # one per process
    )
    took = "in an earlier run" if already_trained else f"in {time.monotonic() - started:.1f} s"
    weights = (
        "no weights written"  # said "weights in OUT/weights.npz" of a file not there
        if reason.startswith(NOT_WRITTEN)
        else f"weights in {config.out_dir}/weights.npz"
    )
    stats = server.coordinator.stats  # np's workers send no updates: its bunches are said
    work = f"{stats.steps} bunches" if job.mode == "np" else f"{stats.updates_applied} updates"
    if finished.is_set() and (newbob_ended := stopped_early(job, stats.epochs_done)):
        print(newbob_ended)
    print(f"done ({reason}) {took}: {scored}, {work}, {weights}; {workers_said}", flush=True)
    interrupted = reason == "signal SIGINT"
    status = _exit_status(reason, already_trained or workers.stopped_cleanly(interrupted))
    return 1 if unwritten else status


def _final_score(server: SnetServer) -> str:
    """The CV accuracy of weights.npz (newbob rolls back), or of the newest weights scored
    when those written trained on since (a run stopped mid-epoch: 90.27 % was said of
    weights that scored 91.34 %)."""
    coordinator = server.coordinator
    record = coordinator.stats.weights_cv_record()
    if record is None:  # 0.00% would read as a score: a run stopped before its first has none
        return "no epoch was scored"
    final = f"{100 * float(record.as_dict()['cv_accuracy']):.2f}%"
    if coordinator.stats.scored_version in (None, coordinator.version):
        return f"final CV frame accuracy {final}"
    return (f"CV frame accuracy {final} of epoch {shown_epoch(record.epoch)}'s weights (those "
            "written trained on since: not scored)")  # fmt: skip


def _leave_time(reason: str, trained: bool) -> tuple[float, bool]:
    """How long the workers may take to leave by themselves before the demo stops them,
    and whether that is after training (``DemoWorkers.stop``'s arguments). A finished
    server sends them home; a terminal's Ctrl-C reached them too; stopped otherwise,
    they would wait for the server to come back, and the workers of a run that had
    completed before this start may not have joined to be sent home."""
    if trained:
        return LEAVE_SECONDS, True
    if reason == "signal SIGINT":
        return INTERRUPT_LEAVE_SECONDS, False
    return 0.0, False


def _exit_status(reason: str, workers_ok: bool) -> int:
    """The demo's exit status, as ``snet server``'s where they meet: 0 trained, or stopped
    by the user (SIGTERM, Ctrl-C) with every worker stopped cleanly; 141 its output's
    reader gone; 1 otherwise (its workers gone before the end, or one that failed, or
    its output that could not be written)."""
    if reason == READER_GONE:
        return EXIT_READER_GONE
    by_user = reason.startswith("signal ")
    return 0 if (reason == "trained" or by_user) and workers_ok else 1


def run_demo(args: argparse.Namespace, preloaded: PreloadedWorker | None = None) -> int:
    """Run the demo; its exit status (``_exit_status``), or 2 for a bad flag or a bad
    setting of its workers, found before anything starts (raised as ``ConfigError`` to
    ``main`` or said here). ``preloaded``: the process to run its numpy workers in
    (cli/preloaded_worker.py), else one is started for them."""
    from snet.protocol.codecs.weights import canonical_weights_form

    # The workers' flag, checked as they check it (a bad one made each of them exit 2);
    # without it, theirs: SNET_WORKER_WEIGHTS_CODEC, else the server's weights board
    if args.weights_codec is not None:
        args.weights_codec = canonical_weights_form(args.weights_codec)
    check_demo_flags(args)
    # the machine's other work since the demo started (its workers' process with it)
    load = preloaded.load if preloaded is not None else OthersLoad()
    job, divided = _read_job(args)
    weights = check_worker_settings(args, job)  # as they will read them, environment and all
    setup_logging("warning")
    return run(_demo(args, preloaded, job, divided, load, weights))
