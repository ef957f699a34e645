"""``Checkpointer``: when checkpoints are taken and written.

A checkpoint is *taken* on the event loop between two steps (the coordinator offers each
such moment), so the weights, the velocity and the ledger agree; that costs a copy of
the velocity and of the current epoch's ledger. It is *written* by a thread of its own
(``server/checkpoint.py``: encode, checksum, fsync, rename), so steps never wait for the
disk. Taken every ``checkpoint_seconds`` (when anything changed) or every
``checkpoint_steps`` versions, at once after each epoch end and each CV decision, and,
through ``final()``, at SIGTERM and when training completes. A periodic one is skipped
while the previous one is still being written; the others queue behind it.
``write_now()`` takes one at the next moment between steps and waits for it to be on
disk: a change made while the run trains (``POST /control``, server/control.py) is
answered only then. What a restart resumes from: server/durability.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from snet.protocol.numbering import shown_epoch
from snet.transport.log_throttle import LogThrottle

from .checkpoint import CheckpointStore
from .resume import coordinator_state

if TYPE_CHECKING:
    from .training import Coordinator

log = logging.getLogger("snet.server")

TIMER_SECONDS = 1.0  # how often the clock for time-based checkpoints is looked at
FAILURE_LOG_SECONDS = 60.0  # a run of failed checkpoint writes is logged once a minute


class Checkpointer:
    """Takes checkpoints between steps and writes them in a thread of its own."""

    def __init__(
        self,
        store: CheckpointStore,
        coordinator: Coordinator,
        identity: dict[str, Any],
        server_state: Callable[[], dict[str, Any]],
        seconds: float,
        steps: int = 0,
    ) -> None:
        self.store = store
        self.coordinator = coordinator
        self.identity = identity
        self.server_state = server_state  # the server's own part (e.g. the next worker id)
        self.seconds = seconds
        self.steps = steps
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snet-checkpoint")
        self._writing: list[Future[str | None]] = []
        self._due = False  # a periodic checkpoint waits for the end of the running step
        self._taken_at = time.monotonic()
        self._taken_mark = self._mark()
        self._written_mark = self._taken_mark  # the state on disk (or, fresh, nothing lost)
        self._write_error: OSError | None = None
        self._failing_since = 0  # failed writes since the last one written
        self._failures = LogThrottle(FAILURE_LOG_SECONDS)  # a run of them's lines, by cause
        # write_now()'s callers while a step runs: the step's end takes their checkpoint
        self._waiting: list[asyncio.Future[Future[str | None] | None]] = []
        # figures for /status and the benchmarks
        self.written = 0
        self.failed = 0
        self.skipped_busy = 0
        self.last: dict[str, Any] = {}
        self.take_seconds = 0.0  # on the event loop, in total
        self.write_seconds = 0.0  # in the writer thread, in total

    def _mark(self) -> tuple[int, int, bool, int]:
        """Changes when anything a checkpoint holds does (steps, epochs, CV results, a
        staleness policy changed at run time: else a change whose own checkpoint failed
        waited for a step to be written, and at SIGTERM before the first one was not)."""
        c = self.coordinator
        epochs = len(c.stats.epochs) * 1000 + c.stats.epochs_done
        return (c.version, epochs, c.finished.is_set(), c.staleness.revision)

    def between_steps(self, boundary: bool) -> None:
        """The coordinator's offer: take one now if it is due (or forced by a boundary, or
        awaited by ``write_now()``)."""
        if self._waiting:
            self._answer_waiting(self.take(forced=True))
            return
        version_due = self.steps > 0 and self.coordinator.version - self._taken_mark[0] >= (
            self.steps
        )
        if boundary or self._due or version_due or self._time_due():
            self.take(forced=boundary)

    def _time_due(self) -> bool:
        return time.monotonic() - self._taken_at >= self.seconds and self._mark() != (
            self._taken_mark
        )

    def take(self, forced: bool = False) -> Future[str | None] | None:
        """Take a checkpoint now (between steps) and queue it for writing; the future
        holds None once it is written, else why not. A periodic one is skipped while the
        previous write is still running (the next offer retries)."""
        if self.coordinator.steps.broken:  # the last checkpoint stands: this state is not whole
            return None
        self._writing = [f for f in self._writing if not f.done()]
        if self._writing and not forced:
            self.skipped_busy += 1
            self._due = True
            return None
        started = time.perf_counter()
        try:
            state = {
                **self.identity,
                "taken": time.time(),
                "server": self.server_state(),
                "coordinator": coordinator_state(self.coordinator),
            }
        except Exception:  # a bug in a part's state: loudly, but training goes on
            self.failed += 1
            log.exception("cannot take a checkpoint")
            return None
        self.take_seconds += time.perf_counter() - started
        self._due = False
        self._taken_at, self._taken_mark = time.monotonic(), self._mark()
        future = self._writer.submit(self._write, state, self._taken_mark)
        self._writing.append(future)
        self._answer_waiting(future)  # it holds what they changed: it was taken after
        return future

    async def write_now(self) -> None:
        """A checkpoint taken at the next moment between steps (now, if no step runs) and
        on disk when this returns; ``OSError`` saying why when it is not (a full disk, or
        a state that cannot be checkpointed: a failed step, a stop)."""
        if self.coordinator.steps.between_steps:
            future = self.take(forced=True)
        else:  # the running step's end offers the moment (between_steps)
            waiter: asyncio.Future[Future[str | None] | None]
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            future = await waiter
        if future is None:
            raise OSError("the training state cannot be checkpointed now (the log says why)")
        failure = await asyncio.wrap_future(future)
        if failure is not None:
            raise OSError(failure)

    def _answer_waiting(self, future: Future[str | None] | None) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():  # a caller gone (its request cancelled) is skipped
                waiter.set_result(future)

    def _write(self, state: dict[str, Any], mark: tuple[int, int, bool, int]) -> str | None:
        started = time.perf_counter()
        coordinator = state["coordinator"]
        try:
            path = self.store.write(state)
        except OSError as exc:  # e.g. a full disk: training goes on, the next one retries
            self.failed += 1
            self._write_error = exc
            self._said_failure(exc)
            return f"cannot write a checkpoint: {exc}"
        except Exception as exc:  # a bug: said loudly (a future's exception is otherwise unseen)
            self.failed += 1
            log.exception("cannot encode a checkpoint")
            return f"cannot encode a checkpoint: {exc!r}"
        seconds = time.perf_counter() - started
        self.write_seconds += seconds
        self.written += 1
        self._written_mark = mark
        self.last = {
            "path": str(path),
            "version": coordinator["version"],
            "epoch": shown_epoch(coordinator["epochs"]["epoch"]),  # for /status: from 1
            "digest": coordinator["digest"],
            "bytes": path.stat().st_size,
            "write_seconds": round(seconds, 4),
            "at": state["taken"],
        }
        log.debug("checkpoint %s: version %d", path.name, coordinator["version"])
        if self._failing_since:
            log.warning("checkpoint %s written, after %d that could not be", path.name,
                        self._failing_since)  # fmt: skip
            self._failing_since = 0
            self._failures = LogThrottle(FAILURE_LOG_SECONDS)  # the next run is said anew
        return None

    def _said_failure(self, exc: OSError) -> None:
        """Log a failed write: the first of a run of them, then one a minute with how many
        (a full disk with --checkpoint-steps 50 wrote this line 270 times in 9 s)."""
        self._failing_since += 1
        # another cause (no permission) is said at once; the same one again is not, whatever
        # temporary file it named (53 lines in 5 s of a directory made immutable)
        if self._failures.due(f"{exc.errno} {exc.strerror}" if exc.errno else str(exc)):
            log.error("cannot write a checkpoint (%d in a row): %s", self._failing_since, exc)

    async def run_timer(self) -> None:
        """Time-based checkpoints while no step comes (e.g. waiting for workers)."""
        while True:
            await asyncio.sleep(min(self.seconds, TIMER_SECONDS))
            if self._time_due():
                if self.coordinator.steps.between_steps:
                    self.take()
                else:
                    self._due = True  # taken at the end of the running step

    async def final(self) -> None:
        """The last checkpoint (at SIGTERM or when training completes), written before this
        returns; then the ones still queued are waited for. A state whose write failed (a
        full disk) is written once more: it counted as taken, so the end of a run whose
        last checkpoint had failed never reached the disk, and a restart resumed short of
        it. ``OSError`` when that fails too: the run's last state is not on disk."""
        await self.coordinator.steps.settle()
        if self._mark() != self._taken_mark:
            self.take(forced=True)
        await self.flush()
        if self._written_mark != self._mark() and self.take(forced=True) is not None:
            await self.flush()
            if self._written_mark != self._mark():
                raise OSError(f"the last checkpoint was not written ({self._write_error})")

    async def flush(self) -> None:
        """Wait for every queued write."""
        pending = [asyncio.wrap_future(f) for f in self._writing]
        if pending:
            await asyncio.gather(*pending)
        self._writing = []

    def close(self) -> None:
        self._answer_waiting(None)  # no step will end to take theirs (a failed step)
        self._writer.shutdown(wait=True)

    def figures(self) -> dict[str, Any]:
        """The "checkpoints" entry of /status."""
        return {
            "directory": str(self.store.directory),
            "every_seconds": self.seconds,
            "every_steps": self.steps,
            "written": self.written,
            "failed": self.failed,
            "skipped_while_writing": self.skipped_busy,
            "take_seconds_total": round(self.take_seconds, 4),
            "write_seconds_total": round(self.write_seconds, 4),
            "last": self.last,
        }
