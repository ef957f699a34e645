"""``LeaseDesk``: which worker gets which chunk of frames, and when.

The lease book (leases.py) keeps the chunks, the leases and the ledger; the desk decides
whom to give them to: nobody before ``min_workers`` have joined (then never again held
back, so a fixed set of workers starts together), workers that have delivered first, up to
``LEASES_PER_WORKER`` each so the next chunk is always at hand; a newcomer one (it may
never compute: issue 12); a worker whose leases were taken back for sitting on them (or
handed over at an epoch's end, far slower than an idle worker: server/lateness.py) none
until it delivers. A worker that cannot read the data gets its frames inline
(``InlineFrames``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from snet.protocol.messages import LEASE_REVOKED, ErrorMessage, FramesWanted, Lease
from snet.protocol.numbering import shown_epoch

from .inline import InlineFrames
from .leases import LEASES_PER_WORKER, LeaseBook
from .session import WorkerSession

log = logging.getLogger("snet.server")


class LeaseDesk:
    """Grants the lease book's chunks to workers."""

    def __init__(self, book: LeaseBook, inline: InlineFrames, min_workers: int) -> None:
        self.book = book
        self.inline = inline
        self.min_workers = min_workers
        self._quorum = False  # min_workers have joined (once: leasing then goes on)
        self._joined_told = -1  # the count last logged while waiting (said once per change)

    def holding_back(self, joined: int) -> bool:
        """No frames are leased yet: fewer than ``min_workers`` have joined so far."""
        return not self._quorum and joined < self.min_workers

    def fill(self, sessions: Iterable[WorkerSession], rate: float) -> None:
        """Lease waiting chunks to the workers that should hold more (``rate``: the
        epoch's learning rate, which bmuf workers train at)."""
        workers = list(sessions)
        if not self._quorum:
            if len(workers) < self.min_workers:
                if len(workers) != self._joined_told:
                    log.info("%d of %d workers joined; waiting", len(workers), self.min_workers)
                    self._joined_told = len(workers)
                return
            self._quorum = True
        for session in sorted(workers, key=lambda s: not s.proven):
            if session.probation:
                continue
            wanted = LEASES_PER_WORKER if session.proven else 1
            while len(self.book.held_by(session.worker_id)) < wanted:
                lease = self.book.grant(session.worker_id, len(workers))
                if lease is None:
                    return
                session.clock.got_work(time.monotonic())
                session.refresh()  # the weights first: an idle worker was not sent each step's
                self.inline.send(session, lease.chunk)
                session.send(Lease(lease.lease_id, lease.epoch, lease.chunk.astype("<i8"), rate))
                log.debug("lease %d: %d frames of epoch %d to worker %s", lease.lease_id,
                          len(lease.chunk), shown_epoch(lease.epoch), session.name)  # fmt: skip

    def note_if_dry(self, session: WorkerSession) -> None:
        """A worker with no undelivered frames owes nothing until it is given some."""
        if self.book.remaining_frames(session.worker_id) == 0:
            session.clock.ran_dry()

    def wants_more(self, session: WorkerSession) -> bool:
        return len(self.book.held_by(session.worker_id)) < LEASES_PER_WORKER

    def frames_wanted(
        self, session: WorkerSession, message: FramesWanted, evaluating: bool
    ) -> None:
        """The worker cannot read the data: send its frames inline from now on."""
        chunks = [lease.chunk for lease in self.book.held_by(session.worker_id)]
        self.inline.begin(session, message.reason, chunks, evaluating)

    def worker_gone(self, session: WorkerSession) -> int:
        """Its undelivered frames go back to the queue; returns how many."""
        self.inline.forget(session.worker_id)
        return self.book.worker_gone(session.worker_id)

    def revoke(self, session: WorkerSession, late: bool = True) -> tuple[int, int]:
        """Take back a worker's undelivered leases, telling it (``lease_revoked``: it stops
        computing on them); no more for it until it delivers. ``late``: it delivered
        nothing in time; else it is far slower than the idle workers at an epoch's end
        (server/lateness.py). Returns (leases, frames)."""
        held = self.book.held_by(session.worker_id)
        said = "taken back: no update in time; others train it"
        if not late:
            said = "handed over: an idle worker trains it sooner"
        for lease in held:
            text = f"lease {lease.lease_id} {said}"
            session.send(ErrorMessage(LEASE_REVOKED, text, False, lease.lease_id))
        leases = len(held)
        frames = self.book.worker_gone(session.worker_id)
        session.taken_back([lease.lease_id for lease in held], late)
        session.clock.taken_back()
        return leases, frames
