"""``Handshake``: one connection's handshake with a server, and getting ready for its job.

ServerHello -> Hello (with the token proof and the codecs this worker offers) -> Welcome
(the job) -> DataInfo; then the worker opens the data (or asks for frames inline),
prepares its backend and agrees on codecs. It reads the worker's inbox (what the
connection filed) and returns what the worker needs to train (``Joined``), or why it
cannot (``NotJoined``: the server refused it or said goodbye first); it writes none of the
worker's state. A job this worker cannot run (its data, its codecs, or a network larger
than all the memory this machine could ever give it: client/footprint.py) ends the
session with the reason logged on both sides; a job whose weights exceed this worker's own
frame limit ends the worker (``FrameLimitTooSmall``, a configuration error:
client/frame_limit.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.codecs.handshake import worker_capabilities
from snet.protocol.codecs.weights import SHARED
from snet.protocol.errors import (
    CodecError,
    ConfigError,
    ConnectionLost,
    DataError,
    RefusedHere,
    RemoteError,
)
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    BUSY,
    DROPPED,
    FOLLOWS_POLICY,
    DataInfo,
    ErrorMessage,
    FramesWanted,
    Goodbye,
    Hello,
    Message,
    Resync,
    ServerHello,
    Welcome,
)
from snet.protocol.network import ElementLayout
from snet.transport.shared_board import MAGIC, UPDATE_MAGIC, BoardInfo, BoardReader
from snet.transport.tls import client_context

from .backend import ComputeBackend
from .compression import UpdateCompressor
from .config import HANDSHAKE_SECONDS, WorkerConfig
from .connection import ServerConnection
from .data import Corpus, open_corpus
from .footprint import check_fits_in_memory
from .frame_limit import FrameLimitTooSmall, check_job
from .policies import make_compute_policy
from .port_probe import refuse_if_http
from .slice_work import memory_capabilities

log = logging.getLogger("snet.worker")

M = TypeVar("M", ServerHello, Welcome, DataInfo)


def tls_context(config: WorkerConfig) -> ssl.SSLContext | None:
    """The TLS context of ``config``'s connections (None: plain TCP); ConfigError for
    files that cannot be used."""
    if not config.tls_ca:  # its certificate needs one too: WorkerConfig's check
        return None
    return client_context(config.tls_ca, config.tls_cert, config.tls_key)


class ServerBusy(ConnectionLost):
    """The server is at its connection limits: busy, not refusing this worker (it retries)."""


@dataclass(frozen=True)
class Joined:
    """What a worker needs to train, from a handshake that succeeded."""

    job: JobSpec
    corpus: Corpus
    codecs: dict[str, str]
    compressor: UpdateCompressor | None
    board: BoardReader | None = None  # the server's weights board (weights form ``shared``)
    update_board: BoardReader | None = None  # the one it made for this worker's updates


def np_unused_codecs(compress: str, weights_codec: str) -> str:
    """What np mode leaves unused of a worker's codec settings ("" if nothing): its workers
    send no updates and are sent no whole weights (they hold slices)."""
    # none of either encodes nothing: a setting exported for every mode stays harmless
    unused = [f"--compress {compress}"] if compress not in ("", "none") else []
    if weights_codec not in (SHARED, "none"):
        unused.append(f"--weights-codec {weights_codec}")
    if not unused:
        return ""
    verb = "do" if len(unused) > 1 else "does"
    return (f"{' and '.join(unused)} {verb} nothing: np mode's workers send no updates and "
            "are sent no weights")  # fmt: skip


@dataclass(frozen=True)
class NotJoined:
    """A handshake that ended without joining: refused, or a goodbye first."""

    refused: RemoteError | None = None
    goodbye: str | None = None


class Handshake:
    """The handshake of one connection, reading the worker's inbox."""

    def __init__(
        self,
        config: WorkerConfig,
        name: str,
        backend: ComputeBackend,
        executor: ThreadPoolExecutor,
        inbox: deque[Message],
        wake: asyncio.Event,
        lost: Callable[[], bool],
        give_up_at: float | None = None,
        answered: Callable[[], None] = lambda: None,
    ) -> None:
        """``give_up_at``: the monotonic time the worker's retry window ends (None: not
        open), which a wait for a silent port's hello does not outlast; ``answered`` is
        called once the server's hello has come."""
        self.config, self.name, self.backend, self.executor = config, name, backend, executor
        self._inbox, self._wake, self._lost = inbox, wake, lost
        self._give_up_at, self._answered = give_up_at, answered
        self._goodbye: str | None = None

    async def _next_message(self, kind: type[M], seconds: float = HANDSHAKE_SECONDS) -> M | None:
        """The next message, which the conversation (protocol/conversation.py) allows only
        to be ``kind``, an error (raised as ``RemoteError``) or a goodbye (kept; None)."""
        deadline = time.monotonic() + seconds
        while not self._inbox:
            if self._lost():
                # a TLS server closes a plain connection at its first bytes, saying nothing
                hint = "" if self.config.tls_ca else " (a server that serves TLS wants --tls-ca)"
                raise ConnectionLost(f"connection closed during the handshake{hint}")
            self._wake.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"no answer from the server in {seconds:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)
        message = self._inbox.popleft()
        if isinstance(message, ErrorMessage) and message.code in BUSY:
            raise ServerBusy(f"the server is busy: {message.code}: {message.text}")
        if isinstance(message, ErrorMessage) and message.code in DROPPED:
            # its hello came too late (a loaded machine): dropped, not refused; again
            raise ConnectionLost(f"dropped during the handshake: {message.text}")
        if isinstance(message, ErrorMessage):
            raise RemoteError(message.code, message.text)
        if isinstance(message, Goodbye):
            self._goodbye = message.reason
            return None
        if not isinstance(message, kind):  # the channel has refused anything else
            raise AssertionError(f"{message.TYPE} passed the conversation; {kind} expected")
        return message

    async def run(
        self,
        connection: ServerConnection,
        compressor: UpdateCompressor | None,
        earlier: JobSpec | None = None,
    ) -> Joined | NotJoined:
        """ServerHello -> Hello -> Welcome -> DataInfo, then the data and the backend
        (``compressor``: the worker's, kept if the job and codecs did not change; ``earlier``: the
        job of the worker's last session, whose memory the new one reuses or frees)."""
        try:
            hello = await self._server_hello()
            if hello is None:
                return NotJoined(goodbye=self._goodbye)
            self._answered()
            if self.config.token and not hello.auth_required:
                log.warning(
                    "%s checks no token: the --token given is not used (anyone who reaches "
                    "its port may join)",
                    hello.server_name,
                )
            proof = b""
            if hello.auth_required and self.config.token:
                proof = auth.proof(self.config.token, hello.nonce)
            capabilities = (
                *worker_capabilities(self.config.compress, self.config.weights_codec),
                FOLLOWS_POLICY,  # tell me when the staleness policy changes
                *memory_capabilities(self.backend),  # np mode: cut me no slice I cannot hold
            )
            connection.send(
                Hello(PROTOCOL_VERSION, self.name, self.backend.name, capabilities, proof)
            )
            if hello.auth_required and not self.config.token:
                # sent all the same, so that the server logs the refusal (it said nothing,
                # and its operator could not tell why a worker never joined)
                given = "--token, --token-file or SNET_TOKEN"
                raise RemoteError("auth_failed", f"the server requires a token ({given})")
            welcome = await self._next_message(Welcome)
            info = await self._next_message(DataInfo) if welcome is not None else None
            if welcome is None or info is None:
                return NotJoined(goodbye=self._goodbye)
        except RemoteError as exc:
            return NotJoined(refused=exc)
        try:
            job = JobSpec.from_dict(welcome.job)
            check_job(job, connection.limits.max_payload_bytes)
            # before the backend, buffers and compressor are made for the network
            held = compressor.name if compressor is not None else "none"
            update_codec = str(welcome.codecs.get("update", "none"))
            check_fits_in_memory(job, update_codec, earlier, held)
            corpus = await self._prepare(job, info, connection)
            codecs, compressor = self._agree(job, welcome.codecs, compressor, earlier)
            # last: nothing fails after. A weights board that cannot be read is said once and
            # the server told at once (it sends whole copies, and gives back the update board
            # it made, which this worker could not open either: the same /proc, the same
            # server); an update board, said once (updates go in their frames, as they may).
            board = update_board = None
            if codecs["weights"] == SHARED:
                board = _open_board(job, welcome.codecs, "board")
                if board is None:
                    connection.send(Resync("cannot read the weights board", no_board=True))
                    codecs["weights"] = "none"
            if board is not None and "update_board" in welcome.codecs:
                update_board = _open_board(job, welcome.codecs, "update_board")
        except FrameLimitTooSmall as exc:
            # This worker's own setting: the server is told why it leaves, and the worker
            # stops (exit 2) instead of joining again to be refused the same frames.
            connection.send(ErrorMessage("bad_job", str(exc), True))
            raise
        except (ConfigError, DataError, RemoteError) as exc:
            # Tell the server why this worker cannot take part, then leave.
            connection.send(ErrorMessage("bad_job", str(exc), True))
            return NotJoined(refused=RefusedHere("bad_job", str(exc)))
        if not make_compute_policy(job).holds_whole_network:  # np: slices, no updates
            network = job.network.describe()
            log.info("joined %s as worker %d (np mode, network %s: a slice of its hidden "
                     "units)", hello.server_name, welcome.worker_id, network)  # fmt: skip
            if unused := np_unused_codecs(self.config.compress, self.config.weights_codec):
                log.warning("np mode: %s", unused)
        else:
            log.info(
                "joined %s as worker %d (%s mode, network %s, updates %s, weights %s)",
                hello.server_name,
                welcome.worker_id,
                job.mode,
                job.network.describe(),
                codecs["update"],
                codecs["weights"],
            )
        return Joined(job, corpus, codecs, compressor, board, update_board)

    async def _server_hello(self) -> ServerHello | None:
        """The server's hello; a port silent or closed without one is asked whether it
        speaks HTTP (client/port_probe.py), which ends the worker with ``WrongPort``."""
        try:
            return await self._next_message(ServerHello, self.config.hello_seconds)
        except ServerBusy:
            raise  # it spoke: an snet server
        except ConnectionLost:
            config = self.config
            await refuse_if_http(*config.address(), tls_context(config))
            rest = HANDSHAKE_SECONDS - config.hello_seconds
            if self._give_up_at is not None:  # each such try took 30 s: 72 s for a 5 s window
                rest = min(rest, self._give_up_at - time.monotonic())
                if rest <= 0:
                    raise
            log.warning(
                "no hello from %s after %g s and it does not speak HTTP: waiting up to %g s "
                "more (is it an snet server's worker port?)", config.server,
                config.hello_seconds, rest,
            )  # fmt: skip
            return await self._next_message(ServerHello, rest)

    @staticmethod
    def _agree(
        job: JobSpec, agreed: dict[str, object], compressor: UpdateCompressor | None,
        earlier: JobSpec | None = None,
    ) -> tuple[dict[str, str], UpdateCompressor | None]:  # fmt: skip
        """The codecs the server agreed to (a new compressor unless they and the job, the
        ``earlier`` session's, are the same: another job's residual is none of this one's,
        and one 25 times a fresh worker's went into a new run's weights)."""
        codecs = {key: str(agreed.get(key, "none")) for key in ("update", "weights")}
        layout = ElementLayout.for_network(job.network)
        kept = compressor if earlier == job else None
        return codecs, UpdateCompressor.reuse(kept, codecs["update"], layout, job.momentum)

    async def _prepare(self, job: JobSpec, info: DataInfo, connection: ServerConnection) -> Corpus:
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
        prepare = make_compute_policy(job).prepare_backend
        await loop.run_in_executor(self.executor, prepare, self.backend, job, corpus)
        return corpus


def _open_board(job: JobSpec, agreed: dict[str, object], key: str) -> BoardReader | None:
    """The board ``Welcome.codecs[key]`` names: the server's weights board (``"board"``,
    mapped to be read) or this worker's update board (``"update_board"``, to be written);
    None, said once, when it cannot be opened here (another machine's /proc, a refused
    open, another file)."""
    values = ElementLayout.for_network(job.network).size
    updates = key == "update_board"
    try:
        info = BoardInfo.from_dict(agreed.get(key), values)
        return BoardReader(info, UPDATE_MAGIC if updates else MAGIC, writable=updates)
    except CodecError as exc:
        said = "write the server's update board" if updates else "read the server's weights board"
        goes = "updates go" if updates else "weights come"
        log.warning("cannot %s (%s): %s in frames", said, exc, goes)
        return None
