"""``snet demo``: a server in this process and N worker processes on 127.0.0.1.

``--spert N`` adds N emulated Spert-II boards (``snet spert``) to the numpy workers.
It trains the default job on the bundled data, prints each epoch's cross-validation
accuracy as it comes, says where the status page is, and exits 0 once training is done
and every worker has left.
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
from typing import TYPE_CHECKING

from snet.protocol.job import SHARED_BUNCH_MODES, JobSpec
from snet.protocol.numbering import shown_epoch
from snet.server.config import ServerConfig

from .flags import given_job
from .progress_bar import EXIT_READER_GONE, ProgressBar, bar_text, detach_stdout
from .runtime import install_stop_signals, loop_name, run, setup_logging
from .settings import build_job, read_toml

if TYPE_CHECKING:
    from snet.server.app import SnetServer

WORKER_EXIT_SECONDS = 30.0  # to exit once asked to stop
LEAVE_SECONDS = 5.0  # to leave by themselves once the server has finished
READER_GONE = "its output's reader has gone"  # why the demo stopped its server
BAR_SECONDS = 0.2  # how often the progress bar is redrawn


def _print_epochs(server: SnetServer, started: float, bar: ProgressBar, printed: set[int]) -> None:
    """Print each epoch not in ``printed`` whose cross-validation result is in."""
    epochs = server.coordinator.job.epochs
    for record in server.coordinator.stats.epochs:
        row = record.as_dict()
        if row["cv_accuracy"] is None or record.epoch in printed:
            continue
        printed.add(record.epoch)
        bar.print(
            f"epoch {shown_epoch(record.epoch):>2}/{epochs}  "
            f"lr {row['learning_rate']:<7g} train {100 * (row['train_accuracy'] or 0):6.2f}%  "
            f"CV {100 * row['cv_accuracy']:6.2f}%  ({time.monotonic() - started:5.1f} s)"
        )


async def _progress(
    server: SnetServer, started: float, bar: ProgressBar, printed: set[int]
) -> None:
    """Print each epoch once its cross-validation result is in; on a terminal, a bar.
    If the output's reader goes (``snet demo | head``), the run stops as on SIGTERM."""
    epochs = server.coordinator.job.epochs
    drawn = 0.0
    while True:
        try:
            _print_epochs(server, started, bar, printed)
            now = time.monotonic()
            if bar.enabled and now - drawn >= BAR_SECONDS:
                drawn = now
                figures = server.meter.figures(server.coordinator, now)
                epoch = shown_epoch(server.coordinator.epoch)
                rate, eta = figures["frames_per_second"], figures["eta_seconds"]
                bar.draw(bar_text(figures["fraction"], epoch, epochs, rate, eta), force=True)
        except BrokenPipeError:
            _reader_gone(server)
            return
        await asyncio.sleep(0.05)  # an epoch line late by at most this: bench times them


def _reader_gone(server: SnetServer) -> None:
    """Nobody reads the demo's output any more: stop the run, which is kept (SIGTERM's
    graceful stop: its checkpoint and results written), and print nothing more."""
    detach_stdout()
    if not server.coordinator.finished.is_set():
        print(
            f"snet demo: stopping: its output's reader has gone (the run is kept in "
            f"{server.config.out_dir}: the same command goes on from it)",
            file=sys.stderr,
            flush=True,
        )
    server.request_stop(READER_GONE)


def divided_bunch(job: JobSpec, workers: int) -> JobSpec:
    """The demo's job for ``workers`` workers when no bunch size was chosen. Data division
    as in SNet for the modes that sum shares of one global bunch (``SHARED_BUNCH_MODES``):
    the job's bunch split among the workers (docs/convergence.md: 128 per worker instead
    cost 2-3 CV points at N=4). bmuf's workers train on whole bunches (docs/bmuf.md), and
    np's each see every whole bunch."""
    if job.mode not in SHARED_BUNCH_MODES:
        return job
    return job.with_changes(bunch_size=max(job.bunch_size // max(workers, 1), 8))


async def _demo(args: argparse.Namespace) -> int:
    values, where = read_toml(args.config).table("job")
    job = build_job(values, given_job(args), where)
    chosen = args.bunch_size is not None or "bunch_size" in values
    if not (chosen or "SNET_JOB_BUNCH_SIZE" in os.environ):
        job = divided_bunch(job, args.workers + args.spert)
    config = ServerConfig(
        port=0,
        http_port=args.http_port,
        out_dir=args.out_dir,
        job=job,
        name="snet-demo",
        log_level="warning",
        min_workers=args.workers + args.spert,  # all start together: repeatable runs
    )
    # Start-up overlaps: the workers start (import, connect) while this process imports
    # the server and loads the data. They connect to a socket that already listens and
    # wait in its backlog until the server takes it over (no refused first attempts).
    listening = socket.create_server(("127.0.0.1", 0))
    started = time.monotonic()
    workers = await _start_workers(args, f"127.0.0.1:{listening.getsockname()[1]}")
    from snet.server.app import SnetServer  # here: imported while the workers start

    server = SnetServer(config, listening)
    install_stop_signals(server.request_stop, logging.getLogger("snet.demo"))
    try:
        await server.startup()
    except BaseException:
        listening.close()
        await _stop_workers(workers)
        raise
    finished = server.coordinator.finished
    already_trained = finished.is_set()  # resumed a run that had completed
    if already_trained:
        print(
            f"snet demo: {config.out_dir} holds this job's finished run, shown below and not "
            "trained again (remove it, or give another --out-dir, to train anew)",
            flush=True,
        )
    url = f"http://127.0.0.1:{server.http_port}"
    boards = (
        f" and {args.spert} emulated Spert-II boards (x{args.spert_time_scale:g})"
        if args.spert
        else ""
    )
    print(
        f"snet demo: {job.mode} mode, {args.workers} workers{boards}, "
        f"network {job.network.describe()}, "
        f"{job.epochs} epochs, bunch {job.bunch_size} per worker, updates {job.compress}, "
        f"{loop_name()} loop\n"
        f"dashboard: {url}/  status: {url}/status  (or: snet status --url {url})",
        flush=True,
    )
    bar = ProgressBar(sys.stdout)  # on a terminal only: plain lines in pipes and logs
    printed: set[int] = set()
    progress = asyncio.get_running_loop().create_task(_progress(server, started, bar, printed))
    try:
        reason = await server.run_until_stopped()
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
        try:
            _print_epochs(server, started, bar, printed)  # the last epochs, at once
            bar.clear()
        except BrokenPipeError:
            _reader_gone(server)
        # Stopped early, the workers would wait for the server to come back; after a run
        # that had completed before this start they may not have joined to be sent home.
        await _stop_workers(workers, terminate=already_trained or not finished.is_set())
    final = server.coordinator.stats.weights_cv_accuracy()  # of weights.npz (newbob rolls back)
    codes = [p.returncode for p in workers]
    # workers of a run that had completed were stopped by the demo: nothing to report
    workers_said = (
        "workers stopped: nothing to train" if already_trained else f"worker exit codes {codes}"
    )
    print(
        f"done ({reason}) in {time.monotonic() - started:.1f} s: final CV frame accuracy "
        f"{100 * (final or 0):.2f}%, {server.coordinator.stats.updates_applied} updates, "
        f"weights in {config.out_dir}/weights.npz; {workers_said}",
        flush=True,
    )
    if reason == READER_GONE:
        return EXIT_READER_GONE
    workers_ok = already_trained or all(code == 0 for code in codes)  # those: stopped by us
    return 0 if reason == "trained" and workers_ok else 1


async def _start_workers(
    args: argparse.Namespace, address: str
) -> list[asyncio.subprocess.Process]:
    """The demo's worker processes (numpy workers, then emulated boards) for ``address``."""
    # One command forks the numpy workers once it has loaded their code (cli/worker_group.py):
    # N commands would each import and load the compiled step, on the same cores, at once.
    commands = [["worker", "--name", "demo-worker", "--processes", str(args.workers)]]
    commands = commands if args.workers else []
    commands += [
        ["spert", "--name", f"demo-spert-{i + 1}", "--time-scale", str(args.spert_time_scale)]
        for i in range(args.spert)
    ]
    codec = ["--weights-codec", args.weights_codec] if args.weights_codec else []
    return [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "snet.cli", *command, "--server", address,
            "--log-level", "warning", *codec,
        )
        for command in commands
    ]  # fmt: skip


async def _stop_workers(workers: list[asyncio.subprocess.Process], terminate: bool = True) -> None:
    """Stop the workers: at once (``terminate``), or once they have had ``LEAVE_SECONDS``
    to leave by themselves (a finished server sends them home; one it had dropped, and
    which was reconnecting when training ended, would retry for minutes). Those still
    there are asked to stop (SIGTERM, a worker's graceful exit), then killed if slow."""
    if not terminate:
        waits = [asyncio.create_task(process.wait()) for process in workers]
        if waits:
            await asyncio.wait(waits, timeout=LEAVE_SECONDS)
        late = [process for process in workers if process.returncode is None]
        if late:
            print(
                f"snet demo: {len(late)} worker process(es) had not left {LEAVE_SECONDS:g} s "
                "after training ended (dropped and reconnecting): stopping them",
                flush=True,
            )
    for process in workers:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
    for process in workers:
        try:
            await asyncio.wait_for(process.wait(), WORKER_EXIT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()


def run_demo(args: argparse.Namespace) -> int:
    if args.workers < 0 or args.spert < 0 or args.workers + args.spert < 1:
        print("snet: the demo needs at least one worker (--workers, --spert)", file=sys.stderr)
        return 2
    if args.spert_time_scale <= 0:
        print("snet: --spert-time-scale must be > 0", file=sys.stderr)
        return 2
    setup_logging("warning")
    return run(_demo(args))
