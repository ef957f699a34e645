"""``LeaseBook``: the division of each epoch's training frames among the workers.

Each epoch the training frames are shuffled (seeded by the job's seed and the epoch) and
cut into chunks (or, with ``sequential``, cut into chunks of consecutive frames whose
order alone is shuffled). A worker holds leases on chunks and trains on a lease's frames
bunch by bunch, in the order ``protocol.shuffle.cache_order`` gives (its shuffle within a
cache of several bunches, which the book reproduces); each update names its lease and
offset, so the book knows exactly which frames every update used. Frames a worker never
delivered (it died, disconnected, or an update was refused) go back to the front of the
queue as a new chunk, and so do frames whose update was lost on the way (a later update
of the same worker shows the gap). The ledger counts, per epoch, how often each training frame was
applied: every frame exactly once, whatever joins or leaves, is the invariant the tests
and ``/status`` check.

**Lease sizes** (with ``bunch_frames`` set, as a server's book has, and two workers or
more): a chunk is cut to its lease's size when it is granted, never bigger than
``chunk_frames`` and a whole number of bunches: a part of the frames still waiting divided
among all the leases the workers hold at once (``lease_size``), so a small data set is
spread over every worker instead of a few chunks going to a few of them; sizes shrink as
the epoch goes on, and its tail, the last ``TAIL_ROUNDS`` rounds' worth of frames and
more, is leased one bunch at a time, so every worker holds frames until the very end
and every step but the epoch's last holds one full bunch from each of them (the global
bunch). The last step holds what is left; the update
rule divides by its pattern count, and the trace lists its updates. A lone worker (and
the sequential trainer, cli/offline.py) keeps the fixed chunks: its steps are full anyway.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snet.protocol.errors import RejectedUpdate
from snet.protocol.job import JobSpec
from snet.protocol.shuffle import cache_order

from .epoch_chunks import EpochChunks

LEASES_PER_WORKER = 2  # the next chunk is always at hand, so no worker idles between chunks
TAIL_ROUNDS = 4  # rounds of the epoch's end leased a bunch at a time


def lease_size(waiting: int, workers: int, bunch: int, chunk_frames: int) -> int:
    """Frames in the next lease when ``waiting`` frames wait for ``workers`` workers of
    ``bunch`` frames per update: a ``TAIL_ROUNDS``-th of each lease holder's share of what
    waits, a whole number of bunches, at most ``chunk_frames``. So sizes shrink smoothly
    to one bunch over the epoch's last ``TAIL_ROUNDS`` rounds and whatever a worker holds
    is done long before the queue runs dry (a jump from 4 bunches to 1 let a worker's two
    4-bunch leases outlast the others' tail: two one-worker steps at the epoch's end)."""
    share = waiting // (workers * LEASES_PER_WORKER * TAIL_ROUNDS) // bunch * bunch
    return max(bunch, min(share, chunk_frames // bunch * bunch or bunch))


@dataclass
class LeaseRecord:
    """One chunk of frames leased to one worker."""

    lease_id: int
    epoch: int
    worker_id: int
    indices: np.ndarray  # in the order the worker trains on them
    chunk: np.ndarray  # as the Lease message carries them (before the worker's shuffle)
    received: int = 0  # frames covered by accepted updates (updates arrive in order)

    @property
    def remaining(self) -> int:
        return len(self.indices) - self.received


@dataclass
class EpochLedger:
    """How often each training frame was applied in one epoch."""

    epoch: int
    uses: np.ndarray
    train_frames: np.ndarray
    requeued_frames: int = 0
    chunks: int = 0

    def summary(self) -> dict[str, Any]:
        counts = self.uses[self.train_frames]
        return {
            "epoch": self.epoch,
            "frames": len(self.train_frames),
            "used_once": int((counts == 1).sum()),
            "used_more": int((counts > 1).sum()),
            "unused": int((counts == 0).sum()),
            "requeued_frames": self.requeued_frames,
            "chunks": self.chunks,
        }


@dataclass
class LeaseBook:
    """Chunks waiting, leases held, and the per-epoch ledger."""

    train_frames: np.ndarray
    total_frames: int
    chunk_frames: int
    seed: int
    cache_frames: int = 1  # the workers' shuffle cache (bunches x bunch size)
    sequential: bool = False
    bunch_frames: int = 0  # a worker update's frames (0: fixed chunks of chunk_frames)
    epochs: int = 0  # the job's (its last epoch's shuffle needs no next); 0: not known
    epoch: int = -1
    _queue: deque[np.ndarray] = field(default_factory=deque)
    _leases: dict[int, LeaseRecord] = field(default_factory=dict)
    _next_id: int = 1
    accepted_frames: int = 0
    applied_frames: int = 0
    _ledger: EpochLedger | None = None  # the current epoch's (its summary is kept in stats)
    _used_up: dict[int, int] = field(default_factory=dict)  # this epoch: lease id -> worker id
    _largest: dict[int, int] = field(default_factory=dict)  # worker id -> its largest update
    granted: dict[int, int] = field(default_factory=dict)  # frames leased per worker, epoch
    _chunks: EpochChunks = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._chunks = EpochChunks(
            self.train_frames, self.seed, self.chunk_frames, self.sequential, self.epochs
        )

    @classmethod
    def for_job(
        cls,
        job: JobSpec,
        train_frames: np.ndarray,
        total_frames: int,
        chunk: int,
        update_frames: int | None = None,
    ) -> LeaseBook:
        """The book for ``job``'s seed, shuffle cache and frame order, in chunks of
        ``chunk`` frames, cut in whole updates of ``update_frames`` (default: a bunch; the
        mode's combination says both: ``Combination.chunk_frames``, ``update_frames``)."""
        return cls(
            train_frames,
            total_frames,
            chunk,
            job.seed,
            cache_frames=job.bunch_size * job.shuffle_cache_bunches,
            sequential=job.frame_order == "sequential",
            bunch_frames=job.bunch_size if update_frames is None else update_frames,
            epochs=job.epochs,
        )

    def start_epoch(self, epoch: int) -> None:
        """Shuffle the training frames for ``epoch`` and queue them as chunks."""
        self.epoch = epoch
        self._queue = deque(self._epoch_chunks(epoch))
        self.accepted_frames = self.applied_frames = 0
        self._used_up.clear()  # bounded: a repeat is told apart within its epoch
        self.granted = {}
        # One count array, reused: an ended epoch's ledger lives on as its summary only
        # (a server that kept every epoch's array grew 0.11 MB per epoch).
        if self._ledger is None:
            uses = np.zeros(self.total_frames, np.uint16)
        else:
            uses = self._ledger.uses
            uses.fill(0)
        self._ledger = EpochLedger(epoch, uses, self.train_frames)
        self._ledger.chunks = len(self._queue)

    def _epoch_chunks(self, epoch: int) -> list[np.ndarray]:
        """The chunks of ``epoch`` in leasing order (server/epoch_chunks.py)."""
        return self._chunks.of_epoch(epoch)

    def checkpoint_state(self) -> dict[str, Any]:
        """The current epoch's ledger (which frames the current weights include) and the
        lease counter; ended epochs live on as summaries in the statistics.

        Leases are not saved: on restore every frame of the epoch not yet applied is
        queued again, whether it was waiting, leased, or in an update not yet applied."""
        ledger = self._ledger
        saved = None
        if ledger is not None:  # it changes with every step: copied
            saved = {
                "epoch": ledger.epoch,
                "uses": ledger.uses.copy(),
                "requeued_frames": ledger.requeued_frames,
                "chunks": ledger.chunks,
            }
        return {"epoch": self.epoch, "next_lease": self._next_id, "ledger": saved}

    def restore_checkpoint(self, state: dict[str, Any]) -> int:
        """Continue from ``checkpoint_state()``; returns the frames queued again.

        The epoch's chunks are rebuilt in their order with the applied frames left out, so
        each training frame is still applied exactly once with respect to the weights."""
        saved = state["ledger"]
        self._ledger = None
        if saved is not None:
            uses = np.asarray(saved["uses"], np.uint16)
            if uses.shape != (self.total_frames,):
                raise ValueError(f"the ledger is not of {self.total_frames} frames")
            requeued, chunks = int(saved["requeued_frames"]), int(saved["chunks"])
            self._ledger = EpochLedger(
                int(saved["epoch"]), uses, self.train_frames, requeued, chunks
            )
        self.epoch, self._next_id = int(state["epoch"]), int(state["next_lease"])
        self._leases = {}
        self._queue = deque()
        self._used_up.clear()
        self._largest.clear()
        self.accepted_frames = self.applied_frames = 0
        if self.epoch < 0:
            return 0
        uses = self.ledger.uses
        for chunk in self._epoch_chunks(self.epoch):
            left = chunk[uses[chunk] == 0]
            if len(left):
                self._queue.append(left)
        self.applied_frames = self.accepted_frames = int(uses[self.train_frames].sum())
        return sum(len(chunk) for chunk in self._queue)

    @property
    def ledger(self) -> EpochLedger:
        if self._ledger is None:
            raise RuntimeError("no epoch has started")
        return self._ledger

    def grant(self, worker_id: int, workers: int = 1) -> LeaseRecord | None:
        """Lease the next waiting chunk to ``worker_id`` (one of ``workers`` connected), cut
        to its lease size (see the module's notes); None when none is waiting."""
        if not self._queue:
            return None
        chunk = self._queue.popleft()
        if self.bunch_frames and workers > 1:
            waiting = len(chunk) + sum(len(c) for c in self._queue)
            size = lease_size(waiting, workers, self.bunch_frames, self.chunk_frames)
            if len(chunk) > size:
                self._queue.appendleft(chunk[size:])
                chunk = chunk[:size]
                self.ledger.chunks += 1
        self.granted[worker_id] = self.granted.get(worker_id, 0) + len(chunk)
        order = cache_order(chunk, self._next_id, self.seed, self.cache_frames)
        lease = LeaseRecord(self._next_id, self.epoch, worker_id, order, chunk)
        self._next_id += 1
        self._leases[lease.lease_id] = lease
        return lease

    def held_by(self, worker_id: int) -> list[LeaseRecord]:
        return [lease for lease in self._leases.values() if lease.worker_id == worker_id]

    def holders(self) -> set[int]:
        """The workers that hold frames no update has arrived for yet, in one pass (asked
        after every step: per worker, ``remaining_frames`` scans every lease out)."""
        # ``remaining`` written out: a property's call per lease, after every step
        return {
            lease.worker_id
            for lease in self._leases.values()
            if len(lease.indices) > lease.received
        }

    def remaining_frames(self, worker_id: int) -> int:
        """Frames leased to the worker for which no update has arrived yet."""
        return sum(lease.remaining for lease in self.held_by(worker_id))

    def accept(self, worker_id: int, lease_id: int, offset: int, patterns: int) -> np.ndarray:
        """Check an update's claim against the lease; return the frames it covers."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id:
            raise RejectedUpdate(f"lease {lease_id} is not held by this worker")
        if offset != lease.received or patterns < 1 or offset + patterns > len(lease.indices):
            raise RejectedUpdate(
                f"lease {lease_id}: update covers {offset}:{offset + patterns}, "
                f"next expected offset is {lease.received} of {len(lease.indices)}"
            )
        lease.received += patterns
        self.accepted_frames += patterns
        self._largest[worker_id] = max(self._largest.get(worker_id, 0), patterns)
        frames = lease.indices[offset : offset + patterns]
        if lease.remaining == 0:
            del self._leases[lease_id]
            self._used_up[lease_id] = worker_id
        return frames

    def is_repeat(self, worker_id: int, lease_id: int, offset: int) -> bool:
        """True for an update of ``worker_id`` on frames of its lease that an earlier
        update already covered: a second delivery of one update (a worker never resends;
        see ``skip``), to be ignored rather than refused, which would settle it twice.
        A negative offset names no frames at all, so it is never a repeat: ignored, it
        was never settled either, and the worker's flow control waited on it for ever."""
        if offset < 0:
            return False
        lease = self._leases.get(lease_id)
        if lease is not None:
            return lease.worker_id == worker_id and offset < lease.received
        return self._used_up.get(lease_id) == worker_id

    def lost_before(
        self, worker_id: int, lease_id: int, offset: int, patterns: int
    ) -> tuple[int, int]:
        """What an update of ``patterns`` frames on ``(lease_id, offset)`` shows was lost
        on the way: ``(frames, updates)``.

        A worker trains its leases in the order granted and each lease from its start,
        so an update there means every earlier update was sent: the rest of the worker's
        earlier leases, and this lease's frames before ``offset`` that no update covered,
        were in updates that never arrived. They go back to the queue and the leases
        move past them. The updates are counted in the largest this worker has delivered
        (or this one): exact when its updates are all of one size (a bunch, a block),
        never too many, so that its flow control recovers and is never loosened.
        Nothing for a claim on a lease the worker does not hold, or outside the lease (a
        negative offset, refused next, took the worker's earlier leases back).
        """
        lease = self._leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id or not 0 <= offset <= len(lease.indices):
            return 0, 0
        gaps: list[np.ndarray] = []
        for earlier in self.held_by(worker_id):
            if earlier.lease_id < lease_id:  # granted (and so trained) before this one
                gaps.append(earlier.indices[earlier.received :])
                del self._leases[earlier.lease_id]
        if offset > lease.received:
            gaps.append(lease.indices[lease.received : offset])
            lease.received = offset
        size = max(self._largest.get(worker_id, 0), patterns, 1)
        for frames in gaps:
            self.requeue(frames)
        sizes = [len(frames) for frames in gaps if len(frames)]
        return sum(sizes), sum(-(-n // size) for n in sizes)

    def skip(self, worker_id: int, lease_id: int, offset: int, patterns: int) -> None:
        """An update for these frames was refused: the lease moves on, the frames requeue."""
        frames = self.accept(worker_id, lease_id, offset, patterns)
        self.accepted_frames -= patterns
        self.requeue(frames)

    def unaccept(self, frames: np.ndarray) -> None:
        """Frames of an accepted update that was refused when it came to be applied."""
        self.accepted_frames -= len(frames)
        self.requeue(frames)

    def requeue(self, frames: np.ndarray) -> None:
        if len(frames):
            self._queue.appendleft(np.array(frames))
            self.ledger.requeued_frames += len(frames)

    def worker_gone(self, worker_id: int) -> int:
        """Return the undelivered part of every lease of a worker to the queue."""
        self._largest.pop(worker_id, None)
        returned = 0
        for lease in self.held_by(worker_id):
            self.requeue(lease.indices[lease.received :])
            returned += lease.remaining
            del self._leases[lease.lease_id]
        return returned

    def record_applied(self, frames: np.ndarray) -> None:
        self.ledger.uses[frames] += 1
        self.applied_frames += len(frames)

    @property
    def epoch_complete(self) -> bool:
        """Every chunk leased, every lease delivered, every delivered frame applied."""
        return (
            self.epoch >= 0
            and not self._queue
            and not self._leases
            and self.applied_frames == self.accepted_frames
        )

    @property
    def waiting_chunks(self) -> int:
        return len(self._queue)

    @property
    def leases_out(self) -> int:
        return len(self._leases)
