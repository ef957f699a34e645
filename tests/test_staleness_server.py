"""Staleness under control, through real servers and workers on 127.0.0.1: full steps and
no idle workers, bounded staleness, DC-ASGD's steps replayed by hand, and the control
endpoint (its token, the change in /status and the trace)."""

from __future__ import annotations

import json
import math
import signal
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from snet.client.data import load_corpus
from snet.protocol.framing import encode_bytes
from snet.protocol.job import DataSpec
from snet.protocol.messages import ErrorMessage, Lease, Update, Weights, Welcome
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.compensation import HISTORY_VERSIONS, delay_compensated
from snet.server.update_rule import UpdateRule

from helpers import QUICK_JOB, SMALL_JOB, Cluster, ServerProcess, wait_until
from raw_client import RawClient

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


def _post(server: ServerProcess, body: object, token: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        server.url + "/control", json.dumps(body).encode(), headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"text": exc.read().decode()}


def _burst(server: ServerProcess, count: int) -> tuple[RawClient, Welcome, Weights, list]:
    """``count`` updates, all computed on version 0, sent back to back by one raw client."""
    client = RawClient(server.port, "burst")
    welcome: Welcome = client.handshake()
    start: Weights = client.receive(Weights)
    lease: Lease = client.receive(Lease)
    assert len(lease.indices) >= count
    rng = np.random.default_rng(11)
    gradients = [rng.standard_normal(LAYOUT.size).astype(np.float32) for _ in range(count)]
    client.send_bytes(
        b"".join(
            encode_bytes(Update(0, lease.lease_id, offset, 1, 0.5, 0, 0.001, gradient))
            for offset, gradient in enumerate(gradients)
        )
    )
    return client, welcome, start, gradients


def test_dcasgd_steps_are_the_hand_compensated_ones(cluster: Cluster) -> None:
    """Every update on version 0, one step each: the k-th is compensated with the weights
    of version k against those of version 0 while version 0 is among the kept ones, and
    applied as it came after that (counted as uncompensated)."""
    count = HISTORY_VERSIONS + 4
    server = cluster.server("--mode", "async", "--updates-per-step", "1", "--epochs", "1",
                            "--staleness", "dcasgd:0.5", *SMALL_JOB)  # fmt: skip
    client, welcome, start, gradients = _burst(server, count)
    wait_until(lambda: server.status()["updates_applied"] == count, 30, "every update")
    final = start
    while final.version < count:
        final = client.receive(Weights)
    reference = UpdateRule(start.element, welcome.job["momentum"])
    for k, gradient in enumerate(gradients):
        if 1 <= k < HISTORY_VERSIONS:
            gradient = delay_compensated(gradient, 1, reference.weights, start.element, 0.5)
        reference.step([gradient], 1, final.learning_rate)
    np.testing.assert_array_equal(final.element, reference.weights)
    status = server.status()
    assert status["staleness"]["policy"] == "dcasgd:0.5"
    assert status["staleness"]["uncompensated"] == count - HISTORY_VERSIONS
    assert status["staleness"]["history_versions"] == HISTORY_VERSIONS
    client.close()


def test_bounded_staleness_applies_nothing_older_than_the_bound(cluster: Cluster) -> None:
    count, bound = 10, 2
    server = cluster.server("--mode", "async", "--updates-per-step", "1", "--epochs", "1",
                            "--staleness", f"bounded:{bound}", *SMALL_JOB)  # fmt: skip
    client, _, _, _ = _burst(server, count)
    refused = [client.receive(ErrorMessage) for _ in range(count - bound - 1)]
    assert all("bounded staleness" in error.text for error in refused)
    status = wait_until(
        lambda: (s := server.status())["updates_applied"] + s["updates_rejected"] == count and s,
        30, "every update settled",
    )  # fmt: skip
    assert status["updates_applied"] == bound + 1
    assert status["staleness_max"] == bound
    assert status["staleness"]["refused_stale"] == count - bound - 1
    assert status["workers"][0]["staleness_histogram"] == {"0": 1, "1": 1, "2": 1}
    metrics = server.get("/metrics").decode()
    assert 'snet_staleness_bucket{le="+Inf"} 3' in metrics
    assert 'snet_staleness_count{worker="burst"} 3' in metrics
    client.close()


def test_four_async_workers_with_a_bound_never_exceed_it(cluster: Cluster) -> None:
    trace = cluster.tmp_path / "trace.jsonl"
    # QUICK_JOB: the bound holds or not whatever the bunch; in bunches of 128 the four
    # workers' updates were most of the test's CPU
    server = cluster.server("--mode", "async", "--epochs", "2", "--staleness", "bounded:1",
                            "--trace-file", str(trace), *QUICK_JOB)  # fmt: skip
    workers = [cluster.worker(server, f"w{i}") for i in range(4)]
    assert server.wait(180) == 0
    assert [w.wait(30) for w in workers] == [0] * 4
    status = server.final_status()
    assert status["epochs_done"] == 2 and status["staleness_max"] <= 1
    steps = [json.loads(line) for line in trace.open()]
    lags = [s["version"] - 1 - u["base_version"] for s in steps for u in s.get("updates", [])]
    assert lags and max(lags) <= 1
    for epoch in status["epochs"]:  # refused frames came back: every frame once
        assert epoch["ledger"]["used_once"] == epoch["ledger"]["frames"]


def test_sync_steps_are_full_and_nobody_idles_on_eight_chunks(cluster: Cluster) -> None:
    """Four workers on data of eight chunks: each trains, and every step of the epoch but
    its last holds one full bunch from each of them (the global bunch)."""
    bunch = 128  # chunks and steps as with any bunch; 32 took four times the steps
    train = len(load_corpus(DataSpec(), 10).train_frames)
    chunk = math.ceil(train / 8 / bunch) * bunch
    trace = cluster.tmp_path / "trace.jsonl"
    job = ["--network", "117:64:10", "--chunk-frames", str(chunk), "--bunch-size", str(bunch)]
    server = cluster.server("--mode", "sync", "--min-workers", "4", "--epochs", "1",
                            "--trace-file", str(trace), *job)  # fmt: skip
    workers = [cluster.worker(server, f"w{i}") for i in range(4)]
    assert server.wait(180) == 0
    assert [w.wait(30) for w in workers] == [0] * 4
    steps = [json.loads(line) for line in trace.open() if "updates" in line]
    patterns = [sum(len(u["frames"]) for u in step["updates"]) for step in steps]
    assert sum(patterns) == train
    assert patterns[:-1] == [4 * bunch] * (len(steps) - 1), patterns[-12:]
    assert {u["worker"] for step in steps for u in step["updates"]} == {f"w{i}" for i in range(4)}
    status = server.final_status()
    assert status["staleness"]["idle_worker_epochs"] == 0
    assert all(row["idle_epochs"] == 0 and row["patterns"] > 0 for row in status["workers"])


def test_control_needs_the_token_and_the_change_shows(cluster: Cluster, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")
    trace = tmp_path / "trace.jsonl"
    server = cluster.server("--token-file", str(secret), "--epochs", "1", "--trace-file",
                            str(trace), *SMALL_JOB)  # fmt: skip
    assert _post(server, {"staleness": "rate"})[0] == 401
    assert _post(server, {"staleness": "rate"}, "wrong")[0] == 401
    code, answer = _post(server, {"staleness": "bounded:x"}, "s3cret-token")
    assert code == 400 and "bounded staleness needs a bound" in answer["text"]
    assert _post(server, {"policy": "rate"}, "s3cret-token")[0] == 400
    code, record = _post(server, {"staleness": "gap"}, "s3cret-token")
    assert code == 200 and (record["from"], record["to"]) == ("none", "gap")
    request = urllib.request.Request(
        server.url + "/status", headers={"Authorization": "Bearer s3cret-token"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        status = json.loads(response.read())
    assert status["staleness"]["policy"] == "gap"
    assert status["staleness"]["changes"] == [record]
    worker = cluster.worker(server, "w0", "--token", "s3cret-token")
    assert server.wait(120) == 0 and worker.wait(30) == 0  # trained under Gap-Aware
    assert server.final_status()["cv_accuracy"] > 0.5
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    # before the first step; the trace numbers epochs from 0, /status from 1
    assert lines[0] == {"staleness_policy": {**record, "epoch": record["epoch"] - 1}}


def test_without_a_token_control_works_from_loopback(cluster: Cluster) -> None:
    server = cluster.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    code, record = _post(server, {"staleness": "dcasgd"})
    assert code == 200 and record["to"] == "dcasgd:0.04" and record["by"] == "127.0.0.1"
    assert json.loads(server.get("/control"))["policy"] == "dcasgd:0.04"
    assert _post(server, {"staleness": "nonsense"})[0] == 400


def test_a_change_before_the_first_step_survives_a_kill(cluster: Cluster) -> None:
    """``POST /control`` is answered once the change is on disk. A change made before the
    run's first step was checkpointed by nothing (a checkpoint waits for a step, an epoch
    or a CV result): a server SIGKILLed after the 200 restarted under the command's
    policy, and said nothing."""
    job = ("--mode", "async", "--epochs", "1", "--out-dir", str(cluster.tmp_path / "run"),
           *SMALL_JOB)  # fmt: skip
    server = cluster.server(*job)
    code, record = _post(server, {"staleness": "bounded:2"})
    assert code == 200 and record["to"] == "bounded:2" and record["version"] == 0
    server.process.send_signal(signal.SIGKILL)
    server.wait(30)
    again = cluster.server(*job, name="again")
    status = again.status()
    assert status["resumed"] is not None and status["resumed"]["version"] == 0
    assert status["staleness"]["policy"] == "bounded:2"
    assert status["staleness"]["changes"] == [record]
