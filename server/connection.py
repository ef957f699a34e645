"""``WorkerConnection``: what one worker's TCP connection means to the server.

The socket glue is the shared ``FrameStream`` (transport/stream.py), which receives update
payloads straight into free pooled elements and checks every message against the
conversation (protocol/conversation.py): this class sees only messages the worker may
send now. It checks the ``Hello`` (protocol version, token proof, codecs), hands each
update to the ``Coordinator`` as a ``Received`` (the coordinator owns its pooled element
from then on), and passes evaluation results, reports and resync requests on.

A frame that cannot be decoded, or a message out of turn, closes this connection with an
``ErrorMessage`` and never affects the server; a refused update is answered with a
non-fatal ``ErrorMessage``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from snet.protocol import PROTOCOL_VERSION, auth
from snet.protocol.codecs.handshake import UPDATE_BOARD
from snet.protocol.codecs.weights import SHARED, WeightsEncoder
from snet.protocol.conversation import Conversation, Role
from snet.protocol.decoder import Decoded
from snet.protocol.errors import (
    AuthError,
    ConnectionLost,
    ProtocolError,
    RejectedUpdate,
    TlsOnPlainPort,
    UnknownCodec,
    VersionMismatch,
)
from snet.protocol.framing import FrameLimits
from snet.protocol.messages import (
    ErrorMessage,
    EvalResult,
    FramesWanted,
    Goodbye,
    Hello,
    Message,
    PartialOutputs,
    Resync,
    ServerHello,
    SliceState,
    Update,
    WorkerReport,
)
from snet.protocol.worker_name import name_problem
from snet.transport.addresses import peer_address
from snet.transport.shared_board import UpdateBoard, WeightsBoard
from snet.transport.stream import FrameStream, release_tokens

from .admission import Admission
from .ledger import CompressionLedger
from .pool import TURNED_AWAY, ElementLoan, ElementShare, Received
from .reported import checked_report
from .security import is_loopback
from .session import WorkerSession, unique_name
from .training import Coordinator

if TYPE_CHECKING:
    from snet.transport.faults import FaultSwitch

log = logging.getLogger("snet.server")

# Warnings about what one connection's peer sent (refusals, on arrival or at step time;
# repeats; its error reports: WorkerSession.warn) logged in full; the rest are counted and
# summed up when it leaves. A peer repeating one refused message wrote 47,000 log lines
# (13.7 MB) in 7 s, a disk's worth in hours.
PEER_WARNINGS = 20
HIGH_WATER, LOW_WATER = 4 * 1024 * 1024, 1024 * 1024  # bytes queued: weights coalesce above


class WorkerConnection:
    """One worker's connection: its ``FrameStream`` and the worker's session."""

    def __init__(
        self,
        coordinator: Coordinator,
        limits: FrameLimits,
        token: str | None,
        server_name: str,
        next_id: Callable[[], int],
        counters: Admission,
        connections: set[WorkerConnection],
        faults: FaultSwitch | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.token = token
        self.server_name = server_name
        self.next_id = next_id
        self.counters = counters
        self.connections = connections
        self.session: WorkerSession | None = None
        self.nonce = os.urandom(auth.NONCE_BYTES)
        self.connected_at = time.monotonic()
        self.address = "?"  # the peer's host (transport/addresses.py), once connected
        self.update_board: UpdateBoard | None = None  # its updates' way in, if it has one
        self.paused_at = 0.0  # when the server stopped reading it (the pool full), 0: reading
        self._warned = 0  # warnings logged about what this peer sent (PEER_WARNINGS)
        self._unlogged: tuple[str, int] = ("", 0)  # its name, and the warnings not logged
        self.stream = FrameStream(
            self,
            Conversation(Role.SERVER),
            limits,
            sink=ElementShare(coordinator.pool, self._proven),
            water=(HIGH_WATER, LOW_WATER),
            faults=faults,
        )

    @property
    def closing(self) -> bool:
        return self.stream.closing

    def _refresh_weights(self) -> None:
        """Before a lease: the newest weights, if it was not sent them (an idle worker is
        not sent every step's: server/session.py, ``wants_weights``)."""
        session = self.session  # whole if it missed a publish: session.py, weights_sent
        if session is not None and session.weights_version_sent != self.coordinator.version:
            self.coordinator.send_weights(session)

    def _proven(self) -> bool:
        """Its worker has joined and is trusted with the pool (session.py, ``pool_trusted``:
        else it is held to a newcomer's share of it, pool.py)."""
        return self.session is not None and self.session.pool_trusted

    @property
    def last_sent(self) -> float:
        """When a frame was last queued for this worker."""
        return self.stream.last_sent

    # ------------------------------------------------------------ stream events

    def stream_opened(self, stream: FrameStream) -> None:
        assert stream.transport is not None
        self.address = peer_address(stream.transport.get_extra_info("peername"))
        waiting = [c for c in self.connections if c.session is None and not c.closing]
        here = sum(1 for c in waiting if c.address == self.address)
        if self.coordinator.closed:  # stopping, its goodbyes said: it would wait for one
            self.stream.close()  # (a TLS handshake that ended then); it connects again
            return
        refusal = self.counters.refusal(len(self.connections), len(waiting), self.address, here)
        if refusal is not None:  # before anything is kept for this peer
            self.send(ErrorMessage(*refusal, True))
            self.stream.close()
            return
        self.connections.add(self)
        self.send(
            ServerHello(PROTOCOL_VERSION, self.server_name, self.nonce, self.token is not None)
        )

    def stream_received(self, decoded: Decoded) -> None:
        message = decoded.message
        received = None
        loan = decoded.slot if isinstance(decoded.slot, ElementLoan) else None
        if isinstance(message, Update):
            self._payload_done(loan)  # whole: no longer an unfinished payload (pool.py)
        if isinstance(message, Update) and message.slot >= 0:  # in its update board
            release_tokens([decoded.slot])  # one that carried an element too: refused below
            received = self._from_board(message)
        elif isinstance(message, Update):  # the pooled element is owned from here on
            received = Received(message, loan, decoded.slot is TURNED_AWAY)
        try:
            self.dispatch(message, received)
        except RejectedUpdate as exc:
            session = self.session
            if session is not None and session.expected_refusal(exc):
                log.info("refused update from %s: %s (taken back)", self.describe(), exc)
            else:  # an update, or an eval_result, a worker_report: named as what it was
                self._warn("refused %s from %s: %s", message.TYPE, self.describe(), exc)
            self.send(ErrorMessage(exc.code, str(exc), False, exc.lease_id, exc.offset))
        except (ProtocolError, AuthError) as exc:
            self.fail(exc.code, str(exc))
        finally:  # the one release point of an update the coordinator did not queue
            if received is not None:  # (refused, repeated, np's; or a bug raised): pool.py
                received.release()

    def stream_refused(self, error: ProtocolError) -> None:
        self.counters.refused_frame()
        # a TLS handshake: a worker's own (given --tls-ca, or asking if the port wants TLS)
        level = logging.INFO if isinstance(error, TlsOnPlainPort) else logging.WARNING
        log.log(level, "closing connection from %s: %s: %s", self.describe(), error.code, error)
        self._leave(f"{error.code}: {error}")

    def _from_board(self, message: Update) -> Received:
        """An update in a slot of its update board: a pooled element (its pool share) that
        intake.py copies the slot into once the checks needing no values pass, before any
        that do (what it writes there after is never read); with no such slot: refused."""
        board, share = self.update_board, self.stream.sink
        assert isinstance(share, ElementShare)
        carried = message.element.size > 0 or message.encoded is not None
        if board is None or board.closed or carried or not 0 <= message.slot < board.slots:
            return Received(message, None)
        loan = share.element()
        if loan is None:
            return Received(message, None, turned_away=True)
        loan.received()
        return Received(message, loan, source=functools.partial(board.copy_out, message.slot))

    def stream_lost(self, error: ConnectionLost | None) -> None:
        self.connections.discard(self)
        self._release_update_board()  # nobody writes it any more
        name, unlogged = self._unlogged
        if unlogged:
            log.warning("%s: %d more warnings about what it sent were not logged", name, unlogged)
        # (the error says "connection lost: WHY" itself: said once)
        reason = "closed" if self.stream.closing else str(error or "connection lost (eof)")
        self._leave(reason)

    def stream_drained(self) -> None:
        pass  # the server's elements are the pool's; nothing waits for the socket

    # ------------------------------------------------------------ conversation

    def dispatch(self, message: Message, received: Received | None = None) -> None:
        """Act on a message the conversation allows now (protocol/conversation.py)."""
        if isinstance(message, Goodbye):
            self.close(f"goodbye: {message.reason}")
        elif isinstance(message, ErrorMessage):
            self._warn("worker %s reports %s: %s%s", self.describe(), message.code,
                       message.text, " (fatal)" if message.fatal else "")  # fmt: skip
            if message.fatal:  # it is done: its frames go to others now, not at its timeout
                self.close(f"fatal error from the worker: {message.code}")
        elif isinstance(message, Hello):
            self._handshake(message)
        elif self.session is None:  # the conversation admits nothing else before hello
            raise AssertionError(f"{message.TYPE} before the handshake")
        else:
            self.session.touch()
            self._training(self.session, message, received)

    def _training(
        self, session: WorkerSession, message: Message, received: Received | None
    ) -> None:
        if received is not None:  # what it does not keep, stream_received gives back
            self.coordinator.on_update(session, received)
        elif isinstance(message, EvalResult):
            self.coordinator.on_eval_result(session, message)
        elif isinstance(message, FramesWanted):
            self.coordinator.on_frames_wanted(session, message)
        elif isinstance(message, WorkerReport):
            report = checked_report(message.report)
            figures = report.pop("compression", None)  # goes to the compression ledger
            if session.ledger is not None:
                session.ledger.absorb_report(figures)
            session.reported(report)
        elif isinstance(message, Resync) and message.no_board:
            session.cannot_read_board()
            self._release_update_board()  # it does not open one either (client/joining.py)
        elif isinstance(message, Resync):
            self.coordinator.on_resync(session, message.reason)
        elif isinstance(message, PartialOutputs | SliceState):  # np mode (slice_rounds.py)
            self.coordinator.on_slice_message(session, message)
        # a Heartbeat only touches the session

    def _handshake(self, hello: Hello) -> None:
        problem = name_problem(hello.worker_name)
        if problem:
            self.counters.refused_handshake()
            raise ProtocolError(problem)
        if hello.protocol_version != PROTOCOL_VERSION:
            self.counters.refused_handshake()
            raise VersionMismatch(
                f"worker speaks protocol {hello.protocol_version}, server {PROTOCOL_VERSION}"
            )
        if self.token is not None and not auth.verify(self.token, self.nonce, hello.proof):
            self.counters.refused_handshake()
            raise AuthError("wrong or missing token proof")
        try:
            combination = self.coordinator.policy.combination
            codecs = combination.agreed_codecs(hello.capabilities, self.coordinator.job.compress)
        except UnknownCodec:
            self.counters.refused_handshake()
            raise
        channel = self.stream.channel
        assert channel is not None
        encoder = WeightsEncoder(codecs["weights"], self.coordinator.layout, self._board(codecs))
        channel.encode_with(encoder.prepare)  # weights are encoded as they are written
        ledger = CompressionLedger(codecs["update"], encoder, channel.received, channel.sent)
        if UPDATE_BOARD in hello.capabilities and encoder.board is not None:
            self.update_board = self._update_board(codecs)
            ledger.update_board = self.update_board.described() if self.update_board else None
        self.session = WorkerSession(
            worker_id=self.next_id(),
            name=unique_name(
                hello.worker_name or f"worker-{self.stream.peer}",
                (s.name for s in self.coordinator.sessions.values()),
            ),
            address=self.stream.peer,
            backend=hello.backend[:32],
            capabilities=hello.capabilities,
            send=self.send,
            close=self.close,
            warn=self._warn,
            ledger=ledger,
            joined_late=self.coordinator.steps.started > 0,
            refresh=self._refresh_weights,
        )
        self.coordinator.add_worker(self.session)

    def _board(self, codecs: dict[str, str]) -> WeightsBoard | None:
        """The weights board, for a worker that asked for ``shared`` weights from this
        machine (one elsewhere could not read it: it is sent ``none``)."""
        coordinator = self.coordinator  # np's workers hold slices: no whole weights to share
        if codecs["weights"] != SHARED or not is_loopback(self.address):
            return None
        if not coordinator.traffic.whole_weights:
            return None
        board = coordinator.boards.weights()
        if board is None:
            log.info("worker %s asked for shared weights: %s; sent in frames", self.address,
                     coordinator.boards.unavailable)  # fmt: skip
        return board

    def _update_board(self, codecs: dict[str, str]) -> UpdateBoard | None:
        """An update board, for a worker given the weights board whose updates are float32,
        within the boards' budget (shared_board.py). Not with a fault switch: the updates
        it drops are settled by an estimate that could run ahead of a slot's reuse."""
        if codecs["update"] != "none" or self.stream.faults is not None:
            return None
        return self.coordinator.boards.updates.make(self.coordinator.job.max_in_flight)

    def _release_update_board(self) -> None:
        if self.update_board is not None:
            self.coordinator.boards.updates.release(self.update_board)
            self.update_board = None

    # ------------------------------------------------------------ sending and closing

    def _warn(self, text: str, *args: object) -> None:
        """A warning about what this peer sent: the first ``PEER_WARNINGS`` of the
        connection are logged, the rest counted and summed up when it is gone (/status
        counts every refusal). One after it left (an update refused at step time) is
        logged: no summary would say it."""
        self._warned += 1
        if self._warned <= PEER_WARNINGS or self.stream.lost:
            log.warning(text, *args)
            if self._warned == PEER_WARNINGS:
                log.warning("%s: %d warnings about what it sent; the next are summed up when "
                            "it leaves", self.describe(), PEER_WARNINGS)  # fmt: skip
        else:
            self._unlogged = (self._unlogged[0] or self.describe(), self._unlogged[1] + 1)

    def describe(self) -> str:
        return self.session.name if self.session else self.stream.peer

    def send(self, message: Message) -> None:
        """Send to this worker; a counted no-op once the connection is closing or gone.
        Never raises for the peer's sake: what one peer's socket does must not reach the
        caller (the step machinery sends to every worker after each step)."""
        self.stream.send(message)

    def fail(self, code: str, text: str, logged: bool = True) -> None:
        """Refuse this peer: tell it why, close this connection only (``logged``: say so in
        the log; a flood's refusals are logged in sum, by ``Admission``)."""
        if logged:
            log.warning("closing connection from %s: %s: %s", self.describe(), code, text)
        self.send(ErrorMessage(code, text, True))
        self.close(f"{code}: {text}")

    def close(self, reason: str) -> None:
        """Leave; close once the worker has read the last frame (stream.py, lingering)."""
        if not self.stream.closing:
            self._leave(reason)
            self.stream.close_lingering()

    def _leave(self, reason: str) -> None:
        """The worker leaves training (once): its frames go back to the queue."""
        if self.session is not None:
            session, self.session = self.session, None
            self.coordinator.remove_worker(session, reason)

    def pause_reading(self) -> None:
        """Stop reading it (the pool ran dry), unless a payload is being received into an
        element it holds: it finishes (then paused), or is closed (``tend_connections``)."""
        share = self.stream.sink
        if isinstance(share, ElementShare) and share.receiving:
            return
        self.stream.pause_reading()
        self.paused_at = self.paused_at or time.monotonic()

    def _payload_done(self, loan: ElementLoan | None) -> None:
        share = self.stream.sink
        if isinstance(share, ElementShare):
            share.payload_done(loan)
            if not share.pool.free:  # dry: no more frames from it until elements come back
                self.pause_reading()

    def resume_reading(self) -> None:
        """Read again; the time not read is not the worker's silence (session.py)."""
        self.stream.resume_reading()
        if self.paused_at and (session := self.session) is not None:  # since it was heard
            session.not_read_for(time.monotonic() - max(self.paused_at, session.last_seen))
        self.paused_at = 0.0
