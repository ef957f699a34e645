"""When checkpoints are taken and written, and what a restart resumes from.

``Checkpointer``: a checkpoint is *taken* on the event loop between two steps (the
coordinator offers each such moment), so the weights, the velocity and the ledger agree;
that costs a copy of the velocity and of the current epoch's ledger. It is *written* by a
thread of its own (``server/checkpoint.py``: encode, checksum, fsync, rename), so steps
never wait for the disk. Taken every ``checkpoint_seconds`` (when anything changed) or
every ``checkpoint_steps`` versions, at once after each epoch end and each CV decision,
and, through ``final()``, at SIGTERM and when training completes. A periodic one is
skipped while the previous one is still being written; the others queue behind it.
``write_now()`` takes one at the next moment between steps and waits for it to be on
disk: a change made while the run trains (``POST /control``, server/control.py) is
answered only then.

``resume_point``: what ``snet server`` starts from: the newest whole checkpoint of the
same job (network, settings, a setting added since the checkpoint was written or one its
mode does not read taken at its default, and a fingerprint of the data), nothing with
``--fresh`` (which refuses to discard a finished run's results without ``--force``), and
a one-line ``ConfigError`` for a checkpoint of another job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.modes import in_use, shown
from snet.protocol.numbering import shown_epoch

from .checkpoint import CheckpointStore, LoadedCheckpoint
from .export import STATUS_FILE, WEIGHTS_FILE
from .resume import coordinator_state

if TYPE_CHECKING:
    from .config import ServerConfig
    from .training import Coordinator

log = logging.getLogger("snet.server")

TIMER_SECONDS = 1.0  # how often the clock for time-based checkpoints is looked at
FAILURE_LOG_SECONDS = 60.0  # a run of failed checkpoint writes is logged once a minute


def _settings(job: dict[str, Any]) -> dict[str, Any]:
    """A job's settings by name, a nested table's as ``table.key`` (``data.split_seed``),
    so that a message names the setting that differs, not the whole table."""
    flat: dict[str, Any] = {}
    for key, value in job.items():
        if isinstance(value, dict) and "sizes" not in value:  # a network stays whole
            flat.update({f"{key}.{inner}": item for inner, item in value.items()})
        else:
            flat[key] = value
    return flat


def _setting(value: object) -> str:
    """A job setting as a person reads it (a network: sizes, activations; not sizes alone)."""
    if isinstance(value, dict) and "sizes" in value:  # "117:1024:10 there, here" hid a tanh
        return " ".join([":".join(map(str, value["sizes"])), *value.get("activations", [])])
    if value is None:
        return "(none)"
    # as typed (true, not True), but every digit of a float: two that differ must read so
    text = repr(value) if isinstance(value, str | float) else shown(value)
    return text if len(text) <= 60 else text[:57] + "..."


def job_identity(
    job_dict: dict[str, Any], data_fingerprint: str, labels: str = ""
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the job (as JSON) and the data (its
    shape, split and normalisation; and ``labels``, the labels' digest, apart: checkpoints
    written before it was kept hold none, and still resume)."""
    return {"job": json.loads(json.dumps(job_dict)), "data": data_fingerprint, "labels": labels}


# Settings a run changes while it trains (POST /control): not part of what a checkpoint
# must match. A restart's command that gives another one puts it in force (resume.py); a
# refusal, "staleness 'none' there", named the command that was, not the policy in force.
RUN_TIME_SETTINGS = ("staleness",)


def _without_run_time_settings(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if key not in RUN_TIME_SETTINGS}


def _as_of_now(job: dict[str, Any]) -> dict[str, Any]:
    """A saved job with the settings added since it was written at their defaults: a
    checkpoint from before a setting existed (``np_pipeline``, say) is of the same job as
    one that leaves the setting at its default, and still resumes. So are the settings
    its mode never read (``block_bunches`` of a sync job, which snet refuses since, and
    which had changed nothing: protocol/modes.py), or its run could not be resumed."""
    defaults = json.loads(json.dumps(JobSpec().to_dict()))
    return in_use({**defaults, **job}, defaults)


class OtherJob(ConfigError):
    """The out-dir's checkpoint is of another job: ``differing`` names the job's settings
    that differ (a command that chose one of them itself can say so: snet demo)."""

    def __init__(self, message: str, differing: list[str]) -> None:
        super().__init__(message)
        self.differing = differing


def resume_point(
    config: ServerConfig, store: CheckpointStore, identity: dict[str, Any]
) -> LoadedCheckpoint | None:
    """The checkpoint to resume from, or None to start a fresh run (raises ConfigError)."""
    store.remove_leftovers()
    try:
        loaded = store.newest()
    except ConfigError:  # a checkpoint it cannot read: --fresh starts over all the same
        if not config.fresh:
            raise
        loaded = None
    if config.fresh or loaded is None:
        finished = _finished_run(config, loaded)
        if finished and not (config.fresh and config.force):
            advice = (
                "--fresh would overwrite them: add --force" if config.fresh
                else "and no checkpoint to resume: a fresh run would overwrite them: "
                "--fresh --force to do so"
            )  # fmt: skip
            raise ConfigError(f"{config.out_dir} holds the results of {finished}; {advice}, "
                              "or choose another --out-dir")  # fmt: skip
        if config.fresh:
            store.clear()
        return None
    saved = loaded.state
    job = saved.get("job")
    theirs, ours = (
        _without_run_time_settings(_as_of_now(job)) if isinstance(job, dict) and job else {},
        _without_run_time_settings(_as_of_now(identity["job"])),
    )
    if theirs != ours:
        there, here = _settings(theirs), _settings(ours)
        differing = sorted(k for k in {*there, *here} if there.get(k) != here.get(k))
        shown = "; ".join(
            f"{key} {_setting(there.get(key))} there, {_setting(here.get(key))} here"
            for key in differing[:3]
        ) + ("; ..." if len(differing) > 3 else "")
        raise OtherJob(
            f"{loaded.path} is a checkpoint of another job ({shown}): use --fresh to start "
            "over, or another --out-dir",
            differing,
        )
    if saved.get("data") != identity["data"]:
        raise ConfigError(
            f"{loaded.path} is a checkpoint of the same job on other data (the data's "
            "fingerprint differs): use --fresh to start over, or another --out-dir"
        )
    if saved.get("labels") and identity.get("labels") and saved["labels"] != identity["labels"]:
        raise ConfigError(
            f"{loaded.path} is a checkpoint of the same job on other data (its frames have "
            f"other labels: digest {saved['labels']} there, {identity['labels']} here): use "
            "--fresh to start over, or another --out-dir"
        )
    if config.init_weights:  # documented, but a user who gave it should hear it too
        log.warning("--init-weights %s not used: resuming the run checkpointed in %s "
                    "(--fresh starts over from those weights)", config.init_weights,
                    loaded.path)  # fmt: skip
    return loaded


def _finished_run(config: ServerConfig, loaded: LoadedCheckpoint | None) -> str:
    """The run whose results are in the out-dir (its newest checkpoint ``loaded``), and
    why it is taken for one, when a fresh start would overwrite them ("" if none)."""
    if loaded is not None and loaded.state["coordinator"]["finished"]:
        return f"a finished run (checkpoint {loaded.path.name} of a completed training)"
    status = Path(config.out_dir) / STATUS_FILE
    try:
        if json.loads(status.read_text()).get("state") == "trained":
            return f"a finished run ({status} says trained)"
    except (OSError, ValueError, AttributeError):
        pass
    weights = Path(config.out_dir) / WEIGHTS_FILE
    if loaded is None and weights.is_file():  # no checkpoint: nothing would resume them
        if status.exists():  # a server's, stopped (its checkpoints gone): started over silently
            return f"a stopped run ({weights} and {status.name})"
        return f"a finished run ({weights}: snet train's, say)"
    return ""


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
        self._failure_said, self._failure_text = 0.0, ""  # when one was last logged, and what
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
        return None

    def _said_failure(self, exc: OSError) -> None:
        """Log a failed write: the first of a run of them, then one a minute with how many
        (a full disk with --checkpoint-steps 50 wrote this line 270 times in 9 s)."""
        self._failing_since += 1
        now, said = time.monotonic(), str(exc)  # another cause (no permission) is said at once
        due = self._failing_since == 1 or now - self._failure_said >= FAILURE_LOG_SECONDS
        if due or said != self._failure_text:
            self._failure_said, self._failure_text = now, said
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
