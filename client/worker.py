"""``Worker``: joins a server, learns the job, trains on leased frames, sends updates.

Two activities run at once, as in SNet v2: the connection (the receiving task, on the
event loop) files incoming weights, leases and requests; the compute loop runs each
bunch's numpy work in a thread. At each bunch boundary the compute loop takes the newest
weights. In async mode it never waits for weights after sending an update; in sync mode
it waits for the version after the one its update was computed on.

The data: the server's ``DataInfo`` (normalisation, utterance lengths) follows
``Welcome``. A worker reads the frames from its own copy of the data (``data_access``
"local" or "auto"); one that cannot ("auto" falling back, or "inline") says
``FramesWanted`` and trains on the raw frames the server sends, a lease's frames arriving
before the worker needs them. Each lease is trained in the order of
``protocol.shuffle.cache_order``: shuffled within a cache of several bunches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.errors import ConfigError, DataError, ProtocolError, RemoteError
from snet.protocol.fpu import flush_denormals
from snet.protocol.framing import FrameLimits
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    DataInfo,
    ErrorMessage,
    EvalResult,
    Evaluate,
    Frames,
    FramesWanted,
    Goodbye,
    Heartbeat,
    Hello,
    Lease,
    Message,
    ServerHello,
    Update,
    Weights,
    Welcome,
    WorkerReport,
)
from snet.protocol.network import ElementLayout
from snet.protocol.shuffle import cache_order

from .backend import ComputeBackend, make_backend
from .buffers import SendBuffers, WeightsBox, WeightsCopy
from .config import WorkerConfig
from .connection import ServerConnection
from .data import Corpus, HeldLease, InlineStore, inline_corpus, local_corpus

log = logging.getLogger("snet.worker")

CAPABILITIES = ("codec:none",)
HANDSHAKE_SECONDS = 30.0
REPORT_SECONDS = 1.0


class ServerGone(Exception):
    """The connection to the server was lost without a goodbye (the worker reconnects)."""


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
        self._leases: deque[HeldLease] = deque()
        self._evaluations: deque[Evaluate] = deque()
        self._offset = 0
        self._goodbye: str | None = None
        self._refused: RemoteError | None = None
        self._lost = False
        self.job: JobSpec | None = None
        self.corpus: Corpus | None = None
        self.updates_sent = 0
        self._sent_this_session = 0  # the server's "settled" count starts anew per connection

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        """Train until the server says goodbye; reconnect while it is unreachable.

        Exit codes: 0 training complete or server closed; 1 refused by the server;
        3 server unreachable for longer than ``retry_seconds``.
        """
        try:
            while True:
                try:
                    await self._session()
                except ServerGone as exc:
                    log.warning("lost the server (%s); reconnecting", exc)
                    self._reset()
                    continue
                if self._refused is not None:
                    log.error("refused by the server: %s", self._refused)
                    return 1
                log.info(
                    "server said goodbye (%s) after %d updates", self._goodbye, self.updates_sent
                )
                return 0
        except TimeoutError as exc:
            log.error("%s", exc)
            return 3
        finally:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def _reset(self) -> None:
        self._inbox.clear()
        self._leases.clear()
        self._evaluations.clear()
        self._offset = 0
        self._lost = False
        self._sent_this_session = 0

    async def _connect(self) -> ServerConnection:
        loop = asyncio.get_running_loop()
        host, port = self.config.address()
        limits = FrameLimits(max_payload_bytes=self.config.max_frame_mb * 1024 * 1024)
        deadline = time.monotonic() + self.config.retry_seconds
        delay = 0.1
        while True:
            try:
                _, connection = await loop.create_connection(
                    lambda: ServerConnection(limits, self._on_message, self._on_lost), host, port
                )
                return connection
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise TimeoutError(
                        f"cannot reach the server at {host}:{port} "
                        f"for {self.config.retry_seconds:.0f} s: {exc}"
                    ) from exc
                log.info(
                    "server %s:%d not reachable (%s); retrying in %.1f s",
                    host,
                    port,
                    exc.strerror or exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _session(self) -> None:
        connection = await self._connect()
        try:
            if not await self._handshake(connection):
                return
            assert self.job is not None
            box = WeightsBox(ElementLayout.for_network(self.job.network), wake=self._wake)
            connection.attach(box, SendBuffers(box.layout))
            heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(connection))
            try:
                await self._compute_loop(connection, box)
            finally:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
        finally:
            connection.close()

    # ------------------------------------------------------------ receiving

    def _on_message(self, message: Message) -> None:
        self._inbox.append(message)
        self._wake.set()

    def _on_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake.set()

    async def _next_message(self) -> Message:
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        while not self._inbox:
            if self._lost:
                raise ServerGone("connection closed during the handshake")
            self._wake.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerGone(f"no answer from the server in {HANDSHAKE_SECONDS:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)
        message = self._inbox.popleft()
        if isinstance(message, ErrorMessage):
            raise RemoteError(message.code, message.text)
        return message

    async def _handshake(self, connection: ServerConnection) -> bool:
        """ServerHello -> Hello -> Welcome. False when the server refused this worker."""
        try:
            hello = await self._next_message()
            if not isinstance(hello, ServerHello):
                raise ProtocolError(f"expected server_hello, got {hello.TYPE}")
            proof = b""
            if hello.auth_required:
                if not self.config.token:
                    raise RemoteError("auth_failed", "the server requires a token (--token)")
                proof = auth.proof(self.config.token, hello.nonce)
            connection.send(
                Hello(PROTOCOL_VERSION, self.name, self.backend.name, CAPABILITIES, proof)
            )
            welcome = await self._next_message()
            if not isinstance(welcome, Welcome):
                raise ProtocolError(f"expected welcome, got {welcome.TYPE}")
            info = await self._next_message()
            if not isinstance(info, DataInfo):
                raise ProtocolError(f"expected data_info, got {info.TYPE}")
        except RemoteError as exc:
            self._refused = exc
            return False
        except ProtocolError as exc:
            self._refused = RemoteError(exc.code, str(exc))
            return False
        try:
            job = JobSpec.from_dict(welcome.job)
            await self._prepare(job, info, connection)
        except (ConfigError, DataError, RemoteError) as exc:
            # Tell the server why this worker cannot take part, then leave.
            connection.send(ErrorMessage("bad_job", str(exc), True))
            self._refused = RemoteError("bad_job", str(exc))
            return False
        log.info(
            "joined %s as worker %d (%s mode, network %s)",
            hello.server_name,
            welcome.worker_id,
            job.mode,
            job.network.describe(),
        )
        return True

    async def _prepare(self, job: JobSpec, info: DataInfo, connection: ServerConnection) -> None:
        """Open the data (or ask for it inline) and prepare the backend (compute thread)."""
        loop = asyncio.get_running_loop()
        corpus: Corpus | None = None
        reason = "this worker runs with --data-access inline"
        if self.config.data_access != "inline":
            try:
                corpus = await loop.run_in_executor(self.executor, local_corpus, job, info)
            except DataError as exc:
                if self.config.data_access == "local":
                    raise RemoteError("bad_data", str(exc)) from exc
                reason = str(exc)
        if corpus is None:
            log.info("frames come inline from the server: %s", reason)
            corpus = inline_corpus(job, info)
            connection.send(FramesWanted(reason[:500]))
        if corpus.pattern_size != job.network.input_size:
            raise RemoteError(
                "bad_job",
                f"the data gives {corpus.pattern_size} inputs per pattern, "
                f"the network has {job.network.input_size}",
            )
        await loop.run_in_executor(self.executor, self.backend.prepare, job, corpus)
        self.job, self.corpus = job, corpus

    # ------------------------------------------------------------ computing

    def _file_inbox(self, box: WeightsBox) -> None:
        while self._inbox:
            message = self._inbox.popleft()
            if isinstance(message, Lease):
                assert self.job is not None
                cache = self.job.bunch_size * self.job.shuffle_cache_bunches
                order = cache_order(message.indices, message.lease_id, self.job.seed, cache)
                self._leases.append(HeldLease(message, order))
            elif isinstance(message, Frames):
                self._add_frames(message)
            elif isinstance(message, Evaluate):
                self._evaluations.append(message)
            elif isinstance(message, Weights):  # arrived before the box was attached
                box.put(
                    WeightsCopy(
                        message.version,
                        message.epoch,
                        message.learning_rate,
                        message.settled,
                        np.array(message.element, dtype=np.float32),
                    )
                )
            elif isinstance(message, Goodbye):
                self._goodbye = message.reason
            elif isinstance(message, ErrorMessage):
                if message.fatal:
                    self._refused = RemoteError(message.code, message.text)
                else:
                    log.warning("server refused: %s: %s", message.code, message.text)
            elif not isinstance(message, Heartbeat):
                log.warning("unexpected %s from the server; ignored", message.TYPE)

    def _add_frames(self, message: Frames) -> None:
        store = self.corpus.store if self.corpus is not None else None
        if not isinstance(store, InlineStore):
            log.warning("frames from the server, but this worker reads its own data; ignored")
            return
        store.add(message.indices, message.features, message.labels)

    def _lease_ready(self) -> bool:
        """A lease is held and every frame it needs is at hand."""
        if not self._leases or self.corpus is None:
            return False
        held = self._leases[0]
        held.ready = held.ready or self.corpus.ready_for(held.order)
        return held.ready

    async def _compute_loop(self, connection: ServerConnection, box: WeightsBox) -> None:
        assert self.job is not None and connection.send_buffers is not None
        loop = asyncio.get_running_loop()
        sync = self.job.mode == "sync"
        last_base = -1
        while True:
            self._wake.clear()
            self._file_inbox(box)
            if self._goodbye is not None or self._refused is not None:
                return
            if self._lost:
                raise ServerGone("connection lost")
            assert self.corpus is not None
            if self._evaluations and self.corpus.ready_for(self.corpus.cv_frames):
                request = self._evaluations.popleft()
                result = await loop.run_in_executor(self.executor, self._evaluate, request)
                connection.send(result)
                continue
            weights = box.take_newest()
            ready = weights is not None and self._lease_ready()
            in_flight = self._sent_this_session - box.settled
            if sync:
                # Wait for the next version, unless the server refused (settled) the update
                # on this one: then the round still waits for this worker, on this version.
                newer = weights is not None and weights.version > last_base
                ready = ready and (newer or in_flight == 0)
            else:
                ready = ready and in_flight < self.job.max_in_flight
            if not ready:
                await self._wake.wait()
                continue
            assert weights is not None
            held = self._leases[0]
            lease = held.lease
            count = min(self.job.bunch_size, len(held.order) - self._offset)
            frames = held.order[self._offset : self._offset + count]
            gradient = await connection.send_buffers.acquire()
            started = time.perf_counter()
            loss, correct = await loop.run_in_executor(
                self.executor, self.backend.gradient, weights.flat, frames, gradient
            )
            seconds = time.perf_counter() - started
            connection.send_buffers.mark_in_flight(gradient)
            connection.send(
                Update(
                    weights.version,
                    lease.lease_id,
                    self._offset,
                    count,
                    loss,
                    correct,
                    seconds,
                    gradient,
                )
            )
            self.updates_sent += 1
            self._sent_this_session += 1
            last_base = weights.version
            self._offset += count
            if self._offset >= len(held.order):
                self._leases.popleft()
                self._offset = 0

    def _evaluate(self, request: Evaluate) -> EvalResult:
        weights = np.ascontiguousarray(request.element, dtype=np.float32)
        frames, correct, loss = self.backend.evaluate(weights)
        return EvalResult(request.version, request.epoch, frames, correct, loss)

    async def _heartbeat(self, connection: ServerConnection) -> None:
        """Liveness every ``heartbeat_seconds``; the backend's figures every second."""
        last_beat = time.monotonic()
        while True:
            await asyncio.sleep(min(REPORT_SECONDS, self.config.heartbeat_seconds))
            report = self.backend.report()
            if report is not None:
                connection.send(WorkerReport(time.time(), report))
            elif time.monotonic() - last_beat >= self.config.heartbeat_seconds:
                connection.send(Heartbeat(time.time()))
                last_beat = time.monotonic()
