"""``Worker``: joins a server, learns the job, trains on leased frames, sends updates.

As in SNet v2, the connection (the receiving task, on the event loop) files incoming
weights, leases and requests while the compute loop runs each bunch in a thread (bunches
under ``inline_seconds`` of CPU on the loop itself, transport/inline.py) and takes the
newest weights at each bunch boundary: in async mode it never waits for weights after
sending an update, in sync mode for the version after the one its update was computed on.
``DataInfo`` follows ``Welcome``; a worker that cannot read the data says ``FramesWanted``
and trains on frames the server sends (``client/data.py``, ``work.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from snet.protocol.conversation import Role
from snet.protocol.errors import (
    ConnectionLost,
    ProtocolError,
    RefusedHere,
    RemoteError,
    ServerUnreachable,
    TlsRefused,
)
from snet.protocol.fpu import flush_denormals
from snet.protocol.framing import FrameLimits
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    DROPPED,
    LEASE_REVOKED,
    ROUND_DEADLINE,
    TAKEN_BACK_REMEMBERED,
    TRAINING_COMPLETE,
    ErrorMessage,
    EvalResult,
    Evaluate,
    Goodbye,
    Message,
    PolicyChange,
    Weights,
)
from snet.protocol.network import ElementLayout
from snet.transport.dial import connect_with_backoff
from snet.transport.faults import FaultSwitch
from snet.transport.inline import InlineChoice
from snet.transport.shared_board import BoardReader
from snet.transport.tls import refusal as tls_refusal

from .backend import ComputeBackend, make_backend
from .buffers import SendBuffers, WeightsBox
from .compression import UpdateCompressor
from .config import WorkerConfig
from .connection import ServerConnection
from .data import Corpus
from .frame_limit import refused_frame
from .joining import Handshake, NotJoined, tls_context
from .policies import ComputePolicy, follow_change, make_compute_policy
from .progress_log import ProgressLog
from .reports import Reports
from .retry_window import RetryWindow
from .slice_work import SliceSteps, SliceWork
from .update_steps import SentCounts, UpdateSteps
from .update_timing import UpdateTiming
from .work import WorkQueue

log = logging.getLogger("snet.worker")
EXIT_REFUSED = 4  # refused by the server: a restart would be refused again


class Worker:
    """One worker process's life: connect, handshake, train until told goodbye."""

    def __init__(self, config: WorkerConfig, backend: ComputeBackend | None = None) -> None:
        self.config = config
        self.backend = backend or make_backend(config.backend, config.threads)
        self.name = config.worker_name()
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="snet-compute", initializer=flush_denormals
        )
        self._inbox: deque[Message] = deque()
        self._wake = asyncio.Event()
        self._work = WorkQueue()
        # leases the server took back lately: the refusal of an update of one is expected
        self._taken_back: deque[int] = deque(maxlen=TAKEN_BACK_REMEMBERED)
        self._faults = FaultSwitch.from_text(config.faults, Role.WORKER)  # one per process
        self._tls: ssl.SSLContext | None = None  # made in run(): its files are read then
        self._tls_refusal = ""  # why the server's TLS refused this worker, if it did
        self._goodbye: str | None = None
        self._refused: RemoteError | None = None
        self._lost = False
        self._stop_reason: str | None = None  # set by request_stop()
        self._task: asyncio.Task[int] | None = None  # the task running run()
        self._generation = 0  # counts connections; callbacks of older ones are ignored
        self._joined = False  # the current connection got past the handshake
        self._retry = RetryWindow(config.retry_seconds)  # one deadline across reconnects
        self.job: JobSpec | None = None  # as welcomed, with any policy change since
        self.policy: ComputePolicy | None = None  # when it may compute: the mode's policy
        self.corpus: Corpus | None = None
        self.sent = SentCounts()  # updates sent on this connection
        self.progress = ProgressLog(config.progress_seconds, time.monotonic())
        self.codecs: dict[str, str] = {"update": "none", "weights": "none"}
        # Kept across reconnections: the residual is owed to the weights whoever holds them.
        self.compressor: UpdateCompressor | None = None
        self.timing = UpdateTiming() if config.report_timing else None
        self.reports = Reports(
            config, self.backend, self.progress, self.timing, lambda: self.compressor
        )
        # the mode's turn of the compute loop (update_steps.py, slice_work.py)
        self._steps: UpdateSteps | SliceSteps | None = None

    @property
    def updates_sent(self) -> int:
        """Updates this worker has sent (np: bunches it has answered, where it had said
        "after 0 updates" of a whole run), over all its connections."""
        return self.progress.updates

    async def run(self) -> int:
        """Train until the server says the job is done; reconnect whenever it is lost.

        Exit codes: 0 training complete, or the server stopped and did not come back within
        ``retry_seconds``, or this worker was stopped by SIGTERM/SIGINT; 3 the server
        unreachable for ``retry_seconds`` (never reached, or lost without a goodbye); 4
        (``EXIT_REFUSED``) refused by the server (token, protocol version, a job it cannot
        run), which a restart cannot cure (1: an unforeseen error, which one may). Raises
        ``ConfigError`` (``snet worker`` exits 2) for a setting of its own that cannot work,
        e.g. ``max_frame_mb`` below the job's weights (client/frame_limit.py).
        """
        self._task = asyncio.current_task()
        self._tls = tls_context(self.config)
        self._retry.start()
        server_stopped = False  # the last server said goodbye without finishing the job
        try:
            while True:
                try:
                    await self._session()
                except ConnectionLost as exc:
                    if self._tls_refusal:  # the server refused our certificate: for good
                        raise TlsRefused(self._tls_refusal) from exc
                    retry = self.config.retry_seconds
                    log.warning("lost the server (%s); reconnecting for up to %g s", exc, retry)
                    server_stopped = False
                    await self._between_sessions(exc)
                    continue
                if self._refused is not None:
                    here = isinstance(self._refused, RefusedHere)
                    who = "cannot run the server's job" if here else "refused by the server"
                    log.error("%s: %s", who, self._refused)
                    return EXIT_REFUSED
                if self._goodbye != TRAINING_COMPLETE:
                    retry = self.config.retry_seconds
                    message = "server said goodbye (%s) mid-job; waiting %.0f s for it to return"
                    log.warning(message, self._goodbye, retry)
                    server_stopped = True
                    await self._between_sessions(ConnectionLost(f"goodbye: {self._goodbye}"))
                    continue
                log.info(
                    "server said goodbye (%s) after %d updates", self._goodbye, self.updates_sent
                )
                return 0
        except TlsRefused as exc:  # either side's refusal: the text says whose
            log.error("TLS refused: %s", exc)
            return EXIT_REFUSED
        except ServerUnreachable as exc:
            if server_stopped:
                log.info("the server did not come back (%s); exiting", exc)
                return 0
            log.error("%s", exc)
            return 3
        except asyncio.CancelledError:
            if self._stop_reason is None:
                raise
            log.info("stopped (%s) after %d updates", self._stop_reason, self.updates_sent)
            return 0
        finally:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def request_stop(self, reason: str) -> None:
        """Leave: say goodbye to the server, end ``run()`` with 0 (e.g. on SIGTERM)."""
        if self._stop_reason is None and self._task is not None:
            self._stop_reason = reason
            self._task.cancel()

    def _stop_if_asked(self) -> None:
        """End ``run()`` as stopped if a stop was asked for, even if its cancel was lost:
        3.11's ``wait_for`` drops a cancel that races its result, and a session torn down
        just then would otherwise go on to the next one (a SIGTERM ignored)."""
        if self._stop_reason is not None:
            raise asyncio.CancelledError

    async def _between_sessions(self, why: Exception) -> None:
        """After a session that ended without the job done: give up once the retry
        window has passed (client/retry_window.py), else pause before the next one."""
        self._stop_if_asked()
        self._retry.session_ended()
        self._retry.give_up_if_expired(self.config.server, why)
        self._reset()
        await asyncio.sleep(self._retry.pause)

    def _reset(self) -> None:
        # The ended connection may still report its loss (an abort's callback comes a
        # moment later, during the pause before reconnecting): a new generation ignores
        # it, or it would mark the next connection lost before its handshake.
        self._generation += 1
        self._inbox.clear()
        self._work.clear()
        self._lost = False
        self._goodbye = None
        self._joined = False
        self.sent.new_connection()
        if self.timing is not None:
            self.timing.new_connection()

    async def _session(self) -> None:
        host, port = self.config.address()
        limits = FrameLimits(max_payload_bytes=self.config.max_frame_mb * 1024 * 1024)
        self._generation += 1
        generation = self._generation

        # Callbacks of an older, aborted connection may still arrive: only the current
        # connection may file messages or declare the server lost.
        def on_message(message: Message) -> None:
            if generation == self._generation:
                self._on_message(message)

        def on_lost(exc: Exception | None) -> None:
            if generation == self._generation:
                self._on_lost(exc)

        connection = ServerConnection(limits, on_message, on_lost, self._faults)
        await connect_with_backoff(
            host,
            port,
            connection.new_stream,
            self.config.retry_seconds,
            self._tls,
            self._retry.deadline,
            client_cert=bool(self.config.tls_cert),
        )
        gone = False
        boards: list[BoardReader] = []  # the server's weights and update boards, this session's
        try:
            handshake = Handshake(self.config, self.name, self.backend, self.executor,
                                  self._inbox, self._wake, lambda: self._lost,
                                  self._retry.deadline, self._retry.answered)  # fmt: skip
            joined = await handshake.run(connection, self.compressor, self.job)
            if isinstance(joined, NotJoined):
                self._refused, self._goodbye = joined.refused, joined.goodbye
                return
            self.job, self.corpus = joined.job, joined.corpus
            self.codecs, self.compressor = joined.codecs, joined.compressor
            self._joined = True
            self._retry.joined()
            layout = ElementLayout.for_network(self.job.network)
            boards = [b for b in (joined.board, joined.update_board) if b is not None]
            box = WeightsBox(layout, wake=self._wake, board=joined.board)
            self.policy = make_compute_policy(self.job)  # this session's: it sizes the buffers
            buffers = SendBuffers(box.layout, self.policy.send_buffers)
            connection.attach(box, buffers, joined.update_board)
            heartbeat = asyncio.get_running_loop().create_task(self.reports.heartbeat(connection))
            try:
                await self._compute_loop(connection, box)
            finally:
                heartbeat.cancel()
                # Not `await heartbeat` with its CancelledError suppressed: that would
                # suppress ours too, a SIGTERM that comes while the session ends.
                await asyncio.wait([heartbeat])
                if not heartbeat.cancelled():
                    heartbeat.result()  # its own error, if it had one
        except ConnectionLost as exc:
            gone = True
            connection.abort()  # on a dead link a graceful close would never finish
            refused = connection.refused_frame_bytes  # a frame over our own --max-frame-mb
            if refused is not None:
                raise refused_frame(limits.max_payload_bytes, refused) from exc
            raise
        finally:
            if self._stop_reason is not None:
                if not gone and not self._lost and self._joined:
                    self.reports.send(connection)  # its final figures: read before the goodbye
                await connection.leave(Goodbye(f"worker stopped ({self._stop_reason})"))
            connection.close()
            for board in boards:  # unmapped now: a dead server's board would stay alive
                board.close()

    # ------------------------------------------------------------ receiving

    def _on_message(self, message: Message) -> None:
        self._inbox.append(message)
        self._wake.set()

    def _on_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._tls is not None:
            self._tls_refusal = self._tls_refusal or tls_refusal(exc)
        self._wake.set()

    def _file_inbox(self, connection: ServerConnection, box: WeightsBox) -> None:
        while self._inbox:
            message = self._inbox.popleft()
            try:
                if self._work.file(message, self.job, self.corpus):
                    continue
            except ProtocolError as exc:  # as a frame the channel refuses: said, dropped
                log.error("the server broke the protocol: %s", exc)
                connection.send(ErrorMessage(exc.code, str(exc)[:200], True))
                raise ConnectionLost(f"the server broke the protocol: {exc}") from None
            if self._steps is not None and self._steps.file(message):
                continue
            if isinstance(message, Weights):  # arrived before the box was attached
                connection.file_weights(box, message)
            elif isinstance(message, Goodbye):
                self._goodbye = message.reason
            elif isinstance(message, PolicyChange):
                assert self.job is not None and self.policy is not None
                self.job = follow_change(self.job, self.policy, message)
            elif isinstance(message, ErrorMessage):
                if message.fatal and message.code in DROPPED:  # welcome back: reconnect
                    said = "from the sync rounds" if message.code == ROUND_DEADLINE else "as silent"
                    raise ConnectionLost(f"dropped {said}: {message.text}")
                if message.fatal:
                    self._refused = RemoteError(message.code, message.text)
                elif message.code == LEASE_REVOKED:  # its remaining frames are dropped
                    self._work.revoke(message.lease_id)
                    self._taken_back.append(message.lease_id)
                    # late: a warning; a far slower worker's last leases handed over to
                    # idle ones at an epoch's end: expected (server/lateness.py)
                    handed = message.text.startswith(f"lease {message.lease_id} handed over")
                    log.log(logging.INFO if handed else logging.WARNING, "server: %s",
                            message.text)  # fmt: skip
                else:
                    expected = message.lease_id in self._taken_back  # the bunch under way
                    log.log(logging.INFO if expected else logging.WARNING,
                            "server refused: %s: %s", message.code, message.text)  # fmt: skip
                    if self.compressor is not None:
                        self.compressor.refused_update(message)
            # else a Heartbeat: the conversation (protocol/conversation.py) lets a training
            # server send nothing else, and the channel has refused anything out of turn

    async def _compute_loop(self, connection: ServerConnection, box: WeightsBox) -> None:
        assert self.job is not None and self.corpus is not None and self.policy is not None
        loop = asyncio.get_running_loop()
        policy = self.policy
        limit = 0.0 if self.backend.models_device_time else self.config.inline_seconds
        inline = InlineChoice(limit)  # never inline for a backend that sleeps a device's time
        # the mode's turn of the loop, as its policy makes it: a bunch computed and sent
        # as an update, or np's slices and bunches (the loop never asks which mode runs)
        job, corpus = self.job, self.corpus

        def updates() -> UpdateSteps | SliceSteps:
            return UpdateSteps(policy, job, self.backend, connection, box, self._work, corpus,
                               self.executor, inline, self.compressor, self.sent,
                               self.progress, self.reports, self.timing)  # fmt: skip

        def slices(work: SliceWork) -> UpdateSteps | SliceSteps:
            report = functools.partial(self.reports.send, connection)
            return SliceSteps(work, self.executor, connection.send, inline, report, self.progress)

        self._steps = policy.make_turn(job, corpus, self.backend, updates, slices)
        while True:
            self._wake.clear()
            self._file_inbox(connection, box)
            if self._goodbye is not None or self._refused is not None:
                return
            if self._lost:
                raise ConnectionLost("connection lost")
            self._stop_if_asked()  # asked to stop, and the cancel was lost
            assert self.corpus is not None
            request = self._work.evaluation(self.corpus)
            if request is not None:
                result = await loop.run_in_executor(self.executor, self._evaluate, request)
                connection.send(result)
                continue
            self._refused = await self._steps.step(self._wake)

    def _evaluate(self, request: Evaluate) -> EvalResult:
        weights = np.ascontiguousarray(request.element, dtype=np.float32)
        frames, correct, loss = self.backend.evaluate(weights)
        return EvalResult(request.version, request.epoch, frames, correct, loss)
