"""``SliceWork``: an np-mode worker's queue of slices and bunches, and what each one does.

The server (server/slice_rounds.py) sends ``np_slice`` (take these hidden units) and
``np_bunch`` (apply this error; report the slice; forward these frames) messages; they
are applied strictly in the order received, one at a time in the compute thread, each
giving the messages to send back (``PartialOutputs``, a ``SliceState`` report). The
patterns are read from the worker's own copy of the data, as leases are in the other
modes; a worker fed inline frames cannot train in np mode (it would need every bunch).

Everything the server sends is checked before it is used: a slice inside the hidden
layer and of the right size, at most ``bunch_size`` frame indices inside the data, an
error of the bunch's shape (``SliceTrainer``); a violation is the server's bug and
raises ``ProtocolError``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol, runtime_checkable

import numpy as np

from snet.protocol.errors import ConfigError, ProtocolError, RefusedHere, RemoteError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WorkerMemory
from snet.protocol.messages import ErrorMessage, Message, NpBunch, PartialOutputs, SliceState
from snet.protocol.network import NetworkSpec
from snet.protocol.slices import HiddenSlice, slice_network
from snet.transport.inline import InlineChoice

from .data import Corpus
from .progress_log import ProgressLog
from .slice_trainer import SliceTrainer

log = logging.getLogger("snet.worker")

SliceMessage = SliceState | NpBunch


@runtime_checkable
class SliceHost(Protocol):
    """A backend that models the device a slice lives on (the emulated Spert board,
    client/spert/backend.py): its memory holds the slice or refuses it, and each pass
    takes the device's modelled time. The arithmetic is the ``SliceTrainer``'s. It states
    its memory when it joins, so that the server cuts it no slice it cannot hold."""

    def take_slice(self, spec: NetworkSpec, bunch: int) -> None: ...

    def stated_memory(self) -> WorkerMemory: ...

    def begin(self) -> tuple[float, float]: ...

    def slice_forward(self, patterns: int, started: tuple[float, float] | None = None) -> None: ...

    def slice_backward(self, patterns: int, started: tuple[float, float] | None = None) -> None: ...


class SliceWork:
    """Slices and bunches from the server, in order, and the worker's ``SliceTrainer``."""

    def __init__(self, job: JobSpec, corpus: Corpus, backend: object = None) -> None:
        self.job = job
        self.corpus = corpus
        self.host = backend if isinstance(backend, SliceHost) else None
        self.trainer = SliceTrainer(job.network, job.momentum)
        self.queue: deque[SliceMessage] = deque()
        self.bunches = 0  # forward passes computed (each after the previous one's update)
        self.patterns = 0  # the patterns of those bunches
        self.compute_seconds = 0.0
        self.last_seconds = 0.0  # the last bunch's update and forward pass
        self.last_cpu_seconds = 0.0  # the same, in the CPU time of the thread that ran it

    def file(self, message: Message) -> bool:
        """Take an np message (False for any other)."""
        if isinstance(message, SliceState | NpBunch):
            self.queue.append(message)
            return True
        return False

    def ready(self) -> bool:
        """The next message can be applied now (its frames are at hand)."""
        if not self.queue:
            return False
        first = self.queue[0]
        return isinstance(first, SliceState) or self.corpus.ready_for(first.indices)

    async def step(
        self, executor: Executor, send: Callable[[Message], None], wake: asyncio.Event,
        inline: InlineChoice | None = None,
    ) -> RemoteError | None:  # fmt: skip
        """Apply the next message and send its replies, or wait for ``wake`` when none is
        ready. A slice this worker cannot hold (a board's memory) is refused: the server
        is told (fatal ``bad_job``) and the refusal is returned, for the worker to leave
        (the server hands the units to the others).

        A bunch runs in the compute thread, or on the event loop's thread while bunches
        take less than ``inline``'s limit (``InlineChoice``, as the other modes choose): an
        np worker's every bunch is a round trip on the critical path of all of them, and
        the two thread switches cost a tenth of a bunch of 1-2 ms. A slice host (an
        emulated board, whose passes take its modelled time) always uses the thread."""
        if not self.ready():
            await wake.wait()
            return None
        message = self.queue.popleft()
        bunch = isinstance(message, NpBunch) and message.bunch >= 0
        on_loop = bunch and inline is not None and inline.chosen and self.host is None
        try:
            if on_loop:
                replies = self.apply(message)
            else:
                loop = asyncio.get_running_loop()
                replies = await loop.run_in_executor(executor, self.apply, message)
        except ConfigError as exc:
            log.error("cannot take the slice the server gave: %s", exc)
            send(ErrorMessage("bad_job", str(exc), True))
            return RefusedHere("bad_job", str(exc))
        if bunch and inline is not None:  # the bunch's own time, not the switches' (apply)
            inline.measured(self.last_cpu_seconds)
        for reply in replies:
            send(reply)
        if on_loop:  # let the loop read what came meanwhile
            await asyncio.sleep(0)
        return None

    def apply(self, message: SliceMessage) -> list[Message]:
        """Compute thread: carry out ``message``; the replies to send, in order."""
        if isinstance(message, SliceState):
            hidden = self.job.network.sizes[1]
            if not 0 <= message.start <= message.stop <= hidden:
                raise ProtocolError(f"slice {message.start}:{message.stop} of {hidden} units")
            part = HiddenSlice(message.start, message.stop)
            if self.host is not None:  # a board refuses a slice too big for its memory
                self.host.take_slice(
                    slice_network(self.job.network, part.units), self.job.bunch_size
                )
            self.trainer.load(part, message.element, message.velocity, message.bunch)
            return []
        replies: list[Message] = []
        trainer = self.trainer
        # A bunch's compute, reported with its partial outputs: the previous bunch's update
        # and this one's forward pass (the server sizes slices by it, /status shows it).
        started, cpu_started = time.perf_counter(), time.thread_time()
        host = self.host  # its device's time is charged from before the arithmetic it covers
        if message.error_of >= 0:
            error = np.asarray(message.error, dtype=np.float32)
            mark = host.begin() if host is not None else None
            trainer.backward(message.error_of, error, message.patterns, message.learning_rate)
            if host is not None:
                host.slice_backward(message.patterns, mark)
        if message.collect:  # copies: the trainer goes on changing its arrays
            part = trainer.part
            weights, velocity = trainer.weights.copy(), trainer.velocity.copy()
            replies.append(SliceState(part.start, part.stop, trainer.last_bunch, weights, velocity))
        if message.bunch >= 0:
            mark = host.begin() if host is not None else None
            partial = trainer.forward(message.bunch, self._patterns(message.indices))
            if host is not None:
                host.slice_forward(len(message.indices), mark)
            seconds = self.last_seconds = time.perf_counter() - started
            self.last_cpu_seconds = time.thread_time() - cpu_started
            self.bunches += 1
            self.patterns += len(message.indices)
            self.compute_seconds += seconds
            replies.append(PartialOutputs(message.bunch, seconds, partial))
        return replies

    def _patterns(self, indices: np.ndarray) -> np.ndarray:
        total = self.corpus.bounds.total_frames
        if not 0 < len(indices) <= self.job.bunch_size:
            raise ProtocolError(
                f"a bunch of {len(indices)} frames (bunch_size {self.job.bunch_size})"
            )
        if indices.min() < 0 or indices.max() >= total:
            raise ProtocolError(f"frame indices outside the data's {total} frames")
        return self.corpus.windows(indices)


def memory_capabilities(backend: object) -> tuple[str, ...]:
    """The ``Hello`` capability stating a slice host's memory (none for other backends)."""
    return (backend.stated_memory().capability(),) if isinstance(backend, SliceHost) else ()


class SliceSteps:
    """np's turn of the compute loop (as ``UpdateSteps`` is the other modes'): the next
    slice or bunch of ``work``, its replies sent on the connection."""

    def __init__(
        self, work: SliceWork, executor: Executor, send: Callable[[Message], None],
        inline: InlineChoice, first_bunch_done: Callable[[], object], progress: ProgressLog,
    ) -> None:  # fmt: skip
        self.work, self.executor, self.send, self.inline = work, executor, send, inline
        self.first_bunch_done = first_bunch_done  # as after a first update: a job can end
        # before the first periodic report
        # its answers are its progress (the lines had said "no update ... waiting" all run)
        self.progress = progress

    def file(self, message: Message) -> bool:
        return self.work.file(message)

    async def step(self, wake: asyncio.Event) -> RemoteError | None:
        """``SliceWork.step``: a refusal of a slice this worker cannot hold, or None."""
        before, patterns = self.work.bunches, self.work.patterns
        refused = await self.work.step(self.executor, self.send, wake, self.inline)
        if before == 0 < self.work.bunches:
            self.first_bunch_done()
        if self.work.bunches > before:
            self.progress.bunches_answered(
                self.work.bunches - before, self.work.patterns - patterns
            )
        return refused
