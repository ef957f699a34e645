"""``Reports``: what a worker tells the server besides its updates, and that it is alive.

The backend's own figures (an emulated board's modelled times, say), the compression
ledger's worker side and, with ``--report-timing``, the per-update costs
(client/update_timing.py) go to the server as a ``WorkerReport``: with the first update of
each connection (in np mode its first partial outputs: a job can end before the first
periodic report), every second while
there is something to say, and every ``REPORT_UPDATES`` updates when compressing or
timing (those figures move with every update). When there is nothing to report, a
``Heartbeat`` every ``heartbeat_seconds`` says the worker is alive; and a server silent
past ``server_timeout_seconds`` is taken for gone (the connection is aborted, and the
worker reconnects).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from snet.protocol.messages import Heartbeat, WorkerReport

from .backend import ComputeBackend
from .compression import UpdateCompressor
from .config import WorkerConfig
from .connection import ServerConnection
from .progress_log import ProgressLog
from .update_timing import UpdateTiming

log = logging.getLogger("snet.worker")

REPORT_SECONDS = 1.0
REPORT_UPDATES = 32  # a compressing or timing worker also reports after every this many


class Reports:
    """One worker's reports and heartbeats (``compressor`` reads the current one: it is
    made at the handshake)."""

    def __init__(
        self,
        config: WorkerConfig,
        backend: ComputeBackend,
        progress: ProgressLog,
        timing: UpdateTiming | None,
        compressor: Callable[[], UpdateCompressor | None],
    ) -> None:
        self.config = config
        self.backend = backend
        self.progress = progress
        self.timing = timing
        self.compressor = compressor

    def update_sent(self, connection: ServerConnection, this_session: int, total: int) -> None:
        """An update went out (the ``this_session``-th of the connection, ``total``-th in
        all): report if it is the first of the connection, or a multiple of
        ``REPORT_UPDATES`` when the figures move with every update."""
        counting = self.compressor() is not None or self.timing is not None
        if this_session == 1 or (counting and total % REPORT_UPDATES == 0):
            self.send(connection)

    def send(self, connection: ServerConnection) -> bool:
        """Send the figures; False when there are none."""
        report = self.report()
        if report is not None:
            connection.send(report)
        return report is not None

    def report(self) -> WorkerReport | None:
        """The backend's figures, the compression ledger's worker side and the per-update
        timing, if any."""
        report = dict(self.backend.report() or {})
        compressor = self.compressor()
        if compressor is not None:
            report["compression"] = compressor.figures()
        if self.timing is not None and (figures := self.timing.figures()) is not None:
            report["per_update"] = figures
        return WorkerReport(time.time(), report) if report else None

    async def heartbeat(self, connection: ServerConnection) -> None:
        """Liveness every ``heartbeat_seconds``; the figures every second; the progress
        line when due. Returns once the server has been silent too long (aborted)."""
        last_beat = time.monotonic()
        while True:
            await asyncio.sleep(min(REPORT_SECONDS, self.config.heartbeat_seconds))
            self.progress.tick(time.monotonic())
            silent = time.monotonic() - connection.last_received
            if silent > self.config.server_timeout_seconds:
                # A cut link or a frozen server: TCP alone would notice only after many
                # minutes of retransmissions. The server sends heartbeats when it has
                # nothing else to say, so silence this long means the link is gone.
                log.warning("nothing from the server for %.0f s; dropping the connection", silent)
                connection.abort()
                return
            if not self.send(connection) and (
                time.monotonic() - last_beat >= self.config.heartbeat_seconds
            ):
                connection.send(Heartbeat(time.time()))
                last_beat = time.monotonic()
