"""The coordinator's training state as one checkpoint, and back.

``coordinator_state`` gathers the parts' ``checkpoint_state()`` between two steps (never
while one runs: the step thread writes the velocity and the norm bounds), so the weights
of ``version`` and exactly the ledger they include are saved together;
``restore_coordinator`` gives each part its state back before any worker joins.
server/checkpointer.py decides when, and server/checkpoint.py writes and reads the files.

What the rule saves depends on the mode (``UpdateRule``, or bmuf's ``BlockFilter``: its
model, what workers start from, and the filter's Δ). Updates accepted but not yet applied
are not in the weights: their frames are leased again after a restore, so their figures
are left out of the epoch's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from snet.protocol.digest import weights_digest
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.numbering import shown_epoch

from .departures import DEPARTED_KEPT, Departures
from .ledger import ledger_totals

if TYPE_CHECKING:
    from .session import WorkerSession
    from .training import Coordinator

log = logging.getLogger("snet.server")


def coordinator_state(coordinator: Coordinator) -> dict[str, Any]:
    """The whole training state as plain data; only between steps."""
    if not coordinator.steps.between_steps:
        raise RuntimeError("a checkpoint is taken between steps, not during one")
    queued = coordinator.steps.queued()
    lost = coordinator.traffic.not_in_weights()  # np's bunches after its last report
    stats = coordinator.stats.checkpoint_state(
        ((p.message.patterns, p.message.correct, p.message.loss_sum) for p in queued), lost
    )
    earlier = restart_history(
        coordinator.earlier,
        list(coordinator.sessions.values()),
        coordinator.departed,
        coordinator.connections,
    )
    return {
        "version": coordinator.version - len(lost),  # each of those bunches is a version
        "digest": coordinator.digest,
        "finished": coordinator.finished.is_set(),
        "rule": coordinator.rule.checkpoint_state(),
        "bounds": coordinator.runner.bounds.checkpoint_state(),
        "book": coordinator.book.checkpoint_state(),
        "epochs": coordinator.epochs.checkpoint_state(),
        "evaluations": coordinator.evaluations.checkpoint_state(),
        "stats": stats,
        "hooks": coordinator.hooks.checkpoint_state(),
        "staleness": coordinator.staleness.checkpoint_state(),
        "earlier": earlier,
    }


def restore_coordinator(coordinator: Coordinator, state: dict[str, Any]) -> int:
    """Continue from ``coordinator_state()``, before any worker joins. Returns the frames
    of the current epoch queued again (leased or in flight when it was taken)."""
    coordinator.rule.restore_checkpoint(state["rule"])
    digest = weights_digest(coordinator.rule.snapshot)
    if digest != state["digest"]:
        raise ValueError(f"weights digest {digest}, the checkpoint says {state['digest']}")
    coordinator.runner.bounds.restore_checkpoint(state["bounds"])
    requeued = coordinator.book.restore_checkpoint(state["book"])
    coordinator.epochs.restore_checkpoint(state["epochs"])
    coordinator.evaluations.restore_checkpoint(state["evaluations"])
    coordinator.stats.restore_checkpoint(state["stats"])
    coordinator.hooks.restore_checkpoint(state.get("hooks", {}))  # none before hooks kept any
    coordinator.staleness.restore_checkpoint(state.get("staleness"))  # a run-time change
    coordinator.resume_at(int(state["version"]), digest, state["earlier"], state["finished"])
    return requeued


def resume_from(coordinator: Coordinator, path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Give the coordinator a checkpoint file's state (``ConfigError`` if it cannot be
    resumed); log and trace where it resumed. Returns what /status shows as ``resumed``."""
    try:
        requeued = restore_coordinator(coordinator, state["coordinator"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path} cannot be resumed: {exc}; use --fresh") from exc
    log.info(
        "resumed from %s: version %d (weights digest %s), epoch %d at rate %g; "
        "%d frames of the epoch not in these weights are leased again",
        path.name, coordinator.version, coordinator.digest, shown_epoch(coordinator.epoch),
        coordinator.learning_rate, requeued,
    )  # fmt: skip
    if coordinator.trace is not None:
        coordinator.trace({"resumed": coordinator.version, "digest": coordinator.digest,
                           "epoch": coordinator.epoch, "checkpoint": path.name})  # fmt: skip
    put_restart_staleness_in_force(coordinator, state.get("job"))
    return {
        "checkpoint": path.name,
        "version": coordinator.version,
        "digest": coordinator.digest,
        "epoch": shown_epoch(coordinator.epoch),  # /status shows it: from 1
        "requeued_frames": requeued,
        "at": time.time(),
    }


def put_restart_staleness_in_force(coordinator: Coordinator, saved_job: object) -> None:
    """The staleness policy after a restart. Given as the checkpointed run's command gave
    it, the policy in force stays (a change made at run time survives a crash and the
    same command's restart); given otherwise, the command's is put in force as ``POST
    /control`` would put it (logged, traced, listed in /status's changes)."""
    job = saved_job if isinstance(saved_job, dict) else {}
    given = coordinator.job.staleness
    if job.get("staleness", JobSpec().staleness) != given and coordinator.staleness.name != given:
        coordinator.set_staleness(given, by="the restart's command")


class TraceFile:
    """``--trace-file``: a JSON line per record, line-buffered (a killed server's trace
    holds every step it published); a resumed run's trace goes on after its last whole
    line. A record that cannot be written (a full disk) ends the trace, said once, and
    training goes on: the write had raised in the step machinery, which stopped the
    server, and its exit was a traceback from closing the file."""

    def __init__(self, path: Path, resumed: bool) -> None:
        if resumed:
            drop_torn_line(path)
        self.path = path
        mode: Literal["a", "w"] = "a" if resumed else "w"
        self._handle: TextIO | None = open(path, mode, 1, encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        """The coordinator's ``trace``: one record, one line."""
        if self._handle is None:
            return
        try:
            self._handle.write(json.dumps(record) + "\n")
        except OSError as exc:
            log.error("cannot write the trace file %s (%s): the trace ends here; training "
                      "goes on", self.path, exc)  # fmt: skip
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            with contextlib.suppress(OSError):  # the last line's flush, on a full disk
                handle.close()


def drop_torn_line(path: Path) -> None:
    """Cut a trace a killed server left back to its last whole line."""
    try:
        with open(path, "r+b") as handle:
            data = handle.read()
            handle.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def restart_history(
    earlier: dict[str, Any],
    live: list[WorkerSession],
    departed: Departures,
    connections: int,
) -> dict[str, Any]:
    """The rows of the workers seen so far (marked gone) and their compression totals,
    after those of earlier server lives: what /status shows under ``earlier`` once the
    server is restarted from a checkpoint. Rows are bounded as ``Departures`` bounds
    them (the most recent ``DEPARTED_KEPT``); the totals count every worker."""
    rows = [session.row(connections) for session in [*departed.recent, *live]]
    for row in rows:
        if row["state"] != "gone":
            row["state"], row["left_reason"] = "gone", "server restarted"
    totals = ledger_totals(
        (s.ledger for s in live if s.ledger is not None),
        departed.compression_sums,
        departed.codecs,
    )
    return {"workers": [*earlier["workers"], *rows][-DEPARTED_KEPT:],
            "compression": [*earlier["compression"], totals]}  # fmt: skip
