"""``snet status``: a server's /status as a readable table, or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as response:
        document: dict[str, Any] = json.load(response)
        return document


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def render(document: dict[str, Any]) -> str:
    """The status document as a few lines and two tables (three with emulated boards)."""
    lines = [
        f"server {document['server']} ({document['state']}), {document['mode']} mode, "
        f"network {document['network']}",
        f"epoch {document['epoch'] + 1}/{document['epochs_planned']}, "
        f"version {document['weight_version']}, {document['updates_applied']} updates applied, "
        f"{document['updates_rejected']} refused, lr {document['learning_rate']:g}",
        f"train accuracy {_percent(document['train_accuracy'])}, "
        f"CV accuracy {_percent(document['cv_accuracy'])}, "
        f"staleness mean {document['staleness_mean']} max {document['staleness_max']}, "
        f"{document['mcups']} MCUPS",
        "queues: " + ", ".join(f"{k} {v}" for k, v in document["queues"].items()),
        "",
        f"{'epoch':>5} {'lr':>8} {'train':>8} {'cv':>8} {'seconds':>8}",
    ]
    for epoch in document["epochs"]:
        lines.append(
            f"{epoch['epoch'] + 1:>5} {epoch['learning_rate']:>8g} "
            f"{_percent(epoch['train_accuracy']):>8} {_percent(epoch['cv_accuracy']):>8} "
            f"{epoch['seconds']:>8.1f}"
        )
    lines += [
        "",
        f"{'worker':<22} {'backend':<8} {'state':<9} {'address':<22} {'updates':>8} "
        f"{'stale':>6} {'MCUPS':>8} {'seen':>7}",
    ]
    now = time.time()
    for row in document["workers"]:
        lines.append(
            f"{row['name']:<22.22} {row['backend']:<8} {row['state']:<9} {row['address']:<22} "
            f"{row['updates_sent']:>8} {row['staleness_mean']:>6.2f} {row['mcups']:>8.1f} "
            f"{now - row['last_seen']:>6.1f}s"
        )
    lines += _board_lines(document["workers"])
    return "\n".join(lines)


def _board_lines(workers: list[dict[str, Any]]) -> list[str]:
    """Emulated boards' modelled figures (from their reports) beside the real ones."""
    boards = [row for row in workers if "modelled_busy_s" in (row.get("report") or {})]
    if not boards:
        return []
    lines = [
        "",
        f"{'board':<22} {'scale':>6} {'busy s':>8} {'link s':>8} {'comp s':>8} "
        f"{'MCUPS':>7} {'real s':>8} {'real MCUPS':>10} {'behind':>6}",
    ]
    for row in boards:
        report = row["report"]
        lines.append(
            f"{row['name']:<22.22} {report['time_scale']:>6g} {report['modelled_busy_s']:>8.2f} "
            f"{report['modelled_link_s']:>8.2f} {report['modelled_compute_s']:>8.2f} "
            f"{report['modelled_mcups']:>7.1f} {report['real_compute_s']:>8.2f} "
            f"{report['real_mcups']:>10.1f} {report['behind_model']:>6}"
        )
    return lines


def run_status(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("SNET_URL", "http://127.0.0.1:7080")
    try:
        document = fetch_status(url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"snet: cannot read {url}/status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=1) if args.json else render(document))
    return 0
