"""What the server reports: the /status document and the Prometheus /metrics text."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .ledger import ledger_totals

if TYPE_CHECKING:
    from .app import SnetServer
    from .training import Coordinator


def queues(coordinator: Coordinator) -> dict[str, int]:
    """Lengths of the element pool's queues and of the lease queue."""
    return {
        "free": coordinator.pool.free,
        "received": coordinator.received_queue,
        "pool_size": coordinator.pool.size,
        "pool_overflows": coordinator.pool.overflows,
        "chunks_waiting": coordinator.book.waiting_chunks,
        "leases_out": coordinator.book.leases_out,
    }


def status_document(server: SnetServer) -> dict[str, Any]:
    """The JSON of GET /status."""
    coordinator = server.coordinator
    stats = coordinator.stats
    connections = coordinator.connections
    workers = [s.row(connections) for s in coordinator.sessions.values()]
    workers += [s.row(connections) for s in coordinator.departed]
    elapsed = time.time() - stats.started
    return {
        "server": server.config.name,
        "state": server.state,
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
        "frames_refused": server.counters.frames_refused,
        "handshakes_refused": server.counters.handshakes_refused,
        "leases_revoked": stats.leases_revoked,
        "workers_dropped_late": stats.workers_dropped_late,
        "epoch": coordinator.epoch,
        "epochs_planned": coordinator.job.epochs,
        "epochs_done": stats.epochs_done,
        "patterns_processed": stats.patterns_applied,
        "learning_rate": coordinator.learning_rate,
        "train_accuracy": stats.latest("train_accuracy"),
        "cv_accuracy": stats.latest("cv_accuracy"),
        "staleness_mean": round(stats.staleness_mean, 3),
        "staleness_max": stats.staleness_max,
        "staleness_histogram": {str(k): v for k, v in sorted(stats.staleness_histogram.items())},
        "mcups": round(connections * stats.patterns_applied / max(elapsed, 1e-9) / 1e6, 2),
        "elapsed_seconds": round(elapsed, 3),
        "queues": queues(coordinator),
        "workers_live": len(coordinator.sessions),
        "compression": ledger_totals(
            s.ledger
            for s in [*coordinator.sessions.values(), *coordinator.departed]
            if s.ledger is not None
        ),
        "workers": workers,
        "earlier": coordinator.earlier,  # workers and compression totals before restarts
        "epochs": [record.as_dict() for record in stats.epochs],
        "schedule": coordinator.job.schedule,
        "hooks": coordinator.hooks.figures(),
        "inline_frames": {
            "frames_sent": coordinator.inline.frames_sent,
            "bytes_sent": coordinator.inline.bytes_sent,
        },
    }


def _line(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    if labels:
        rendered = ",".join(
            f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
            for k, v in labels.items()
        )
        return f"snet_{name}{{{rendered}}} {value}"
    return f"snet_{name} {value}"


_METRICS = [
    ("weight_version", "gauge", "Current weight version (steps applied)."),
    ("updates_applied", "counter", "Updates applied to the weights."),
    ("updates_rejected", "counter", "Updates refused (shape, NaN, lease)."),
    ("frames_refused", "counter", "Connections closed for undecodable frames."),
    ("patterns_processed", "counter", "Training patterns applied."),
    ("epoch", "gauge", "Current epoch (0-based)."),
    ("learning_rate", "gauge", "Learning rate in force."),
    ("staleness_mean", "gauge", "Mean staleness of applied updates (versions)."),
    ("workers_live", "gauge", "Connected workers."),
    ("mcups", "gauge", "Million connection updates per second since start."),
]


def metrics_text(server: SnetServer) -> str:
    """GET /metrics in the Prometheus text exposition format (version 0.0.4)."""
    document = status_document(server)
    lines: list[str] = []
    for name, kind, text in _METRICS:
        lines += [f"# HELP snet_{name} {text}", f"# TYPE snet_{name} {kind}"]
        lines.append(_line(name, float(document[name])))
    for key in ("train_accuracy", "cv_accuracy"):
        if document[key] is not None:
            lines += [f"# TYPE snet_{key} gauge", _line(key, float(document[key]))]
    lines.append("# TYPE snet_queue_length gauge")
    for queue, length in document["queues"].items():
        lines.append(_line("queue_length", float(length), {"queue": queue}))
    lines.append("# TYPE snet_worker_updates counter")
    for row in document["workers"]:
        labels = {"worker": row["name"], "backend": row["backend"], "state": row["state"]}
        lines.append(_line("worker_updates", float(row["updates_sent"]), labels))
    lines.append("# TYPE snet_worker_mcups gauge")
    for row in document["workers"]:
        labels = {"worker": row["name"], "backend": row["backend"], "state": row["state"]}
        lines.append(_line("worker_mcups", float(row["mcups"]), labels))
    lines += _compression_metrics(document)
    return "\n".join(lines) + "\n"


def _compression_metrics(document: dict[str, Any]) -> list[str]:
    """The compression ledger: bytes on the wire and as float32, ratios, worker figures."""
    total = document["compression"]
    lines = [
        "# HELP snet_compression_bytes Element-carrying frames: wire bytes and float32 bytes.",
        "# TYPE snet_compression_bytes counter",
    ]
    for direction in ("received", "sent"):
        for kind, key in (("wire", f"{direction}_bytes"), ("float32", f"{direction}_raw_bytes")):
            labels = {"direction": direction, "kind": kind}
            lines.append(_line("compression_bytes", float(total[key]), labels))
    lines.append("# TYPE snet_compression_ratio gauge")
    for direction in ("received", "sent"):
        if total[f"{direction}_ratio"] is not None:
            value = float(total[f"{direction}_ratio"])
            lines.append(_line("compression_ratio", value, {"direction": direction}))
    figures: tuple[tuple[str, str, dict[str, str]], ...] = (
        ("worker_compression_ratio", "received_ratio", {"direction": "received"}),
        ("worker_compression_ratio", "sent_ratio", {"direction": "sent"}),
        ("worker_residual_norm", "residual_norm", {}),
        ("worker_update_cosine", "cosine_last", {}),
    )
    for name, key, extra in figures:
        if extra.get("direction") != "sent":
            lines.append(f"# TYPE snet_{name} gauge")
        for row in document["workers"]:
            ledger = row.get("compression") or {}
            if ledger.get(key) is not None:
                labels = {"worker": row["name"], "codec": ledger["update_codec"], **extra}
                lines.append(_line(name, float(ledger[key]), labels))
    return lines
