"""``UpdateIntake``: an update from the wire checked and turned into a ``PendingUpdate``.

Everything that can be known about an update before its step is checked here: the agreed
codec (a compressed update is decoded into a free pooled element, so the update rule only
ever sees float32 elements), the element's layout, the weights version it names (the
mode's policy says which versions it takes), the figures it reports (counts within its
patterns, a finite loss: server/plausible.py), and its claim on the lease (the lease book
says which frames it covers). A refused update's frames are queued again, so nothing is
lost. Its values (norm, NaN, Inf) are checked in the step thread (server/stepping.py).
"""

from __future__ import annotations

import time
from typing import NoReturn

import numpy as np

from snet.protocol.errors import CodecError, RejectedUpdate
from snet.protocol.messages import Update
from snet.protocol.network import ElementLayout

from .decoding import UpdateDecoder
from .leases import LeaseBook
from .policies import StepPolicy
from .pool import ElementLoan, ElementPool, Received
from .reported import update_figures_problem
from .session import WorkerSession
from .stepping import PendingUpdate


class UpdateIntake:
    """Checks updates against the layout, the policy and the lease book."""

    def __init__(
        self, layout: ElementLayout, pool: ElementPool, book: LeaseBook, policy: StepPolicy
    ) -> None:
        self.layout = layout
        self.pool = pool
        self.book = book
        self.policy = policy
        self.decoder = UpdateDecoder(layout, pool)

    def arrived(self, session: WorkerSession, received: Received) -> bool:
        """Note an update's arrival; False if it came before (one delivery taken once,
        settled once; nothing of it kept). Updates it shows were lost on the way
        are settled, so the worker's flow control recovers, and their frames queued."""
        message = received.message
        if self.book.is_repeat(session.worker_id, message.lease_id, message.offset):
            session.warn("update of %s on lease %d offset %d came again; ignored", session.name,
                         message.lease_id, message.offset)  # fmt: skip
            return False
        session.clock.update_arrived(time.monotonic(), message.patterns, message.compute_seconds)
        session.alive()  # it may hold leases again
        lost, updates = self.book.lost_before(
            session.worker_id, message.lease_id, message.offset, message.patterns
        )
        if lost:
            session.settled_lost(updates)
            session.warn("updates of %s were lost: %d frames back in the queue", session.name,
                         lost)  # fmt: skip
        return True

    def admit(
        self, session: WorkerSession, received: Received, version: int, stepping: bool = False
    ) -> PendingUpdate:
        """The update as a pending one (it then owns the loan ``received`` held), or
        ``RejectedUpdate`` naming the update (the worker's error feedback needs the name);
        on refusal nothing of it is kept (the connection gives its element back)."""
        message = received.message
        if session.ledger is not None:
            payload = message.encoded.nbytes if message.encoded else message.element.nbytes
            board = message.slot >= 0  # from its update board: no element crossed the wire
            raw = 0 if board else self.layout.nbytes
            session.ledger.record_update(payload, raw, board and received.loan is not None)
        try:
            if message.encoded is not None:
                received.adopt(self._decode(session, message))
            # While a step runs, a mode that takes no stale update judges one by the version
            # that step makes: on the current one, it would be applied a round late.
            upcoming = version + int(stepping and not self.policy.stale_updates)
            frames = self._check(session, message, received, upcoming)
            received.fill()  # from its update board, now that it is worth the copy
        except RejectedUpdate as exc:  # the connection releases what was not kept
            raise RejectedUpdate(str(exc), message.lease_id, message.offset, exc.numeric) from exc
        return PendingUpdate(session, message, frames, received.keep())

    def _decode(self, session: WorkerSession, message: Update) -> ElementLoan:
        assert message.encoded is not None
        agreed = session.ledger.update_codec if session.ledger is not None else "none"
        try:
            return self.decoder.decode(agreed, message.encoded)
        except CodecError as exc:
            if session.ledger is not None:
                session.ledger.count_undecodable()
            self._refuse(session, message, f"undecodable update: {exc}")

    def _refuse(
        self, session: WorkerSession, message: Update, reason: str, numeric: bool = False
    ) -> NoReturn:
        # The lease moves past these frames and they are queued again: nothing is lost.
        # (skip() itself refuses a claim on frames the worker does not hold.)
        self.book.skip(session.worker_id, message.lease_id, message.offset, message.patterns)
        raise RejectedUpdate(reason, numeric=numeric)

    def _check(
        self,
        session: WorkerSession,
        message: Update,
        received: Received,
        version: int,
    ) -> np.ndarray:
        reason = ""
        agreed = session.ledger.update_codec if session.ledger is not None else "none"
        if message.encoded is None and agreed != "none":
            reason = f"update sent as float32, agreed codec is {agreed}"
        elif received.turned_away:  # pool.py: a newcomer's share of the elements is taken
            reason = (
                "the server's update elements for workers none of whose updates is applied "
                "yet are all in use: its frames are leased again"
            )
        elif received.loan is None and message.slot >= 0:
            reason = (
                f"update in slot {message.slot} of an update board this worker has not got"
                if message.element.size == 0 and message.encoded is None
                else f"update names slot {message.slot} of its update board and carries an element"
            )
        elif received.loan is None:  # the pool takes only payloads of the element's layout
            reason = (
                f"update element has shape {tuple(message.element.shape)} "
                f"{message.element.dtype}, the network needs ({self.layout.size},) float32"
            )
        else:
            reason = self.policy.refusal(message.base_version, version)
        if reason:
            self._refuse(session, message, reason)
        figures = update_figures_problem(
            message.patterns, message.correct, message.loss_sum, message.compute_seconds
        )
        if figures:  # e.g. a loss that is no longer finite: what a diverging job sends
            self._refuse(session, message, figures, numeric=True)
        return self.book.accept(
            session.worker_id, message.lease_id, message.offset, message.patterns
        )
