"""The server as a daemon (pid file, exit codes) and workers that outlive their server.

Everything runs as real processes on 127.0.0.1: servers are stopped (SIGTERM), crashed
(SIGKILL), frozen (SIGSTOP) and restarted on the same port while workers keep going.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from helpers import SMALL_JOB, Cluster, wait_until


def _snet(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snet.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
        cwd=cluster.tmp_path,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ledger_exact(status: dict[str, object]) -> bool:
    epochs = status["epochs"]
    assert isinstance(epochs, list)
    return all(e["ledger"]["used_once"] == e["ledger"]["frames"] for e in epochs)


def test_pid_file_readiness_and_exit_codes(cluster: Cluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "run" / "snet.pid"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # stands in for systemd
    systemd.bind(str(tmp_path / "notify"))
    systemd.settimeout(30)
    cluster.env["NOTIFY_SOCKET"] = str(tmp_path / "notify")
    server = cluster.server("--mode", "async", "--epochs", "50", "--pid-file", str(pid_file))
    del cluster.env["NOTIFY_SOCKET"]
    assert pid_file.read_text() == f"{server.process.pid}\n"
    ready = systemd.recv(4096).decode().splitlines()  # sent once both ports listen
    assert ready[:2] == ["READY=1", f"MAINPID={server.process.pid}"]
    assert server.status()["state"] == "training"

    # A second daemon with the same pid file is refused (2: configuration) ...
    clash = _snet(cluster, "server", "--port", "0", "--http-port", "0", "--pid-file", str(pid_file))
    assert clash.returncode == 2, clash.stderr
    assert f"names process {server.process.pid}, which is still running" in clash.stderr
    # ... one on a port in use fails to start (1: error) and says where ...
    taken = _snet(cluster, "server", "--port", str(server.port), "--http-port", "0")
    assert taken.returncode == 1, taken.stderr
    assert f"cannot listen on 127.0.0.1:{server.port}: " in taken.stderr
    assert "Traceback" not in taken.stderr
    # ... and a bad setting is a configuration error (2).
    bad = _snet(cluster, "server", "--port", "70000")
    assert bad.returncode == 2 and "port must be a TCP port" in bad.stderr
    assert pid_file.read_text() == f"{server.process.pid}\n"  # untouched by the refusals

    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert systemd.recv(4096) == b"STOPPING=1"
    systemd.close()
    assert not pid_file.exists()
    assert "exiting with status 0 (signal SIGTERM)" in server.log.read_text()

    # A stale pid file (its process is gone) is simply replaced.
    pid_file.write_text("999999999\n")
    again = cluster.server("--epochs", "1", "--pid-file", str(pid_file), *SMALL_JOB, name="again")
    assert pid_file.read_text() == f"{again.process.pid}\n"
    worker = cluster.worker(again, "w0")
    assert again.wait(60) == 0 and worker.wait(30) == 0
    assert not pid_file.exists()


def test_worker_started_first_waits_then_a_sigterm_makes_it_leave(cluster: Cluster) -> None:
    port = _free_port()
    early = cluster._spawn(
        ["worker", "--server", f"127.0.0.1:{port}", "--name", "early", "--retry-seconds", "60"],
        cluster.tmp_path / "early.log",
    )
    wait_until(lambda: "retrying with backoff" in cluster.log("early"), 30, "a retry log line")
    assert early.poll() is None

    server = cluster.server("--port", str(port), "--epochs", "50", *SMALL_JOB)
    wait_until(lambda: server.status()["steps"] > 5, 60, "the early worker to train")
    assert "reached the server" in cluster.log("early")

    early.send_signal(signal.SIGTERM)  # leaves politely: the server hears a goodbye
    assert early.wait(30) == 0
    rows = wait_until(
        lambda: [r for r in server.status()["workers"] if r["state"] == "gone"], 10, "goodbye"
    )
    assert rows[0]["left_reason"] == "goodbye: worker stopped (signal SIGTERM)"

    unreachable = _snet(
        cluster, "worker", "--server", f"127.0.0.1:{_free_port()}", "--retry-seconds", "1"
    )
    assert unreachable.returncode == 3
    assert "cannot reach the server" in unreachable.stderr and "gave up after" in unreachable.stderr


def test_workers_survive_server_restart_and_crash(cluster: Cluster) -> None:
    first = cluster.server("--mode", "async", "--epochs", "50", *SMALL_JOB, name="first")
    workers = [cluster.worker(first, f"w{i}", "--retry-seconds", "60") for i in range(2)]
    wait_until(lambda: first.status()["steps"] > 10, 60, "training on the first server")

    first.process.send_signal(signal.SIGTERM)  # a restart, as `systemctl restart` does it
    assert first.wait(30) == 0
    args = ("--port", str(first.port), "--mode", "async", *SMALL_JOB)
    second = cluster.server(*args, "--epochs", "50", name="second")
    wait_until(lambda: second.status()["workers_live"] == 2, 60, "both workers to rejoin")
    wait_until(lambda: second.status()["steps"] > 10, 60, "training on the second server")

    second.process.send_signal(signal.SIGKILL)  # a crash: no goodbye at all
    second.wait(30)
    third = cluster.server(*args, "--epochs", "2", name="third")
    assert third.wait(90) == 0
    assert [w.wait(30) for w in workers] == [0, 0]
    final = third.final_status()
    assert final["epochs_done"] == 2 and _ledger_exact(final)
    assert {row["name"] for row in final["workers"]} == {"w0", "w1"}
    for name in ("w0", "w1"):
        log = cluster.log(name)
        assert "said goodbye (signal SIGTERM) mid-job" in log
        assert "lost the server" in log
        assert log.count("joined snet") == 3


def test_frozen_server_is_dropped_and_rejoined(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "6", "--heartbeat-seconds", "0.5", *SMALL_JOB
    )
    worker = cluster.worker(server, "w0", "--retry-seconds", "60", "--server-timeout-seconds", "2")
    wait_until(lambda: server.status()["steps"] > 10, 60, "training to start")
    os.kill(server.process.pid, signal.SIGSTOP)  # the server hangs mid-bunch: no FIN, no RST
    try:
        wait_until(
            lambda: "nothing from the server for" in cluster.log("w0"), 20, "the worker to notice"
        )
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert server.wait(90) == 0 and worker.wait(30) == 0
    final = server.final_status()
    rows = sorted(final["workers"], key=lambda row: row["id"])
    assert [row["name"] for row in rows] == ["w0", "w0"]  # the same worker, joined twice
    assert rows[0]["state"] == "gone" and rows[1]["updates_sent"] > 0
    assert final["epochs_done"] == 6 and _ledger_exact(final)


def test_a_worker_joining_after_training_is_sent_home(cluster: Cluster) -> None:
    server = cluster.server("--epochs", "1", "--linger-seconds", "-1", *SMALL_JOB)
    first = cluster.worker(server, "first")
    assert first.wait(60) == 0  # training complete; the server lingers (until stopped)
    assert server.status()["state"] == "trained"
    late = cluster.worker(server, "late")
    assert late.wait(30) == 0
    assert "server said goodbye (training complete)" in cluster.log("late")
    assert server.process.poll() is None
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
