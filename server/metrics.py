"""GET /metrics: the /status figures in the Prometheus text format (version 0.0.4).

Written by hand (a few dozen lines; ``prometheus_client`` would add a dependency and a
registry for figures the status document already holds) and checked in the tests by
``promtool check metrics``:

- every metric has ``# HELP`` and ``# TYPE``, and counters end in ``_total``;
- a worker's series carry ``worker_id`` (the server's number for the connection, unique
  for the server's life), so two workers with the same name stay two series; ``worker``
  (its name) and ``backend`` ride along, and whether it is still connected is the value
  of ``snet_worker_connected``, not a label, so a worker that leaves does not start new
  series. A worker that reconnects gets a new id, as a restarted process would.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .staleness_report import staleness_metrics
from .status import status_document

if TYPE_CHECKING:
    from .app import SnetServer

Labels = dict[str, str]


class Exposition:
    """Lines of the text format, each metric's HELP and TYPE written before its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, text: str, samples: list[tuple[Labels, float]]) -> None:
        self.lines += [f"# HELP snet_{name} {text}", f"# TYPE snet_{name} {kind}"]
        for labels, value in samples:
            self.lines.append(f"snet_{name}{_labels(labels)} {_number(value)}")

    def single(self, name: str, kind: str, text: str, value: float | None) -> None:
        """A metric of one unlabelled sample; left out while its value is unknown."""
        if value is not None:
            self.metric(name, kind, text, [({}, float(value))])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    escaped = (
        f'{key}="{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for key, value in labels.items()
    )
    return "{" + ",".join(escaped).replace("\n", "\\n") + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


_SERVER_FIGURES = (
    ("weight_version", "gauge", "Current weight version (steps applied).", "weight_version"),
    ("steps_total", "counter", "Steps applied to the weights.", "steps"),
    ("updates_applied_total", "counter", "Updates applied to the weights.", "updates_applied"),
    ("updates_rejected_total", "counter", "Updates refused (shape, NaN, lease).",
     "updates_rejected"),
    ("frames_refused_total", "counter", "Connections closed for undecodable frames.",
     "frames_refused"),
    ("handshakes_refused_total", "counter", "Connections refused in the handshake.",
     "handshakes_refused"),
    ("connections_refused_total", "counter",
     "Worker connections turned away at max_connections.", "connections_refused"),
    ("handshakes_turned_away_total", "counter",
     "Worker connections turned away at max_handshakes.", "handshakes_turned_away"),
    ("handshakes_turned_away_per_address_total", "counter",
     "Worker connections turned away at max_handshakes_per_address.",
     "handshakes_turned_away_per_address"),
    ("handshakes_timed_out_total", "counter",
     "Worker connections closed for no hello within handshake_seconds.", "handshakes_timed_out"),
    ("tls_handshakes_failed_total", "counter",
     "TLS handshakes failed on the worker port (no or a foreign certificate, no TLS).",
     "tls_handshakes_failed"),
    ("http_tls_handshakes_failed_total", "counter",
     "TLS handshakes failed on the HTTP port (plain HTTP, a peer not trusting the server).",
     "http_tls_handshakes_failed"),
    ("http_connections_refused_total", "counter",
     "HTTP connections answered 503 at http_connections.", "http_connections_refused"),
    ("http_connections_refused_per_address_total", "counter",
     "HTTP connections answered 503 at http_connections_per_address.",
     "http_connections_refused_per_address"),
    ("connections_open", "gauge", "Connections open on the worker port.", "connections_open"),
    ("patterns_processed_total", "counter", "Training patterns applied.", "patterns_processed"),
    ("leases_revoked_total", "counter", "Leases taken back from workers past their deadline.",
     "leases_revoked"),
    ("leases_handed_over_total", "counter",
     "An epoch's last leases taken from far slower workers for idle ones.", "leases_handed_over"),
    ("workers_dropped_late_total", "counter", "Workers dropped for missing a sync round.",
     "workers_dropped_late"),
    ("epoch", "gauge", "Current epoch (counted from 1).", "epoch"),
    ("epochs_done", "gauge", "Epochs trained.", "epochs_done"),
    ("epochs_planned", "gauge", "Epochs the job trains at most.", "epochs_planned"),
    ("learning_rate", "gauge", "Learning rate in force.", "learning_rate"),
    ("staleness_mean", "gauge", "Mean staleness of applied updates (versions).",
     "staleness_mean"),
    ("workers_live", "gauge", "Connected workers.", "workers_live"),
    ("mcups", "gauge", "Million connection updates per second since the first frames were "
     "leased (to the end of training once trained).", "mcups"),
    ("train_accuracy", "gauge", "Frame accuracy on the training patterns of the last epoch.",
     "train_accuracy"),
    ("cv_accuracy", "gauge", "Cross-validation frame accuracy of the last scored epoch.",
     "cv_accuracy"),
    ("weights_cv_accuracy", "gauge", "Cross-validation frame accuracy of the weights held "
     "(the newest scored epoch not rolled back).", "weights_cv_accuracy"),
)  # fmt: skip

_WORKER_FIGURES = (
    ("worker_updates_total", "counter", "The worker's updates taken for a step (its refused "
     "ones are in worker_updates_rejected_total).", "updates_sent"),
    ("worker_updates_rejected_total", "counter", "The worker's updates refused.",
     "updates_rejected"),
    ("worker_patterns_total", "counter", "Patterns in the worker's updates.", "patterns"),
    ("worker_mcups", "gauge", "The worker's million connection updates per second.", "mcups"),
    ("worker_staleness_mean", "gauge", "Mean staleness of the worker's updates.",
     "staleness_mean"),
    ("worker_update_norm_per_pattern", "gauge", "Running mean norm per pattern of the "
     "worker's updates taken (its kind with the most).", "norm_per_pattern"),
)  # fmt: skip


def worker_labels(row: dict[str, Any]) -> Labels:
    """The labels of a worker's series: a stable id, its name and backend."""
    return {"worker_id": str(row["id"]), "worker": row["name"], "backend": row["backend"]}


def metrics_text(server: SnetServer) -> str:
    """GET /metrics."""
    document = status_document(server)
    out = Exposition()
    for name, kind, text, key in _SERVER_FIGURES:
        out.single(name, kind, text, document[key])
    _progress(out, document)
    test = document.get("test")
    out.single("test_accuracy", "gauge", "Frame accuracy on the job's test file, at the end.",
               test["accuracy"] if test else None)  # fmt: skip
    _checkpoints(out, document)
    queues = dict(document["queues"])
    overflows, pool_size = queues.pop("pool_overflows"), queues.pop("pool_size")
    made = queues.pop("pool_made")
    out.metric("queue_length", "gauge", "Lengths of the element pool's and lease book's queues.",
               [({"queue": queue}, length) for queue, length in queues.items()])  # fmt: skip
    out.single("pool_size", "gauge", "Elements the server's pool may hold.", pool_size)
    out.single("pool_elements_made", "gauge", "Pool elements made so far, each kept for reuse.",
               made)  # fmt: skip
    out.single("pool_overflows_total", "counter", "Elements allocated beyond the pool.",
               overflows)  # fmt: skip
    inline = document["inline_frames"]
    out.single("inline_frames_sent_total", "counter", "Frames sent to workers fed inline.",
               inline["frames_sent"])  # fmt: skip
    out.single("inline_bytes_sent_total", "counter", "Bytes of frames sent inline.",
               inline["bytes_sent"])  # fmt: skip
    rows = document["workers"]
    out.metric("worker_connected", "gauge", "1 while the worker is connected, 0 once it left.",
               [(worker_labels(r), float(r["state"] != "gone")) for r in rows])  # fmt: skip
    for name, kind, text, key in _WORKER_FIGURES:  # (a figure not known yet: no sample)
        samples = [(worker_labels(r), float(r[key])) for r in rows if r[key] is not None]
        out.metric(name, kind, text, samples)
    norms = document["update_norms"]
    out.metric("update_norm_per_pattern", "gauge", "Running mean norm per pattern of the "
               "updates taken, by kind (codec).",
               [({"kind": k["kind"]}, k["norm_per_pattern"]) for k in norms])  # fmt: skip
    out.metric("update_norm_largest_per_pattern", "gauge", "The largest norm per pattern "
               "an update of the kind is taken with now.",
               [({"kind": k["kind"]}, k["largest_per_pattern"]) for k in norms])  # fmt: skip
    _compression(out, document)
    return out.text().rstrip("\n") + "\n" + "\n".join(staleness_metrics(document)) + "\n"


def _progress(out: Exposition, document: dict[str, Any]) -> None:
    """How much of the job is done, how fast, how long to go (server/job_progress.py)."""
    progress = document["progress"]
    out.single("progress_ratio", "gauge", "Fraction of the job's planned training frames "
               "applied (0 to 1).", progress["fraction"])  # fmt: skip
    out.single("frames_per_second", "gauge", "Training frames applied per second, recently.",
               progress["frames_per_second"])  # fmt: skip
    out.single("eta_seconds", "gauge", "Seconds of training left at the recent rate.",
               progress["eta_seconds"])  # fmt: skip
    out.single("waiting_for_workers", "gauge", "1 while fewer than --min-workers have joined.",
               float(document["state"] == "waiting_for_workers"))  # fmt: skip


def _checkpoints(out: Exposition, document: dict[str, Any]) -> None:
    """What checkpoints cost and how recent the last one is (server/checkpointer.py)."""
    figures = document.get("checkpoints")
    if not figures:
        return
    out.single("checkpoints_written_total", "counter", "Checkpoints written to the out-dir.",
               figures["written"])  # fmt: skip
    out.single("checkpoints_failed_total", "counter", "Checkpoints not taken or not written.",
               figures["failed"])  # fmt: skip
    out.single("checkpoint_take_seconds_total", "counter",
               "Seconds the event loop spent taking checkpoints.",
               figures["take_seconds_total"])  # fmt: skip
    out.single("checkpoint_write_seconds_total", "counter",
               "Seconds the writer thread spent writing checkpoints.",
               figures["write_seconds_total"])  # fmt: skip
    out.single("checkpoint_last_version", "gauge", "Weight version of the last checkpoint.",
               figures["last"].get("version"))  # fmt: skip


def _compression(out: Exposition, document: dict[str, Any]) -> None:
    """The compression ledger: bytes on the wire and as float32, ratios, worker figures."""
    total = document["compression"]
    out.metric(
        "compression_bytes_total",
        "counter",
        "Element-carrying frames: bytes on the wire and as float32.",
        [
            ({"direction": direction, "kind": kind}, float(total[key]))
            for direction in ("received", "sent")
            for kind, key in (("wire", f"{direction}_bytes"), ("float32", f"{direction}_raw_bytes"))
        ],
    )
    out.metric(
        "weights_shared_total",
        "counter",
        "Copies of the weights sent through the weights board (no element on the wire).",
        [({}, float(total.get("weights_shared", 0)))],
    )
    out.metric(
        "updates_shared_total",
        "counter",
        "Updates sent through the workers' update boards (no element on the wire).",
        [({}, float(total.get("updates_shared", 0)))],
    )
    out.metric(
        "compression_ratio",
        "gauge",
        "Float32 bytes over wire bytes of element-carrying frames.",
        [
            ({"direction": direction}, float(total[f"{direction}_ratio"]))
            for direction in ("received", "sent")
            if total[f"{direction}_ratio"] is not None
        ],
    )
    figures: tuple[tuple[str, str, tuple[tuple[str, Labels], ...]], ...] = (
        ("worker_compression_ratio", "The worker's float32 over wire bytes.",
         (("received_ratio", {"direction": "received"}), ("sent_ratio", {"direction": "sent"}))),
        ("worker_residual_norm", "L2 norm of the worker's error-feedback residual.",
         (("residual_norm", {}),)),
        ("worker_update_cosine", "Cosine of the decoded update and the true gradient.",
         (("cosine_last", {}),)),
    )  # fmt: skip
    for name, text, keys in figures:
        samples: list[tuple[Labels, float]] = []
        for row in document["workers"]:
            ledger = row.get("compression") or {}
            for key, extra in keys:
                if ledger.get(key) is not None:
                    labels = {**worker_labels(row), "codec": ledger["update_codec"], **extra}
                    samples.append((labels, float(ledger[key])))
        out.metric(name, "gauge", text, samples)
