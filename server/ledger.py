"""The compression ledger: what each worker's updates and weights cost on the wire.

Per worker (a ``CompressionLedger`` in its session) and in total, for /status and
/metrics: whole frames received as updates and sent as weights (prefix, header and
payload, counted by the connection's channel), what the same frames would have cost with
float32 elements, the ratio of the two (weights a worker on the server's machine read from
its weights board, transport/shared_board.py, are counted apart: they cross no wire), and
the figures only the worker can measure (its error-feedback residual's norm and the cosine
similarity between what the server decodes and the uncompressed update), which it sends
in its ``WorkerReport``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from snet.protocol.codecs import carries_momentum
from snet.protocol.codecs.weights import WeightsEncoder
from snet.protocol.decoder import TrafficCounters

WORKER_FIGURES = ("residual_norm", "cosine_last", "cosine_mean")


def _ratio(raw: int, wire: int) -> float | None:
    return round(raw / wire, 3) if wire else None


@dataclass
class CompressionLedger:
    """One worker's compression figures."""

    update_codec: str
    weights: WeightsEncoder
    received: TrafficCounters = field(default_factory=TrafficCounters)
    sent: TrafficCounters = field(default_factory=TrafficCounters)
    updates: int = 0
    update_payload_bytes: int = 0  # the elements as they came (encoded or float32)
    update_raw_bytes: int = 0  # the same elements as float32
    undecodable: int = 0
    updates_shared: int = 0  # updates copied from the worker's update board
    update_board: dict[str, Any] | None = None  # where it is, as the Welcome says
    worker: dict[str, float | None] = field(default_factory=dict)
    # decided once at the handshake: the step reads it for every update it applies
    momentum_corrected: bool = field(init=False)

    def __post_init__(self) -> None:
        self.momentum_corrected = carries_momentum(self.update_codec)

    def agreed(self) -> dict[str, Any]:
        """The codecs agreed at the handshake, as ``Welcome.codecs`` carries them (with
        where the weights board is, for ``shared``)."""
        agreed: dict[str, Any] = {"update": self.update_codec, "weights": self.weights.form}
        if self.weights.board is not None:
            agreed["board"] = self.weights.board.described()
        if self.update_board is not None:
            agreed["update_board"] = self.update_board
        return agreed

    def record_update(self, payload_bytes: int, raw_bytes: int, shared: bool = False) -> None:
        """One update: its element's bytes in its frame and as float32 (``shared``: from
        the update board, in no byte count)."""
        self.updates += 1
        self.updates_shared += shared
        self.update_payload_bytes += payload_bytes
        self.update_raw_bytes += raw_bytes

    def count_undecodable(self) -> None:
        """An update came in a form its codec could not decode."""
        self.undecodable += 1

    def absorb_report(self, figures: Any) -> None:
        """Take the worker's own figures from its report (anything odd is ignored)."""
        if not isinstance(figures, dict):
            return
        for key in WORKER_FIGURES:
            value = figures.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.worker[key] = float(value) if math.isfinite(value) else None

    def totals(self) -> dict[str, int]:
        """Wire and float32-equivalent bytes, both directions (what the totals add up)."""
        received = self.received.bytes.get("update", 0)
        sent = self.sent.bytes.get("weights", 0)
        return {
            "updates": self.updates,
            "received_bytes": received,
            "received_raw_bytes": received - self.update_payload_bytes + self.update_raw_bytes,
            "weights_sent": self.weights.copies,
            "weights_shared": self.weights.shared_copies,
            "updates_shared": self.updates_shared,
            "sent_bytes": sent,
            "sent_raw_bytes": sent - self.weights.payload_bytes + self.weights.raw_bytes,
            "undecodable": self.undecodable,
        }

    def row(self) -> dict[str, Any]:
        """The worker's "compression" entry in /status."""
        totals = self.totals()
        return {
            "update_codec": self.update_codec,
            "weights_codec": self.weights.form,
            **totals,
            "received_ratio": _ratio(totals["received_raw_bytes"], totals["received_bytes"]),
            "bytes_per_update": (
                round(totals["received_bytes"] / totals["updates"]) if totals["updates"] else None
            ),
            "sent_ratio": _ratio(totals["sent_raw_bytes"], totals["sent_bytes"]),
            "weights_full_copies": self.weights.full_copies,
            **{key: self.worker.get(key) for key in WORKER_FIGURES},
        }


def ledger_totals(
    ledgers: Iterable[CompressionLedger],
    folded: Mapping[str, int] | None = None,
    folded_codecs: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """All workers together, with the ratios of the sums (``folded``: the sums and codec
    counts of ledgers no longer kept, e.g. of departed workers)."""
    sums: dict[str, int] = dict(folded or {})
    codecs: dict[str, int] = dict(folded_codecs or {})
    for ledger in ledgers:
        for key, value in ledger.totals().items():
            sums[key] = sums.get(key, 0) + value
        codecs[ledger.update_codec] = codecs.get(ledger.update_codec, 0) + 1
    received, sent = sums.get("received_bytes", 0), sums.get("sent_bytes", 0)
    return {
        "update_codecs": codecs,
        "updates": sums.get("updates", 0),
        "received_bytes": received,
        "received_raw_bytes": sums.get("received_raw_bytes", 0),
        "received_ratio": _ratio(sums.get("received_raw_bytes", 0), received),
        "bytes_per_update": round(received / sums["updates"]) if sums.get("updates") else None,
        "sent_bytes": sent,
        "sent_raw_bytes": sums.get("sent_raw_bytes", 0),
        "sent_ratio": _ratio(sums.get("sent_raw_bytes", 0), sent),
        "weights_shared": sums.get("weights_shared", 0),
        "updates_shared": sums.get("updates_shared", 0),
        "undecodable": sums.get("undecodable", 0),
    }
