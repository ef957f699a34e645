"""``SnetServer``: startup, serve, shutdown of the daemon (in the manner of uvicorn).

Startup reads the data plan, opens the TCP port for workers and the HTTP port for
status (both inside one event loop), and writes the ready file. Serving ends when the
job is trained (after ``linger_seconds``) or on SIGTERM/SIGINT: the first signal shuts
down gracefully (workers are told goodbye, the final weights are written), a second one
forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from snet.protocol.fpu import flush_denormals
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import Goodbye, Heartbeat

from .config import ServerConfig
from .connection import ConnectionCounters, WorkerConnection
from .dataplan import training_frames
from .export import weights_npz, write_atomically
from .http import make_app
from .training import Coordinator

log = logging.getLogger("snet.server")


class SnetServer:
    """One server daemon: a ``Coordinator`` behind a TCP port and an HTTP port."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state = "starting"
        self.counters = ConnectionCounters()
        self.connections: set[WorkerConnection] = set()
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="snet-step", initializer=flush_denormals
        )
        self._tcp: asyncio.Server | None = None
        self._http: web.AppRunner | None = None
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._next_worker_id = 0
        self._trace_handle: Any = None
        self.port = 0
        self.http_port = 0
        self.coordinator: Coordinator

    # ------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        loop = asyncio.get_running_loop()
        job = self.config.job
        train, total = await loop.run_in_executor(self.executor, training_frames, job.data)
        trace = None
        if self.config.trace_file:
            self._trace_handle = open(self.config.trace_file, "w", encoding="utf-8")  # noqa: SIM115
            trace = self._write_trace
        self.coordinator = Coordinator(
            job, train, total, self.executor, self.config.pool_size, trace
        )
        self.coordinator.pool.on_empty = lambda: self._set_reading(False)
        self.coordinator.pool.on_available = lambda: self._set_reading(True)
        self.coordinator.on_finished = self._on_trained
        limits = FrameLimits(max_payload_bytes=self.config.max_frame_mb * 1024 * 1024)
        token = self.config.token or None
        self._tcp = await loop.create_server(
            lambda: WorkerConnection(
                self.coordinator,
                limits,
                token,
                self.config.name,
                self._new_worker_id,
                self.counters,
                self.connections,
            ),
            self.config.host,
            self.config.port,
        )
        self.port = self._tcp.sockets[0].getsockname()[1]
        self._http = web.AppRunner(make_app(self), access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, self.config.http_bind_host, self.config.http_port)
        await site.start()
        self.http_port = int(self._http.addresses[0][1])
        self.state = "training"
        log.info(
            "serving %s (%s mode, network %s, %d training frames) on %s:%d, HTTP on %s:%d",
            self.config.name,
            job.mode,
            job.network.describe(),
            len(train),
            self.config.host,
            self.port,
            self.config.http_bind_host,
            self.http_port,
        )
        if self.config.ready_file:
            ready = {"pid": os.getpid(), "port": self.port, "http_port": self.http_port}
            write_atomically(Path(self.config.ready_file), json.dumps(ready).encode())

    async def serve(self) -> str:
        """Start, run until trained or stopped, shut down; returns why it stopped."""
        await self.startup()
        return await self.run_until_stopped()

    async def run_until_stopped(self) -> str:
        """After ``startup()``: serve until trained or stopped, then shut down."""
        housekeeping = asyncio.get_running_loop().create_task(self._housekeeping())
        try:
            await self._stop.wait()
        finally:
            housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await housekeeping
            await self.shutdown(self._stop_reason or "stopped")
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    async def shutdown(self, reason: str) -> None:
        """Say goodbye to every worker, stop listening, write the final weights."""
        self.state = "stopping"
        self.coordinator.closed = True
        if self._tcp is not None:
            self._tcp.close()
        goodbye = "training complete" if self.coordinator.finished.is_set() else reason
        for connection in list(self.connections):
            connection.send(Goodbye(goodbye))
            connection.close(f"server {reason}")
        path = self.write_final_weights()
        log.info("final weights (version %d) written to %s", self.coordinator.version, path)
        if self._http is not None:
            await self._http.cleanup()
        if self._tcp is not None:
            await self._tcp.wait_closed()
        if self._trace_handle is not None:
            self._trace_handle.close()
        self.executor.shutdown(wait=True)
        self.state = "stopped"

    def write_final_weights(self) -> Path:
        coordinator = self.coordinator
        path = Path(self.config.out_dir) / "weights.npz"
        payload = weights_npz(
            coordinator.job.network,
            coordinator.rule.snapshot,
            coordinator.version,
            coordinator.epoch,
        )
        write_atomically(path, payload)
        status = json.dumps(self._final_status(), indent=1).encode()
        write_atomically(Path(self.config.out_dir) / "status.json", status)
        return path

    def _final_status(self) -> dict[str, Any]:
        from .status import status_document

        return status_document(self)

    # ------------------------------------------------------------ helpers

    def _new_worker_id(self) -> int:
        self._next_worker_id += 1
        return self._next_worker_id

    def _write_trace(self, record: dict[str, Any]) -> None:
        self._trace_handle.write(json.dumps(record) + "\n")

    def _set_reading(self, on: bool) -> None:
        for connection in self.connections:
            if on:
                connection.resume_reading()
            else:
                connection.pause_reading()

    def _on_trained(self) -> None:
        self.state = "trained"
        log.info("training complete after %d epochs", self.coordinator.stats.epochs_done)
        loop = asyncio.get_running_loop()
        loop.call_later(self.config.linger_seconds, self.request_stop, "trained")

    async def _housekeeping(self) -> None:
        """Heartbeats to quiet workers; drop workers silent past the timeout."""
        interval = self.config.heartbeat_seconds
        while True:
            await asyncio.sleep(min(interval, 1.0))
            now = time.monotonic()
            for connection in list(self.connections):
                session = connection.session
                if session is None:
                    waited = now - connection.connected_at
                    if waited > self.config.worker_timeout_seconds:
                        connection.fail("timeout", f"no hello in {waited:.0f} s")
                    continue
                quiet = now - session.last_seen
                if quiet > self.config.worker_timeout_seconds:
                    connection.fail("timeout", f"no message for {quiet:.0f} s")
                elif quiet > interval:
                    connection.send(Heartbeat(time.time()))

    def install_signal_handlers(self) -> None:
        """First SIGTERM/SIGINT: graceful shutdown. Second: exit at once."""
        loop = asyncio.get_running_loop()

        def handle(signum: int) -> None:
            if self._stop.is_set():
                log.warning("second signal: exiting now")
                os._exit(1)
            log.info("signal %s: shutting down gracefully", signal.Signals(signum).name)
            self.request_stop(f"signal {signal.Signals(signum).name}")

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, handle, signum)
