"""``WorkQueue``: what a worker has been given to do and has not done yet.

Leases (each trained in its cache order, bunch by bunch, from an offset), evaluation
requests, and, for a worker fed inline, the frames the server sends for them. Work is
ready only once every frame its context windows read is at hand.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from snet.protocol.errors import ProtocolError
from snet.protocol.job import JobSpec
from snet.protocol.messages import Evaluate, Frames, Lease, Message
from snet.protocol.network import ElementLayout
from snet.protocol.numbering import shown_epoch

from .data import Corpus, HeldLease, add_frames

log = logging.getLogger("snet.worker")


class WorkQueue:
    """Leases and evaluation requests in the order received, and the position in the first."""

    def __init__(self) -> None:
        self.leases: deque[HeldLease] = deque()
        self.evaluations: deque[Evaluate] = deque()
        self.offset = 0

    def clear(self) -> None:
        self.leases.clear()
        self.evaluations.clear()
        self.offset = 0

    def file(self, message: Message, job: JobSpec | None, corpus: Corpus | None) -> bool:
        """Take a Lease, Frames or Evaluate message; False for any other message.
        ``ProtocolError`` for one that cannot be of this job and data (a lease of frames
        beyond the data, an element of another size: the worker ended in a traceback)."""
        if problem := _problem(message, job, corpus):
            raise ProtocolError(problem)
        if isinstance(message, Lease):
            assert job is not None
            self.leases.append(HeldLease.of(message, job))
            log.debug("lease %d: %d frames of epoch %d", message.lease_id, len(message.indices),
                      shown_epoch(message.epoch))  # fmt: skip
        elif isinstance(message, Frames):
            if corpus is None or not add_frames(corpus, message):
                log.warning("frames from the server, but this worker reads its own data")
        elif isinstance(message, Evaluate):
            self.evaluations.append(message)
        else:
            return False
        return True

    def revoke(self, lease_id: int) -> None:
        """The server took lease ``lease_id`` back: drop its remaining frames, if any
        (another worker trains them; updates on them would be refused), unless it is all
        the work left: the server leases nothing more to a worker whose leases it took
        back until an update of its arrives (refused or not, it shows the worker alive), so
        one that dropped its only lease before starting it never trained again. That one
        is kept for one more bunch (its refused update is the sign of life), not to its
        end: each bunch of it is refused, and the rounds of sync mode waited for them."""
        for index, held in enumerate(self.leases):
            if held.lease.lease_id == lease_id and len(self.leases) == 1:
                held.revoked = True
            elif held.lease.lease_id == lease_id:
                del self.leases[index]
                if index == 0:
                    self.offset = 0  # the next lease starts at its beginning
                return

    def evaluation(self, corpus: Corpus) -> Evaluate | None:
        """The next evaluation request, once the CV frames are at hand."""
        if self.evaluations and corpus.ready_for(corpus.cv_frames):
            return self.evaluations.popleft()
        return None

    def lease_ready(self, corpus: Corpus | None) -> bool:
        """A lease is held and every frame it needs is at hand."""
        if not self.leases or corpus is None:
            return False
        held = self.leases[0]
        held.ready = held.ready or corpus.ready_for(held.order)
        return held.ready

    def next_bunch(self, bunch_size: int) -> tuple[Lease, int, np.ndarray]:
        """(lease, offset, frames) of the next bunch; ``advance`` when it is sent."""
        held = self.leases[0]
        count = min(bunch_size, len(held.order) - self.offset)
        return held.lease, self.offset, held.order[self.offset : self.offset + count]

    def advance(self, count: int) -> None:
        self.offset += count
        if self.offset >= len(self.leases[0].order) or self.leases[0].revoked:
            self.leases.popleft()
            self.offset = 0


def _problem(message: Message, job: JobSpec | None, corpus: Corpus | None) -> str:
    """Why a Lease or Evaluate from the server cannot be of ``job`` and ``corpus``."""
    if isinstance(message, Lease) and corpus is not None:
        indices = message.indices
        if indices.ndim != 1 or indices.dtype.kind not in "iu" or not len(indices):
            return (f"lease {message.lease_id} holds {indices.shape} values of type "
                    f"{indices.dtype}, not frame numbers")  # fmt: skip
        low, high, frames = int(indices.min()), int(indices.max()), corpus.bounds.total_frames
        if low < 0 or high >= frames:
            return f"lease {message.lease_id} names frames {low} to {high}; the data has {frames}"
    if isinstance(message, Evaluate) and job is not None:
        size = ElementLayout.for_network(job.network).size
        if message.element.shape != (size,):
            return f"weights to evaluate of shape {message.element.shape}, the job's are ({size},)"
    return ""
