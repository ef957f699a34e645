"""``snet status``: a server's /status as a readable table, or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def fetch_status(url: str, timeout: float = 5.0, token: str = "") -> dict[str, Any]:
    """GET ``url``/status (with ``token``: as ``Authorization: Bearer``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url.rstrip("/") + "/status", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        document: dict[str, Any] = json.load(response)
        return document


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _compression_line(total: dict[str, Any] | None) -> list[str]:
    """The compression ledger's totals in one line (none before any update)."""
    if not total or not total.get("updates"):
        return []
    codecs = ", ".join(f"{codec} x{n}" for codec, n in total["update_codecs"].items())
    return [
        f"compression: updates {codecs}, {total['bytes_per_update']} B each, "
        f"{total['received_ratio']}x fewer bytes received, {total['sent_ratio']}x sent"
    ]


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
        *_compression_line(document.get("compression")),
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
    token = os.environ.get("SNET_TOKEN", "")
    try:
        if args.token_file:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        document = fetch_status(url, token=token)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            print(f"snet: {url} needs the server's token (SNET_TOKEN or --token-file)",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"snet: cannot read {url}/status: {exc}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"snet: cannot read {url}/status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=1) if args.json else render(document))
    return 0
