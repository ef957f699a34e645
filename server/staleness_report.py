"""Staleness as /status and /metrics show it: the policy in force, its changes, and the
histogram of applied updates' staleness in total and per worker.

Kept apart from server/status.py so that the /metrics lines move with the metrics module
as one function (``staleness_metrics``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .training import Coordinator

BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)  # /metrics histogram bounds (versions)


def staleness_status(coordinator: Coordinator) -> dict[str, Any]:
    """The ``staleness`` section of /status."""
    return {
        **coordinator.staleness.figures(),
        "history_versions": len(coordinator.runner.history),
        "uncompensated": coordinator.runner.history.misses,
        "idle_worker_epochs": coordinator.idle.idle_worker_epochs,
    }


def _histogram_lines(histogram: dict[str, int], labels: str) -> list[str]:
    """One Prometheus histogram (cumulative buckets, sum and count) from /status's
    ``{"staleness": updates}``."""
    counts = {int(k): v for k, v in histogram.items()}
    separator = "," if labels else ""
    lines = []
    for bound in BUCKETS:
        below = sum(v for k, v in counts.items() if k <= bound)
        lines.append(f'snet_staleness_bucket{{{labels}{separator}le="{bound}"}} {below}')
    total = sum(counts.values())
    lines.append(f'snet_staleness_bucket{{{labels}{separator}le="+Inf"}} {total}')
    suffix = f"{{{labels}}}" if labels else ""
    lines.append(f"snet_staleness_sum{suffix} {sum(k * v for k, v in counts.items())}")
    lines.append(f"snet_staleness_count{suffix} {total}")
    return lines


def staleness_metrics(document: dict[str, Any]) -> list[str]:
    """The /metrics lines: the staleness histogram in total and per worker (label
    ``worker``), the policy in force (an info-style gauge) and refused stale updates."""
    lines = [
        "# HELP snet_staleness Staleness of applied updates (versions they did not see).",
        "# TYPE snet_staleness histogram",
        *_histogram_lines(document["staleness_histogram"], ""),
    ]
    for row in document["workers"]:
        name = row["name"].replace("\\", "\\\\").replace('"', '\\"')
        lines += _histogram_lines(row.get("staleness_histogram", {}), f'worker="{name}"')
    section = document["staleness"]
    lines += [
        "# HELP snet_staleness_policy The staleness policy in force (1 for its name).",
        "# TYPE snet_staleness_policy gauge",
        f'snet_staleness_policy{{policy="{section["policy"]}"}} 1',
        "# HELP snet_staleness_refused_total Updates refused for being too stale.",
        "# TYPE snet_staleness_refused_total counter",
        f"snet_staleness_refused_total {section['refused_stale']}",
        "# HELP snet_idle_worker_epochs_total Epochs a connected worker got no frames in.",
        "# TYPE snet_idle_worker_epochs_total counter",
        f"snet_idle_worker_epochs_total {section['idle_worker_epochs']}",
    ]
    return lines
