"""``Joining``: the worker's handshake with a server, and getting ready for its job.

A mixin of ``Worker`` (client/worker.py): ServerHello -> Hello (with the token proof and
the codecs this worker offers) -> Welcome (the job) -> DataInfo; then the worker opens the
data (or asks for frames inline), prepares its backend and agrees on codecs. A server that
refuses the worker, or a job this worker cannot run, ends the session with the reason
logged on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.codecs.handshake import worker_capabilities
from snet.protocol.errors import ConfigError, ConnectionLost, DataError, RemoteError
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    DataInfo,
    ErrorMessage,
    FramesWanted,
    Goodbye,
    Hello,
    Message,
    ServerHello,
    Welcome,
)
from snet.protocol.network import ElementLayout

from .backend import ComputeBackend
from .compression import UpdateCompressor
from .config import WorkerConfig
from .connection import ServerConnection
from .data import Corpus, open_corpus

log = logging.getLogger("snet.worker")

M = TypeVar("M", ServerHello, Welcome, DataInfo)

HANDSHAKE_SECONDS = 30.0


class Joining:
    """Handshake and preparation; the state it uses is the Worker's."""

    config: WorkerConfig
    name: str
    backend: ComputeBackend
    executor: ThreadPoolExecutor
    job: JobSpec | None
    corpus: Corpus | None
    codecs: dict[str, str]
    compressor: UpdateCompressor | None
    _inbox: deque[Message]
    _wake: asyncio.Event
    _lost: bool
    _refused: RemoteError | None
    _goodbye: str | None
    _joined: bool

    async def _next_message(self, kind: type[M]) -> M | None:
        """The next message, which the conversation (protocol/conversation.py) allows only
        to be ``kind``, an error (raised as ``RemoteError``) or a goodbye (kept; None)."""
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        while not self._inbox:
            if self._lost:
                raise ConnectionLost("connection closed during the handshake")
            self._wake.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"no answer from the server in {HANDSHAKE_SECONDS:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)
        message = self._inbox.popleft()
        if isinstance(message, ErrorMessage):
            raise RemoteError(message.code, message.text)
        if isinstance(message, Goodbye):
            self._goodbye = message.reason
            return None
        if not isinstance(message, kind):  # the channel has refused anything else
            raise AssertionError(f"{message.TYPE} passed the conversation; {kind} expected")
        return message

    async def _handshake(self, connection: ServerConnection) -> bool:
        """ServerHello -> Hello -> Welcome -> DataInfo. False when the server refused this
        worker (``_refused``) or said goodbye first (``_goodbye``)."""
        try:
            hello = await self._next_message(ServerHello)
            if hello is None:
                return False
            proof = b""
            if hello.auth_required:
                if not self.config.token:
                    raise RemoteError("auth_failed", "the server requires a token (--token)")
                proof = auth.proof(self.config.token, hello.nonce)
            capabilities = worker_capabilities(self.config.compress, self.config.weights_codec)
            connection.send(
                Hello(PROTOCOL_VERSION, self.name, self.backend.name, capabilities, proof)
            )
            welcome = await self._next_message(Welcome)
            info = await self._next_message(DataInfo) if welcome is not None else None
            if welcome is None or info is None:
                return False
        except RemoteError as exc:
            self._refused = exc
            return False
        try:
            job = JobSpec.from_dict(welcome.job)
            await self._prepare(job, info, connection)
            self._agree(welcome.codecs)
        except (ConfigError, DataError, RemoteError) as exc:
            # Tell the server why this worker cannot take part, then leave.
            connection.send(ErrorMessage("bad_job", str(exc), True))
            self._refused = RemoteError("bad_job", str(exc))
            return False
        self._joined = True
        log.info(
            "joined %s as worker %d (%s mode, network %s, updates %s, weights %s)",
            hello.server_name,
            welcome.worker_id,
            job.mode,
            job.network.describe(),
            self.codecs["update"],
            self.codecs["weights"],
        )
        return True

    def _agree(self, codecs: dict[str, object]) -> None:
        """Use the codecs the server agreed to (a new compressor only if they changed)."""
        assert self.job is not None
        self.codecs = {key: str(codecs.get(key, "none")) for key in ("update", "weights")}
        layout = ElementLayout.for_network(self.job.network)
        self.compressor = UpdateCompressor.reuse(
            self.compressor, self.codecs["update"], layout, self.job.momentum
        )

    async def _prepare(self, job: JobSpec, info: DataInfo, connection: ServerConnection) -> None:
        """Open the data (or ask for it inline) and prepare the backend (compute thread)."""
        loop = asyncio.get_running_loop()
        access = self.config.data_access
        cache = self.config.data_cache_directory()
        corpus, reason = await loop.run_in_executor(
            self.executor, open_corpus, job, info, access, cache
        )
        if reason:
            log.info("frames come inline from the server: %s", reason)
            connection.send(FramesWanted(reason[:500]))
        await loop.run_in_executor(self.executor, self.backend.prepare, job, corpus)
        self.job, self.corpus = job, corpus
