"""What the server reports: the /status document (/metrics: ``server/metrics.py``)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from snet.protocol.numbering import shown_epoch

from .ledger import ledger_totals
from .reported import finite
from .staleness_report import staleness_status

if TYPE_CHECKING:
    from .app import SnetServer
    from .stats import TrainingStats
    from .training import Coordinator


def queues(coordinator: Coordinator) -> dict[str, int]:
    """Lengths of the element pool's queues and of the lease queue."""
    return {
        "free": coordinator.pool.free,
        "received": len(coordinator.steps),
        "pool_size": coordinator.pool.size,
        "pool_made": coordinator.pool.made,  # elements in memory (made as first needed)
        "pool_overflows": coordinator.pool.overflows,
        # elements holding unfinished payloads of workers none of whose updates is applied
        "pool_newcomers": coordinator.pool.newcomers_receiving,
        "chunks_waiting": coordinator.book.waiting_chunks,
        "leases_out": coordinator.book.leases_out,
    }


def _shown_record(row: dict[str, Any], epoch: int) -> dict[str, Any]:
    """An epoch's record as /status shows it: its epoch, and its ledger's, from 1."""
    ledger = row.get("ledger")
    if isinstance(ledger, dict) and "epoch" in ledger:
        row["ledger"] = {**ledger, "epoch": shown_epoch(epoch)}
    return {**row, "epoch": shown_epoch(epoch)}


def _state(server: SnetServer) -> str:
    coordinator = server.coordinator
    waiting = coordinator.traffic.holding_back()  # each mode waits for workers its way
    return "waiting_for_workers" if server.state == "training" and waiting else server.state


class StatusText:
    """The /status document as compact JSON for /events, built at most once every
    ``reuse`` seconds (and again when the state changes) and shared by every reader:
    each built its own, and 254 peers' reports in a 15 MB document, read by 14 event
    streams, took the server's memory to 640 MB and its steps to a thirtieth (a probe).
    (GET /status builds its own: a client that acted and then asks is owed the result.)"""

    def __init__(self, server: SnetServer, reuse: float = 0.05) -> None:
        self.server, self.reuse = server, reuse
        self._built: tuple[str, float, str] | None = None

    def text(self) -> str:
        now, state = time.monotonic(), self.server.state
        if self._built is None or self._built[0] != state or now - self._built[1] > self.reuse:
            document = json.dumps(status_document(self.server), separators=(",", ":"))
            # stamped once built: a build longer than ``reuse`` (the large documents this
            # is for) had every reader of the tick build its own again (a review)
            self._built = (state, time.monotonic(), document)
        return self._built[2]


def status_document(server: SnetServer) -> dict[str, Any]:
    """The JSON of GET /status: finite figures only (JSON has no NaN)."""
    document: dict[str, Any] = finite(_status_document(server))
    return document


def _status_document(server: SnetServer) -> dict[str, Any]:
    coordinator = server.coordinator
    stats = coordinator.stats
    connections = coordinator.connections
    workers = [s.row(connections) for s in coordinator.sessions.values()]
    workers += [s.row(connections) for s in coordinator.departed.recent]
    kinds, worker_norms = coordinator.runner.norm_figures(coordinator.steps.between_steps)
    for row in workers:  # a worker's own running mean: one far from the others shows
        row["norm_per_pattern"] = worker_norms.get(row["id"])
    elapsed = _training_seconds(coordinator.finished.is_set(), stats)
    http = server.http_listener
    return {
        "server": server.config.name,
        "state": _state(server),  # "waiting_for_workers" until --min-workers have joined
        "stop_reason": server.stop_reason or None,  # e.g. a signal, or training diverged
        "min_workers": coordinator.desk.min_workers,
        "progress": server.meter.figures(coordinator, time.monotonic()),
        "mode": coordinator.job.mode,
        "network": coordinator.job.network.describe(),
        "connections_per_pattern": connections,
        "weight_version": coordinator.version,
        "weights_digest": coordinator.digest,
        "checkpoints": server.checkpointer.figures() if server.checkpointer else None,
        "resumed": server.resumed,
        "steps": stats.steps,
        "step_passes": stats.step_passes,
        "step_seconds": round(stats.step_seconds, 6),
        "updates_applied": stats.updates_applied,
        "updates_rejected": stats.updates_rejected,
        "update_norms": kinds,  # the norm check's figures by kind (server/plausible.py)
        **server.counters.figures(),  # refusals on the worker port (server/admission.py)
        "connections_open": len(server.connections),
        "http_connections_open": http.open_connections if http else 0,
        "http_connections_refused": http.refused if http else 0,
        "http_connections_refused_per_address": http.refused_per_address if http else 0,
        "cv_checks": coordinator.evaluations.figures(),  # --verify-cv
        "leases_revoked": stats.leases_revoked,
        "leases_handed_over": stats.leases_handed_over,
        "workers_dropped_late": stats.workers_dropped_late,
        "epoch": shown_epoch(coordinator.epoch),  # from 1, as everywhere a reader sees it
        "epochs_planned": coordinator.job.epochs,
        "epochs_done": stats.epochs_done,
        "patterns_processed": stats.patterns_applied,
        "learning_rate": coordinator.learning_rate,
        "train_accuracy": stats.latest("train_accuracy"),
        "cv_accuracy": stats.latest("cv_accuracy"),  # the newest epoch's, rolled back or not
        "weights_cv_accuracy": stats.weights_cv_accuracy(),  # the weights held, or older:
        "weights_cv_version": stats.scored_version,  # those it scored (trained on since?)
        "test": server.test_result,  # the test file's score once training ended, else null
        "staleness_mean": round(stats.staleness_mean, 3),
        "staleness_max": stats.staleness_max,
        "staleness_histogram": {str(k): v for k, v in sorted(stats.staleness_histogram.items())},
        "staleness": staleness_status(coordinator),
        "mcups": round(connections * stats.patterns_applied / max(elapsed, 1e-9) / 1e6, 2),
        "elapsed_seconds": round(elapsed, 3),
        "queues": queues(coordinator),
        "workers_live": len(coordinator.sessions),
        "compression": ledger_totals(
            (s.ledger for s in coordinator.sessions.values() if s.ledger is not None),
            coordinator.departed.compression_sums,
            coordinator.departed.codecs,
        ),
        "departed": coordinator.departed.summary(),
        "rule": coordinator.rule.figures() or None,  # bmuf: the block filter
        "workers": workers,
        "earlier": coordinator.earlier,  # workers and compression totals before restarts
        "epochs": [_shown_record(record.as_dict(), record.epoch) for record in stats.epochs],
        "schedule": coordinator.job.schedule,
        "hooks": coordinator.hooks.figures(),
        "inline_frames": {
            "frames_sent": coordinator.inline.frames_sent,
            "bytes_sent": coordinator.inline.bytes_sent,
        },
    }


def _training_seconds(finished: bool, stats: TrainingStats) -> float:
    """Seconds since this server first leased frames (its start, before that), to the end
    of its last epoch once training is done: the MCUPS of a trained run held (at
    ``--linger-seconds``) fell as it waited, and the wait for the workers counted (a
    server at 3175 MCUPS beside its one worker's 16,261)."""
    end = time.time()
    last = stats.epochs[-1].ended if finished and stats.epochs else None
    if last is not None and last >= stats.started:  # (a resumed run's are from before)
        end = last
    leased = [r.leased for r in stats.epochs if r.leased is not None and r.leased >= stats.started]
    return end - min(leased, default=stats.started)
