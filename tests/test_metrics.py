"""/metrics of a live server: ``promtool check metrics`` passes, worker series are stable
and distinct, and the Grafana dashboard in deploy/ asks only for metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import Cluster, ServerProcess, run_process, wait_until

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "snet-dashboard.json"
SERIES = re.compile(r"^(snet_[a-z_]+)(\{[^}]*\})? ")


def small_data(path: Path, count: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, count)
    features = rng.standard_normal((count, 6)) + labels[:, None]
    np.savez(path, X=features.astype(np.float32), y=labels)
    return str(path)


def promtool(text: str) -> subprocess.CompletedProcess[str]:
    return run_process(["promtool", "check", "metrics"], input=text, timeout=30)


def worker_series(text: str, names: tuple[str, ...]) -> set[str]:
    """The series (name and labels, no value) of the given metrics."""
    found = set()
    for line in text.splitlines():
        match = SERIES.match(line)
        if match and match.group(1) in names:
            found.add(match.group(1) + (match.group(2) or ""))
    return found


def types_of(text: str) -> dict[str, str]:
    return dict(line.split(" ")[2:4] for line in text.splitlines() if line.startswith("# TYPE "))


def trained_server(cluster: Cluster, tmp_path: Path) -> tuple[ServerProcess, str, str]:
    """A server whose two workers share a name: /metrics while both train, and after."""
    server = cluster.server(
        "--data", small_data(tmp_path / "t.npz", 3000, 1),
        "--cv-data", small_data(tmp_path / "cv.npz", 300, 2),
        "--test-data", small_data(tmp_path / "test.npz", 300, 3),
        "--context", "0", "--network", "6:16:4", "--epochs", "3", "--bunch-size", "20",
        "--chunk-frames", "200", "--min-workers", "2", "--linger-seconds", "60",
    )  # fmt: skip
    for _ in range(2):
        cluster.worker(server, "same-name", "--backend", "numpy", "--compress", "int8")

    def both_training() -> str | None:
        text = server.get("/metrics").decode()
        connected = re.findall(r"^snet_worker_connected\{.*\} 1\.0$", text, re.MULTILINE)
        started = "snet_updates_applied_total 0.0" not in text
        return text if len(connected) == 2 and started else None

    during: str = wait_until(both_training, 60, "both workers training")
    wait_until(lambda: server.status()["test"] is not None, 90, "training and the test score")
    wait_until(lambda: server.status()["workers_live"] == 0, 30, "the workers to leave")
    return server, during, server.get("/metrics").decode()


def test_metrics_pass_promtool_and_keep_their_series(cluster: Cluster, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian's prometheus; `make browser` as root)")
    server, during, after = trained_server(cluster, tmp_path)
    for text in (during, after):
        checked = promtool(text)
        assert checked.returncode == 0 and checked.stdout == "", checked.stdout + checked.stderr

    kinds = types_of(after)
    assert all(name.endswith("_total") for name, kind in kinds.items() if kind == "counter")
    helped = {line.split(" ")[2] for line in after.splitlines() if line.startswith("# HELP ")}
    assert helped == set(kinds)

    names = ("snet_worker_updates_total", "snet_worker_connected", "snet_worker_mcups")
    # two workers named alike are two series, told apart by worker_id (the server also
    # tells live workers of one name apart by a suffix: same-name, same-name-2) ...
    names_of = {row["id"]: row["name"] for row in server.status()["workers"]}
    assert len(names_of) == 2
    assert sorted(names_of.values()) == ["same-name", "same-name-2"]
    for worker_id, name in names_of.items():
        label = f'worker_id="{worker_id}",worker="{name}",backend="numpy"'
        assert f"snet_worker_updates_total{{{label}}}" in after
        assert f"snet_worker_connected{{{label}}} 0.0" in after
        assert f"snet_worker_connected{{{label}}} 1.0" in during
    # ... and leaving does not start new series: the same ones, with other values
    assert worker_series(during, names) == worker_series(after, names)
    assert len(worker_series(after, names)) == 6

    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in after.splitlines()
              if line and not line.startswith("#")}  # fmt: skip
    status = server.status()
    assert values["snet_updates_applied_total"] == status["updates_applied"]
    assert values["snet_test_accuracy"] == status["test"]["accuracy"]
    assert values["snet_epochs_done"] == 3
    assert values["snet_epoch"] == 3  # the last of 3, counted from 1 as /status counts
    assert values["snet_progress_ratio"] == 1.0 and values["snet_eta_seconds"] == 0.0
    assert values["snet_waiting_for_workers"] == 0.0
    checkpoints = status["checkpoints"]  # the final one is on disk once trained
    assert values["snet_checkpoints_written_total"] == checkpoints["written"] >= 1
    assert values["snet_checkpoint_last_version"] == checkpoints["last"]["version"]
    assert checkpoints["last"]["version"] == status["weight_version"]


def test_the_grafana_dashboard_queries_metrics_that_exist(cluster: Cluster, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(expressions) >= 10 and dashboard["uid"] and dashboard["title"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            expressions.append(variable["definition"])
    asked = {name for expr in expressions for name in re.findall(r"\bsnet_[a-z_]+", expr)}
    _, during, after = trained_server(cluster, tmp_path)
    exported = set(types_of(after)) | set(types_of(during))
    assert asked <= exported, f"the dashboard asks for {sorted(asked - exported)}"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
