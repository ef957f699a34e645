"""``snet worker --processes N``: N workers forked from one loaded process (real processes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from snet.client.backend import torch_available

from helpers import QUICK_JOB, SMALL_JOB, Cluster, wait_until


@pytest.mark.system
def test_forked_workers_train_under_their_own_names(cluster: Cluster) -> None:
    # QUICK_JOB: the subject is the group's workers and exit code, not learning
    server = cluster.server("--mode", "async", "--epochs", "2", "--min-workers", "2", *QUICK_JOB)
    group = cluster.worker(server, "g", "--processes", "2")
    assert group.wait(120) == 0  # the worst of its workers' exit codes
    assert server.wait(60) == 0
    log = server.log.read_text()
    assert "worker g-1 (numpy" in log and "worker g-2 (numpy" in log  # both joined
    status = server.final_status()
    assert status["state"] == "trained"
    assert all(e["ledger"]["used_once"] == e["ledger"]["frames"] for e in status["epochs"])


@pytest.mark.system
def test_sigterm_to_the_group_stops_every_worker_politely(cluster: Cluster) -> None:
    server = cluster.server("--mode", "async", "--epochs", "500", *SMALL_JOB)
    group = cluster.worker(server, "g", "--processes", "2")
    wait_until(lambda: len(server.status()["workers"]) == 2, 60, "both workers joined")
    group.send_signal(signal.SIGTERM)
    assert group.wait(30) == 0  # each worker said goodbye and exited 0
    wait_until(lambda: server.status()["workers_live"] == 0, 30, "both workers gone")
    log = server.log.read_text()
    assert "worker g-1 left" in log and "worker g-2 left" in log
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0


@pytest.mark.system
def test_processes_must_be_at_least_one(cluster: Cluster) -> None:
    done = cluster.run("worker", "--processes", "0")
    assert done.returncode == 2
    assert "processes must be 1 to 256 (one per core is the rule), got 0" in done.stderr


def _group_refused(cluster: Cluster, *args: str) -> list[str]:
    """``snet worker --processes 3 ARGS`` at a port nobody serves: refused before the fork,
    exit 2; its stderr's lines (one, where each forked worker said it, run together)."""
    done = cluster.run("worker", "--processes", "3", "--server", "127.0.0.1:9", *args)
    assert done.returncode == 2
    return done.stderr.splitlines()


@pytest.mark.system
def test_a_bad_backend_is_said_once_before_the_fork(cluster: Cluster) -> None:
    cluster.env["SNET_WORKER_BACKEND"] = "bogus"
    assert _group_refused(cluster) == [
        "snet: SNET_WORKER_BACKEND: 'bogus' is not one of auto, numpy, torch, spert, modelled"
    ]


@pytest.mark.system
def test_a_missing_tls_file_is_said_once_before_the_fork(cluster: Cluster) -> None:
    """Found by each worker as it started: N times, after the fork."""
    missing = str(cluster.tmp_path / "no-ca.pem")
    assert _group_refused(cluster, "--tls-ca", missing) == [
        f"snet: tls_ca {missing} does not exist"
    ]


@pytest.mark.system
@pytest.mark.skipif(torch_available(), reason="torch is installed: the backend can be made")
def test_a_backend_whose_package_is_missing_is_said_once(cluster: Cluster) -> None:
    assert _group_refused(cluster, "--backend", "torch") == [
        "snet: backend 'torch' needs a package that is missing: torch"
    ]


@pytest.mark.system
def test_a_worker_killed_from_outside_is_named_and_fails_the_group(cluster: Cluster) -> None:
    """kill -9 of one forked worker: the group exited 1 without a word of which or why."""
    server = cluster.server("--mode", "async", "--epochs", "500", *SMALL_JOB)
    group = cluster.worker(server, "g", "--processes", "2")
    wait_until(lambda: len(server.status()["workers"]) == 2, 60, "both workers joined")
    children = Path(f"/proc/{group.pid}/task/{group.pid}/children").read_text().split()
    assert len(children) == 2
    os.kill(int(children[0]), signal.SIGKILL)
    wait_until(lambda: server.status()["workers_live"] == 1, 30, "the killed one dropped")
    group.send_signal(signal.SIGTERM)  # the other stops politely
    assert group.wait(30) == 1  # the worst: one was killed
    assert f"snet: worker process {children[0]} was killed by SIGKILL" in cluster.log("g")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
