"""The HTTP API (in process) and ``snet status`` (a real process) against a real training
server."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time

import numpy as np
import pytest

from helpers import SMALL_JOB, Cluster, status_table, wait_until
from inprocess import Lab
from inprocess import wait_until as wait_in_lab
from short_data import short_data

STATUS_KEYS = {
    "mode",
    "weight_version",
    "updates_applied",
    "epoch",
    "patterns_processed",
    "learning_rate",
    "train_accuracy",
    "cv_accuracy",
    "queues",
    "workers",
}
WORKER_KEYS = {
    "name",
    "address",
    "backend",
    "updates_sent",
    "staleness_last",
    "staleness_mean",
    "mcups",
    "last_seen",
}
METRIC_LINE = re.compile(r'^snet_[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+-]+$')


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: see tests/README.md
async def test_status_metrics_weights_and_healthz(lab: Lab) -> None:
    server = await lab.server(  # a third of the data: its figures, not learning, are the test
        "--mode", "async", "--epochs", "2", "--linger-seconds", "60", *SMALL_JOB,
        "--data", short_data(),
    )  # fmt: skip
    for i in range(2):
        lab.worker(server, f"w{i}")

    async def trained() -> bool:
        return bool((await server.status())["state"] == "trained")

    await wait_in_lab(trained, 90, "training to finish")
    paths = ("/healthz", "/status", "/metrics", "/weights")
    first = _check_the_api(*[await server.get(path) for path in paths])
    await asyncio.sleep(0.3)  # lingering, trained: its figures stay (MCUPS fell as it waited)
    later = await server.status()
    assert (later["mcups"], later["elapsed_seconds"]) == (first["mcups"], first["elapsed_seconds"])
    assert first["mcups"] > 0
    # status.json written at completion says why it stopped training (it said null)
    assert (server.final_status()["state"], server.final_status()["stop_reason"]) == (
        "trained", "trained")  # fmt: skip
    # stopped while serving its results, as the Kubernetes manifest's --linger-seconds=-1
    # ends every run: it ends trained (status.json said "signal SIGTERM")
    server.stop("signal SIGTERM")
    assert await server.wait(30) == "trained"
    final = server.final_status()
    assert (final["state"], final["stop_reason"]) == ("trained", "trained")


@pytest.mark.system
def test_status_metrics_weights_healthz_and_cli(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "2", "--linger-seconds", "60", *SMALL_JOB
    )
    workers = [cluster.worker(server, f"w{i}") for i in range(2)]
    wait_until(lambda: server.status()["state"] == "trained", 90, "training to finish")
    paths = ("/healthz", "/status", "/metrics", "/weights")
    status = _check_the_api(*[server.get(path) for path in paths])

    table = status_table(server.url)
    assert "async mode" in table and "w0" in table and "w1" in table
    assert f"{100 * status['cv_accuracy']:.2f}%" in table
    raw = cluster.run("status", "--url", server.url, "--json", timeout=30).stdout
    assert json.loads(raw)["weight_version"] == status["weight_version"]

    unreachable = cluster.run("status", "--url", "http://127.0.0.1:9", timeout=30)
    assert unreachable.returncode == 1 and "cannot read" in unreachable.stderr
    for worker in workers:
        worker.kill()


def _check_the_api(healthz: bytes, document: bytes, metrics_text: bytes, weights: bytes) -> dict:
    """GET /healthz, /status, /metrics and /weights of a server trained 2 epochs with 2
    workers, checked; the status document."""
    assert healthz == b"ok\n"

    status: dict = json.loads(document)
    assert set(status) >= STATUS_KEYS
    assert status["mode"] == "async" and status["epochs_done"] == 2
    assert status["updates_applied"] >= status["steps"] > 0
    assert status["patterns_processed"] == 2 * status["epochs"][0]["ledger"]["frames"]
    assert 0.5 < status["cv_accuracy"] <= 1 and 0.5 < status["train_accuracy"] <= 1
    assert set(status["queues"]) >= {"free", "received"}
    queues = status["queues"]  # the pool makes elements as needed: some, never all 32
    assert 0 < queues["pool_made"] < queues["pool_size"] and queues["free"] == queues["pool_size"]
    assert len(status["workers"]) == 2
    for row in status["workers"]:
        assert set(row) >= WORKER_KEYS
        assert row["address"].startswith("127.0.0.1:") and row["mcups"] > 0
    assert sum(row["updates_sent"] for row in status["workers"]) == status["updates_applied"]
    # the norm check's figures: one kind (plain float32 updates), every update taken fed
    # it, judged by the running mean (two workers: no median worker), each worker's own
    [kind] = status["update_norms"]
    assert (kind["kind"], kind["updates"]) == ("none", status["updates_applied"])
    assert kind["judged_by"] == "running mean"
    assert 0 < kind["norm_per_pattern"] < kind["largest_per_pattern"]
    for row in status["workers"]:
        assert kind["norm_per_pattern"] / 3 < row["norm_per_pattern"] < 3 * kind["norm_per_pattern"]

    metrics = metrics_text.decode()
    samples = [line for line in metrics.splitlines() if line and not line.startswith("#")]
    assert all(METRIC_LINE.match(line) for line in samples), [
        line for line in samples if not METRIC_LINE.match(line)
    ]
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in samples}
    assert values["snet_weight_version"] == status["weight_version"]
    assert values["snet_updates_applied_total"] == status["updates_applied"]
    assert values["snet_pool_elements_made"] == queues["pool_made"]
    assert "# TYPE snet_updates_applied_total counter" in metrics
    assert values['snet_update_norm_per_pattern{kind="none"}'] == kind["norm_per_pattern"]
    largest = values['snet_update_norm_largest_per_pattern{kind="none"}']
    assert largest == kind["largest_per_pattern"]
    for row in status["workers"]:
        labels = f'worker_id="{row["id"]}",worker="{row["name"]}",backend="{row["backend"]}"'
        got = values["snet_worker_update_norm_per_pattern{" + labels + "}"]
        assert got == row["norm_per_pattern"]

    with np.load(io.BytesIO(weights)) as npz:
        assert list(npz["sizes"]) == [117, 64, 10]
        assert npz["W0"].shape == (117, 64) and npz["b1"].shape == (10,)
        assert int(npz["version"]) == status["weight_version"]
        assert np.isfinite(npz["W0"]).all()
    return status


def test_the_servers_mcups_counts_from_its_first_lease() -> None:
    """The wait for the workers counted: a server at 3175 MCUPS beside its one worker's
    16,261 (10 s elapsed, about 3 of them training)."""
    from snet.server.stats import TrainingStats
    from snet.server.status import _training_seconds

    stats = TrainingStats(1, started=1000.0)
    stats.start_epoch(0, 0.2)
    assert abs(_training_seconds(False, stats) - (time.time() - 1000.0)) < 1  # none leased
    stats.epochs[0].leased, stats.epochs[0].ended = 1007.0, 1010.0
    assert _training_seconds(True, stats) == 3.0  # from its first lease to its end
