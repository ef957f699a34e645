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
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from snet.protocol.errors import RemoteError
from snet.protocol.job import JobSpec
from snet.protocol.messages import NO_ELEMENT, Encoded, Message, Update
from snet.transport.inline import InlineChoice, timed

from .backend import ComputeBackend
from .buffers import WeightsBox, WeightsCopy
from .compression import UpdateCompressor
from .connection import ServerConnection
from .data import Corpus
from .policies import ComputePolicy, ComputeState
from .progress_log import ProgressLog
from .reports import Reports
from .update_timing import UpdateTiming
from .work import WorkQueue

T = TypeVar("T")  # what a computation in the compute thread returns


@dataclass
class SentCounts:
    """Updates a worker has sent on its current connection (the server's settled count,
    which its flow control compares with, starts anew on each; those of every connection
    are the progress log's ``updates``)."""

    this_connection: int = 0

    def one_more(self) -> None:
        self.this_connection += 1

    def new_connection(self) -> None:
        """The server's settled count starts anew."""
        self.this_connection = 0


@dataclass
class ComputedUpdate:
    """An update computed and not yet sent: all its message says but the version it is
    computed on, which is the weights' it is sent with."""

    lease_id: int
    offset: int
    count: int
    loss: float
    correct: int
    seconds: float
    gradient: np.ndarray  # the element; empty when ``encoded`` carries it
    encoded: Encoded | None
    cpu: float
    on_loop: bool


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
        self.compute, self.overlap = policy.make_compute(backend, box.layout, job)
        if self.overlap is not None:
            box.arrived = self._arrived
        self.per_update = policy.frames_per_update(job)
        self.last_base = -1  # the version its last update was computed on
        self.scratch = box.layout.allocate()
        self.held: ComputedUpdate | None = None  # computed, waiting for ``may_send``

    def file(self, message: Message) -> bool:
        """Nothing of the server's is this part's own (leases go to the work queue)."""
        return False

    def _state(self, weights: WeightsCopy) -> ComputeState:
        in_flight = self.sent.this_connection - weights.settled
        return ComputeState(weights.version, self.last_base, in_flight)

    def _arrived(self, weights: WeightsCopy) -> None:
        """Overlap: weights holding the update sent last are what the next one will be
        sent on: offered to move onto at once (at the next bunch, or the next block's
        start if none is computing). Not while an update is held: it moves onto the
        newest weights when it is sent, and a copy offered now would only be dropped."""
        if self.held is None and self.policy.may_send(self._state(weights)):
            assert self.overlap is not None
            self.overlap.offer(weights.flat)

    async def step(self, wake: asyncio.Event) -> RemoteError | None:
        """Compute and send the next update, or wait for ``wake`` when the policy says not
        yet (or no weights or frames are at hand). Never a refusal of its own (None).

        A held update (overlap) goes first, once the policy allows: moved onto the newest
        weights, and sent once the next one has begun computing, so that the compute
        thread does not wait for the sending (1.5 ms of a 164 kB element's system call
        on a shaped bridge)."""
        box, connection = self.box, self.connection
        weights = box.take_newest()
        outgoing = None
        if self.held is not None:
            assert weights is not None and self.overlap is not None
            if not self.policy.may_send(self._state(weights)):
                await wake.wait()
                return None
            outgoing, self.held = self.held, None  # moved onto the newest when sent
        ready = weights is not None and self.work.lease_ready(self.corpus)
        if ready:
            assert weights is not None
            state = self._state(weights)
            if outgoing is not None:  # as it will be, once sent
                state = ComputeState(state.version, state.version, state.in_flight + 1)
            ready = self.policy.may_compute(state)
        if not ready:
            if outgoing is not None:
                self._send(self._move_held_onto_newest(), outgoing)
            else:
                await wake.wait()
            return None
        assert weights is not None and connection.send_buffers is not None
        if self.timing is not None and self.overlap is None:  # overlap: taken mid-block,
            self.timing.bunch_started(weights.settled)  # which a block's start would overstate
        lease, offset, frames = self.work.next_bunch(self.per_update)
        rate = lease.learning_rate or weights.learning_rate  # bmuf: the lease's epoch
        started = time.perf_counter()
        # see InlineChoice; an overlapping block never: it moves onto weights that come
        # while it computes, and the loop must read them
        on_loop = self.overlap is None and self.compressor is None and self.inline.chosen
        if self.compressor is None:
            gradient = await connection.send_buffers.acquire()
        else:  # the encoded parts are new arrays: one scratch gradient buffer will do
            gradient = np.zeros(0, dtype=np.float32)
        if outgoing is not None:  # newer weights may have come while it waited for a buffer
            weights = self._move_held_onto_newest()
        if self.compressor is None:
            call = (self.compute, weights.flat, frames, gradient, rate)
            if on_loop:  # never with an update held back (overlap)
                computed, cpu = timed(*call)
            else:
                computed, cpu = await self._computed(weights, outgoing, *call)
            loss, correct, count = computed
            encoded = None
        else:
            key = (lease.lease_id, offset)
            encoded_update, cpu = await self._computed(
                weights, outgoing, self.compressor.computed, self.compute, weights.flat, frames,
                self.scratch, rate, key,
            )  # fmt: skip
            loss, correct, count, encoded = encoded_update
        self.inline.measured(cpu)  # the bunch's CPU: a busy machine's waits left out
        seconds = time.perf_counter() - started
        update = ComputedUpdate(lease.lease_id, offset, count, loss, correct, seconds,
                                gradient, encoded, cpu, on_loop)  # fmt: skip
        self.work.advance(count)
        if self.overlap is None:
            self._send(weights, update)
        else:
            self.held = update  # the next turn sends it, when the policy allows
        if on_loop:  # let the loop read what came meanwhile: the next bunch takes the newest
            await asyncio.sleep(0)
        return None

    async def _computed(
        self, weights: WeightsCopy, outgoing: ComputedUpdate | None,
        function: Callable[..., T], *args: object,
    ) -> tuple[T, float]:  # fmt: skip
        """``function(*args)`` and its CPU seconds, in the compute thread; ``outgoing``, a
        held update, is sent on ``weights`` once it has begun, so that the compute thread
        does not wait for the sending."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, timed, function, *args)
        if outgoing is not None:
            self._send(weights, outgoing)
        return await future

    def _board_slot(self) -> int:
        """The slot of the update board the next update goes in, or -1 (its frame): the
        update that used it last must be settled, so that the server has copied it out
        (updates arrive in order, and the server settles none it has not received). Never
        with a fault switch: the updates it drops are settled by the server's estimate,
        which could run ahead of those received."""
        board = self.connection.update_board
        if board is None or self.connection.faults is not None:
            return -1
        number = self.sent.this_connection + 1  # this update's, counted from 1
        slots = board.info.slots
        return number % slots if number - slots <= self.box.settled else -1

    def _move_held_onto_newest(self) -> WeightsCopy:
        """Overlap: the held update's progress onto the newest weights, which it is sent
        on; here, with no await until it is sent, so that no weights offered meanwhile
        (they would hold only the update before it) move the next block."""
        weights = self.box.take_newest()
        assert weights is not None and self.overlap is not None
        self.overlap.rebase(weights.flat)
        return weights

    def _send(self, weights: WeightsCopy, update: ComputedUpdate) -> None:
        """Send ``update`` as computed on ``weights``, and count it."""
        box, connection = self.box, self.connection
        element, slot = update.gradient, self._board_slot() if update.encoded is None else -1
        if update.encoded is None:
            assert connection.send_buffers is not None
            if slot >= 0:  # into the update board the server made for it: the buffer is free
                assert connection.update_board is not None
                connection.update_board.write(slot, update.gradient)
                connection.send_buffers.release(update.gradient)
                element = NO_ELEMENT
            else:
                connection.send_buffers.mark_in_flight(update.gradient)
        connection.send(Update(weights.version, update.lease_id, update.offset, update.count,
                               update.loss, update.correct, update.seconds, element,
                               encoded=update.encoded, slot=slot))  # fmt: skip
        self.sent.one_more()
        self.progress.update_sent(update.lease_id, update.offset, update.count, weights.version,
                                  box.newest_version, update.seconds)  # fmt: skip
        if self.timing is not None:
            self.timing.computed(update.cpu, update.on_loop)
            self.timing.sent(self.sent.this_connection)
        self.reports.update_sent(connection, self.sent.this_connection, self.progress.updates)
        self.last_base = weights.version
