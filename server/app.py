"""``SnetServer``: startup, serve, shutdown of the daemon (in the manner of uvicorn).

Startup checks that the job fits this machine's memory (server/footprint.py), locks the
out-dir, reads the data plan, resumes from the out-dir's newest checkpoint of the same job
(server/durability.py), opens the TCP port for workers and the HTTP port for status (both
inside one event loop), and writes the ready file. Serving
ends when the job is trained (after ``linger_seconds``; the results are written as soon
as training completes) or on ``request_stop`` (the command line calls it on the first
SIGTERM/SIGINT: a last checkpoint, workers are told goodbye, the final weights are
written). A resumed server that trained nothing leaves an existing ``weights.npz`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from snet.protocol.conversation import Role
from snet.protocol.errors import ConfigError, ListenError
from snet.protocol.fpu import flush_denormals
from snet.protocol.heap import settle
from snet.protocol.hooks import standard_hooks
from snet.protocol.messages import TRAINING_COMPLETE
from snet.transport.addresses import start_listening
from snet.transport.faults import FaultSwitch
from snet.transport.stream import LINGER_SECONDS

from .admission import Admission, worker_frame_limits
from .checkpoint import CHECKPOINTS_DIR, CheckpointStore
from .checkpointer import Checkpointer
from .config import ServerConfig
from .connection import WorkerConnection
from .connection_set import all_closed, say_goodbye, set_reading, tend_connections
from .dataplan import plan_data
from .durability import job_identity, resume_point
from .export import (
    NORMS_FILE,
    STATUS_FILE,
    WEIGHTS_FILE,
    read_weights,
    score_test_file,
    write_final_files,
)
from .footprint import check_fits_in_memory
from .http import make_app
from .http_guard import HttpListener, RequestErrors
from .job_progress import ProgressMeter
from .lateness import check_progress
from .progress import ProgressWatch
from .resume import TraceFile, resume_from
from .security import over_tls, resolve_token, tls_contexts
from .service import OutDirLock, PidFile, ReadyFile, check_output_files, check_places, notify
from .status import status_document
from .training import Coordinator

log = logging.getLogger("snet.server")
NOT_WRITTEN = "failed: results not written"  # a stop reason: exit status 1

PROGRESS_CHECK_SECONDS = 0.2  # how often late workers are looked for


class SnetServer:
    """One server daemon: a ``Coordinator`` behind a TCP port and an HTTP port."""

    def __init__(self, config: ServerConfig, listen_socket: socket.socket | None = None) -> None:
        """``listen_socket``: a TCP socket already listening, to serve workers on instead
        of binding ``config.host:port`` (``snet demo`` starts its workers before the
        server has loaded anything: they connect to it and wait in its backlog)."""
        self.config = config
        self.listen_socket = listen_socket
        self.state = "starting"
        self.test_result: dict[str, Any] | None = None  # the test file's score, at the end
        self._test_task: asyncio.Task[None] | None = None
        self.counters = Admission.of(config)
        self.meter = ProgressMeter()  # the rate and ETA of /status (server/job_progress.py)
        self.connections: set[WorkerConnection] = set()
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="snet-step", initializer=flush_denormals
        )
        self._tcp: asyncio.Server | None = None
        self._http: web.AppRunner | None = None
        self.http_listener: HttpListener | None = None
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._next_worker_id = 0
        self._trace: TraceFile | None = None
        self.pid_file = PidFile(config.pid_file) if config.pid_file else None
        self.ready_file = ReadyFile(config.ready_file) if config.ready_file else None
        self.out_lock = OutDirLock(config.out_dir)
        self.checkpointer: Checkpointer | None = None
        self.resumed: dict[str, Any] | None = None  # the checkpoint this server resumed from
        self._start_version = 0
        self._written_version: int | None = None  # the version weights.npz was written at
        self._results_task: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()  # set when shutdown begins (ends live HTTP streams)
        self.port = 0
        self.http_port = 0
        self.coordinator: Coordinator

    # ------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        """Claim the pid file, load the data plan, listen on both ports, write the ready file.

        Raises ``ConfigError`` (pid file taken or unwritable, a checkpoint of another job, a
        network larger than all the memory this machine or its container could ever give),
        ``OutDirInUse``, ``DataError`` and ``ListenError`` (a port in use or an address not
        on this machine).
        """
        loop = asyncio.get_running_loop()
        job = self.config.job
        token = resolve_token(self.config)  # before anything else: a refusal costs nothing
        hooks = standard_hooks(self.config.hooks)  # so is a hook that cannot be loaded
        tls, https = tls_contexts(self.config, self.counters.tls)
        outputs = {"ready file": self.config.ready_file, "trace file": self.config.trace_file}
        check_output_files(outputs)
        check_fits_in_memory(job, self.config.pool_size, self.config.min_workers)  # first
        if self.pid_file is not None:
            self.pid_file.claim()
        self.out_lock.acquire()
        results = (WEIGHTS_FILE, STATUS_FILE, NORMS_FILE)  # a run trained, then lost, else
        check_places(self.config.out_dir, results, (CHECKPOINTS_DIR,))
        plan = await loop.run_in_executor(self.executor, plan_data, job, self.config.data_cache)
        checkpoints = Path(self.config.out_dir) / CHECKPOINTS_DIR
        store = CheckpointStore(checkpoints, self.config.checkpoint_keep, self.out_lock.gone)
        identity = job_identity(job.to_dict(), plan.fingerprint(), plan.labels)
        loaded = resume_point(self.config, store, identity)
        weights = None
        if self.config.init_weights and loaded is None:
            weights = read_weights(self.config.init_weights, job.network).flat
            log.info("continuing from the weights in %s", self.config.init_weights)
        trace = None
        if self.config.trace_file:
            self._trace = TraceFile(Path(self.config.trace_file), loaded is not None)
            trace = self._trace.write
        self.coordinator = Coordinator(
            job,
            plan,
            self.executor,
            self.config.pool_size,
            trace,
            hooks,
            weights,
            self.config.min_workers,
            ProgressWatch(self.config.stall_seconds, self.config.join_seconds),
            verify_cv=self.config.verify_cv,
            inline_step=self.config.inline_step_seconds,
        )
        if loaded is not None:
            self.resumed = resume_from(self.coordinator, loaded.path, loaded.state)
            try:
                self._next_worker_id = int(loaded.state["server"]["next_worker_id"])
            except (KeyError, ValueError, TypeError) as exc:
                raise ConfigError(f"{loaded.path} cannot be resumed: {exc}; use --fresh") from exc
        self._start_version = self.coordinator.version
        self.checkpointer = Checkpointer(
            store,
            self.coordinator,
            identity,
            lambda: {"next_worker_id": self._next_worker_id},
            self.config.checkpoint_seconds,
            self.config.checkpoint_steps,
        )
        coordinator = self.coordinator
        coordinator.steps.call_between_steps(self.checkpointer.between_steps)
        connections = self.connections
        coordinator.pool.watch(lambda: set_reading(connections, False),
                               lambda: set_reading(connections, True))  # fmt: skip
        coordinator.on_finished, coordinator.on_failure = self._on_trained, self.request_stop
        settle()  # the data plan and the coordinator, before any worker: kept, never walked
        limits = worker_frame_limits(self.config.max_frame_mb, self.coordinator.layout.nbytes)
        faults = FaultSwitch.from_text(self.config.faults, Role.SERVER)
        where = f"{self.config.host}:{self.config.port}"

        def connection() -> asyncio.BaseProtocol:
            return over_tls(
                WorkerConnection(
                    self.coordinator,
                    limits,
                    token,
                    self.config.name,
                    self._new_worker_id,
                    self.counters,
                    self.connections,
                    faults,
                ).stream,
                tls,
            )

        handshake = self.config.handshake_seconds if tls else None
        try:
            # the demo's socket (made before its workers start), or one of its own
            self._tcp = await start_listening(connection, self.config.host, self.config.port,
                                              tls, handshake, self.listen_socket)  # fmt: skip
            self.port = self._tcp.sockets[0].getsockname()[1]
            where = f"{self.config.http_bind_host}:{self.config.http_port} (HTTP)"
            self._http = web.AppRunner(
                make_app(self, token),
                access_log=None,
                shutdown_timeout=5.0,
                keepalive_timeout=self.config.http_header_seconds,  # see http_guard.py
                # a 408's connection is closed after this, not aiohttp's 10 s of reading
                lingering_time=min(LINGER_SECONDS, self.config.http_header_seconds),
                logger=RequestErrors(),
            )
            await self._http.setup()
            self.http_listener = HttpListener.of(self._http, self.config, https)
            self.http_port = await self.http_listener.start(
                self.config.http_bind_host, self.config.http_port
            )
        except OSError as exc:
            raise ListenError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
        if self.state == "starting":  # workers may join while HTTP starts: a resumed run's
            self.state = "training"  # last frames can even complete its training by now
        guard = f"{'TLS' if tls else 'no TLS'}, {'token required' if token else 'no token'}"
        log.info("serving %s (%s mode, network %s, %d training frames) on %s:%d, HTTP on %s:%d"
                 " (%s)", self.config.name, job.mode, job.network.describe(),
                 len(plan.train_frames), self.config.host or "every address", self.port,
                 self.config.http_bind_host or "every address", self.http_port, guard)  # fmt: skip
        if self.coordinator.finished.is_set() and self._results_task is None:
            await self._save_results(True)  # resumed a run that had completed: "trained"
        if self.ready_file is not None:
            self.ready_file.write(self.port, self.http_port)
        notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving on port {self.port}")

    def release(self) -> None:
        """Give back what startup took outside the event loop: ports and the pid file.

        Safe to call whether or not startup finished (after a failed start too)."""
        if self._tcp is not None and self.state == "starting":
            self._tcp.close()
        if self.pid_file is not None:
            self.pid_file.release()
        if self.ready_file is not None:
            self.ready_file.remove()
        self.out_lock.release()

    async def serve(self) -> str:
        """Start, run until trained or stopped, shut down; returns why it stopped."""
        await self.startup()
        return await self.run_until_stopped()

    async def run_until_stopped(self) -> str:
        """After ``startup()``: serve until trained or stopped, then shut down."""
        loop = asyncio.get_running_loop()
        chores = [loop.create_task(self._housekeeping()), loop.create_task(self._watch_progress())]
        if self.checkpointer is not None:
            chores.append(loop.create_task(self.checkpointer.run_timer()))
        try:
            await self._stop.wait()
        finally:
            for chore in chores:
                chore.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await chore
            await self.shutdown(self._stop_reason or "stopped")
        return self._stop_reason

    @property
    def stop_reason(self) -> str:
        """Why the server stops or stopped ("" while it runs): shown in /status."""
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            if self.state == "trained" and reason.startswith("signal "):
                # serving its results (--linger-seconds): a run stopped now ends trained,
                # as it would have without lingering (status.json said "signal SIGTERM" for
                # every finished run of the Kubernetes manifest's --linger-seconds=-1)
                log.info("%s after training: stopping", reason)
                reason = "trained"
            self._stop_reason = reason
            self._stop.set()

    async def shutdown(self, reason: str) -> None:
        """Say goodbye to every worker, stop listening, write the final weights."""
        self.state = "stopping"
        self.stopping.set()
        notify("STOPPING=1")
        self.coordinator.close()
        if self._tcp is not None:
            self._tcp.close()
        if self._results_task is not None:  # the results first: it starts the test scoring
            await self._results_task
        if self._test_task is not None and not self._test_task.done():
            self._test_task.cancel()  # stopped while scoring the test file: not scored
            with contextlib.suppress(asyncio.CancelledError):
                await self._test_task
        finished = self.coordinator.finished.is_set()
        if retried := finished and self._results_failed():  # the 2nd try, before the
            await self._write_results()  # workers hear the end
        ended = finished and not self._results_failed()  # else workers await a restart
        goodbye = TRAINING_COMPLETE if ended else (self._stop_reason or reason)
        say_goodbye(self.connections, goodbye, f"server {reason}")
        if not retried:  # the last checkpoint after the running step, if any
            await self._write_results()
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self._http is not None:
            if self.http_listener is not None:
                self.http_listener.close()
            await self._http.cleanup()
        await all_closed(self.connections, self._tcp)  # each lingered until its worker read it
        if self._trace is not None:
            self._trace.close()
        self.executor.shutdown(wait=True)
        self.state = "stopped"

    def write_final_weights(self) -> Path:
        """Write weights.npz, the norms and status.json (``write_final_files``)."""
        coordinator, out_dir = self.coordinator, Path(self.config.out_dir)
        start = None if self.config.fresh else self._start_version
        path = write_final_files(out_dir, coordinator, status_document(self), start,
                                 self._written_version)  # fmt: skip
        self._written_version = coordinator.version
        return path

    async def _write_results(self) -> Path | None:
        """The last checkpoint and ``write_final_weights``; if they fail (a full disk), the
        server logs why and stops with it (None): else it would wait, and its workers too."""
        if self.out_lock.lost:  # another server's out-dir now: nothing is written there
            return None
        try:
            if self.checkpointer is not None:
                await self.checkpointer.final()
            path = self.write_final_weights()
            if self._results_failed():  # at shutdown, a 2nd try
                self._stop_reason = "trained" if self.coordinator.finished.is_set() else "stopped"
            return path
        except Exception as exc:
            self._stop_reason = f"{NOT_WRITTEN}: {type(exc).__name__}: {exc}"
            log.error("%s", self._stop_reason)  # the reason: exit status 1 (also in shutdown)
            log.debug("the error's traceback", exc_info=True)
            self._stop.set()
            return None

    # ------------------------------------------------------------ helpers

    def _results_failed(self) -> bool:
        return (self._stop_reason or "").startswith(NOT_WRITTEN)

    def _new_worker_id(self) -> int:
        self._next_worker_id += 1
        return self._next_worker_id

    def _on_trained(self) -> None:
        log.info("training complete after %d epochs", self.coordinator.stats.epochs_done)
        self._results_task = asyncio.get_running_loop().create_task(self._save_results())

    async def _save_results(self, finished_before: bool = False) -> None:
        """Training is complete (``finished_before`` this server started): the last
        checkpoint and the results, now (not at exit). Only then are the workers sent
        home: a server killed before its last checkpoint is on disk resumes short of the
        end, and needs them back."""
        path = await self._write_results()
        if path is None:
            return  # stopping: shutdown says goodbye to the workers
        log.info("results in %s", path.parent)
        self.state = "trained"  # as the workers are sent home: /status never shows one trained
        say_goodbye(self.connections, TRAINING_COMPLETE, "server trained")  # any still there
        finishing = self._finish_trained(finished_before)
        self._test_task = asyncio.get_running_loop().create_task(finishing)

    async def _finish_trained(self, finished_before: bool) -> None:
        """Score the job's test file (if any) with the final weights, then linger."""
        if self.coordinator.plan.test is not None:  # into status.json too, unless lost
            out_dir = None if self.out_lock.lost else Path(self.config.out_dir)
            self.test_result = await score_test_file(self.coordinator, self.executor, out_dir)
        linger = self.config.linger_after(finished_before)
        if finished_before and linger != self.config.linger_seconds:
            log.info("the run had completed before this server started: workers that come "
                     "back are told so for %g s", linger)  # fmt: skip
        if linger >= 0:  # negative: serve the results until stopped
            asyncio.get_running_loop().call_later(linger, self.request_stop, "trained")

    async def _housekeeping(self) -> None:
        """Heartbeats to quiet workers; drop workers silent past the timeout."""
        interval = self.config.heartbeat_seconds
        while True:
            await asyncio.sleep(min(interval, 1.0, self.config.handshake_seconds / 2))
            now = time.monotonic()
            self.meter.sample(now, self.coordinator.stats.patterns_applied)
            tend_connections(self.connections, now, self.counters, interval,
                             self.config.worker_timeout_seconds)  # fmt: skip
            if lost := self.out_lock.keep():  # the out-dir removed, and taken by another
                self.request_stop(f"{NOT_WRITTEN}: {lost}")  # the workers wait for a restart

    async def _watch_progress(self) -> None:
        """Deadlines are measured in tens of milliseconds to seconds: look often."""
        while True:
            await asyncio.sleep(PROGRESS_CHECK_SECONDS)
            check_progress(self.coordinator, time.monotonic())
