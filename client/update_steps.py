"""``UpdateSteps``: what a worker of the data-parallel modes (sync, async, bmuf) does at
each turn of its compute loop: the next bunch of its leases, computed on the newest
weights it holds and sent as an update, when its mode's policy allows (``may_compute``).

np's workers answer the server's slices and bunches instead (``SliceWork``,
client/slice_work.py). The compute loop (client/worker.py) runs whichever of the two its
mode's policy makes (``ComputePolicy.make_turn``) and never asks which mode runs.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from snet.protocol.errors import RemoteError
from snet.protocol.job import JobSpec
from snet.protocol.messages import Message, Update
from snet.transport.inline import InlineChoice, timed

from .backend import ComputeBackend
from .buffers import WeightsBox
from .compression import UpdateCompressor
from .connection import ServerConnection
from .data import Corpus
from .policies import ComputePolicy, ComputeState
from .progress_log import ProgressLog
from .reports import Reports
from .update_timing import UpdateTiming
from .work import WorkQueue


@dataclass
class SentCounts:
    """Updates a worker has sent: in all, and on its current connection (the server's
    settled count, which its flow control compares with, starts anew on each)."""

    total: int = 0
    this_connection: int = 0

    def one_more(self) -> None:
        self.total += 1
        self.this_connection += 1

    def new_connection(self) -> None:
        """The server's settled count starts anew."""
        self.this_connection = 0


class UpdateSteps:
    """A bunch at a time, computed and sent as an update (one connection's)."""

    def __init__(
        self, policy: ComputePolicy, job: JobSpec, backend: ComputeBackend,
        connection: ServerConnection, box: WeightsBox, work: WorkQueue, corpus: Corpus,
        executor: Executor, inline: InlineChoice, compressor: UpdateCompressor | None,
        sent: SentCounts, progress: ProgressLog, reports: Reports, timing: UpdateTiming | None,
    ) -> None:  # fmt: skip
        self.policy, self.connection, self.box, self.work = policy, connection, box, work
        self.corpus, self.executor, self.inline = corpus, executor, inline
        self.compressor, self.sent = compressor, sent
        self.progress, self.reports, self.timing = progress, reports, timing
        self.compute = policy.make_compute(backend, box.layout, job)
        self.per_update = policy.frames_per_update(job)
        self.last_base = -1  # the version its last update was computed on
        self.scratch = box.layout.allocate()

    def file(self, message: Message) -> bool:
        """Nothing of the server's is this part's own (leases go to the work queue)."""
        return False

    async def step(self, wake: asyncio.Event) -> RemoteError | None:
        """Compute and send the next update, or wait for ``wake`` when the policy says not
        yet (or no weights or frames are at hand). Never a refusal of its own (None)."""
        box, connection = self.box, self.connection
        weights = box.take_newest()
        ready = weights is not None and self.work.lease_ready(self.corpus)
        if ready:
            assert weights is not None
            in_flight = self.sent.this_connection - box.settled
            ready = self.policy.may_compute(ComputeState(weights.version, self.last_base,
                                                         in_flight))  # fmt: skip
        if not ready:
            await wake.wait()
            return None
        assert weights is not None and connection.send_buffers is not None
        if self.timing is not None:
            self.timing.bunch_started(weights.settled)
        lease, offset, frames = self.work.next_bunch(self.per_update)
        rate = lease.learning_rate or weights.learning_rate  # bmuf: the lease's epoch
        started = time.perf_counter()
        on_loop = self.compressor is None and self.inline.chosen  # see InlineChoice
        loop = asyncio.get_running_loop()
        if self.compressor is None:
            gradient = await connection.send_buffers.acquire()
            call = (self.compute, weights.flat, frames, gradient, rate)
            if on_loop:
                computed, cpu = timed(*call)
            else:
                computed, cpu = await loop.run_in_executor(self.executor, timed, *call)
            loss, correct, count = computed
            connection.send_buffers.mark_in_flight(gradient)
            encoded = None
        else:  # the encoded parts are new arrays: one scratch gradient buffer will do
            key = (lease.lease_id, offset)
            encoded_update, cpu = await loop.run_in_executor(
                self.executor, timed, self.compressor.computed, self.compute, weights.flat,
                frames, self.scratch, rate, key,
            )  # fmt: skip
            loss, correct, count, encoded = encoded_update
            gradient = np.zeros(0, dtype=np.float32)
        self.inline.measured(cpu)  # the bunch's CPU: a busy machine's waits left out
        seconds = time.perf_counter() - started
        connection.send(Update(weights.version, lease.lease_id, offset, count, loss, correct,
                               seconds, gradient, encoded=encoded))  # fmt: skip
        self.sent.one_more()
        self.progress.update_sent(lease.lease_id, offset, count, weights.version,
                                  box.newest_version, seconds)  # fmt: skip
        if self.timing is not None:
            self.timing.computed(cpu, on_loop)
            self.timing.sent(self.sent.this_connection)
        self.reports.update_sent(connection, self.sent.this_connection, self.sent.total)
        self.last_base = weights.version
        self.work.advance(count)
        if on_loop:  # let the loop read what came meanwhile: the next bunch takes the newest
            await asyncio.sleep(0)
        return None
