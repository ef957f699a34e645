"""``InlineFrames``: raw frames sent by the server to workers that cannot read the data.

A worker that answers ``FramesWanted`` is sent, before each lease and before its first
evaluation, a ``Frames`` message with the normalised raw frames the context windows of
those frames read and that it was not sent before on this connection: each frame
crosses the wire at most once per connection, and the windows are cut on the worker.
"""

from __future__ import annotations

import logging

import numpy as np

from snet.data.corpus import SourceStore
from snet.protocol.messages import Frames

from .dataplan import DataPlan
from .session import WorkerSession

log = logging.getLogger("snet.server")


class InlineFrames:
    """Which rows each inline worker holds, and the Frames messages that complete them."""

    def __init__(self, plan: DataPlan, context: int) -> None:
        self.plan = plan
        self.context = context
        self.store = SourceStore(plan.source, plan.norms)
        self._sent: dict[int, np.ndarray] = {}  # worker id -> rows sent (bool per frame)
        self.frames_sent = 0
        self.bytes_sent = 0

    def start(self, worker_id: int) -> None:
        self._sent[worker_id] = np.zeros(self.plan.total_frames, dtype=bool)

    def forget(self, worker_id: int) -> None:
        self._sent.pop(worker_id, None)

    def frames_for(self, worker_id: int, centres: np.ndarray) -> Frames | None:
        """The rows the windows of ``centres`` need that the worker lacks, or None."""
        sent = self._sent.get(worker_id)
        if sent is None:
            return None
        rows = self.plan.bounds.needed_rows(centres, self.context)
        rows = rows[~sent[rows]]
        if len(rows) == 0:
            return None
        sent[rows] = True
        features = self.store.take(rows)
        labels = self.store.labels_of(rows).astype("<i4")
        self.frames_sent += len(rows)
        self.bytes_sent += features.nbytes + labels.nbytes + rows.nbytes
        return Frames(indices=rows.astype("<i8"), features=features, labels=labels)

    def begin(
        self, session: WorkerSession, reason: str, chunks: list[np.ndarray], evaluating: bool
    ) -> None:
        """A worker said ``FramesWanted``: send what its leases (and evaluation) need.
        Said again on the same connection, it is ignored: starting afresh would send the
        held leases' frames again, hundreds of kilobytes for each few dozen bytes in."""
        if session.worker_id in self._sent:
            session.warn("worker %s said frames_wanted again (%s); ignored", session.name,
                         reason[:100])  # fmt: skip
            return
        log.info("worker %s cannot read the data (%s): frames go inline", session.name, reason)
        session.fed_inline()
        self.start(session.worker_id)
        for chunk in chunks:
            self.send(session, chunk)
        if evaluating:
            self.send(session, self.plan.cv_frames)

    def send(self, session: WorkerSession, centres: np.ndarray) -> None:
        """Send the worker the frames ``centres`` need, if it is fed inline and lacks any."""
        frames = self.frames_for(session.worker_id, centres)
        if frames is not None:
            session.send(frames)
