"""The server as a daemon (pid file, exit codes) and workers that outlive their server.

Everything runs as real processes on 127.0.0.1: servers are stopped (SIGTERM), crashed
(SIGKILL), frozen (SIGSTOP) and restarted on the same port while workers keep going.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from helpers import QUICK_JOB, SMALL_JOB, Cluster, free_port, wait_until


def _ledger_exact(status: dict[str, object]) -> bool:
    epochs = status["epochs"]
    assert isinstance(epochs, list)
    return all(e["ledger"]["used_once"] == e["ledger"]["frames"] for e in epochs)


@pytest.mark.system
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
    assert server.status()["state"] == "waiting_for_workers"  # no worker joined yet

    # A second daemon with the same pid file is refused (1: in use, as an out-dir; it
    # exited 2, which systemd's units take for a setting to mend and do not restart) ...
    clash = cluster.run("server", "--port", "0", "--http-port", "0", "--pid-file", str(pid_file))
    assert clash.returncode == 1, clash.stderr
    assert f"names process {server.process.pid}, which is still running" in clash.stderr
    # ... one on a port in use fails to start (1: error) and says where ...
    taken = cluster.run("server", "--port", str(server.port), "--http-port", "0")
    assert taken.returncode == 1, taken.stderr
    assert f"cannot listen on 127.0.0.1:{server.port}: " in taken.stderr
    assert "Traceback" not in taken.stderr
    # ... and a bad setting is a configuration error (2).
    bad = cluster.run("server", "--port", "70000")
    assert bad.returncode == 2 and "port must be a TCP port" in bad.stderr
    lonely = cluster.run("worker", "--server", f"127.0.0.1:{free_port()}", "--retry-seconds=1")
    assert lonely.returncode == 3  # no server at all: 3, after retrying
    assert "cannot reach the server" in lonely.stderr and "gave up after" in lonely.stderr
    assert pid_file.read_text() == f"{server.process.pid}\n"  # untouched by the refusals

    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert systemd.recv(4096) == b"STOPPING=1"
    systemd.close()
    assert not pid_file.exists()
    assert not (tmp_path / "server.ready").exists()  # ready no more: it would name a dead pid
    assert "exiting with status 0 (signal SIGTERM)" in server.log.read_text()

    # A stale pid file (its process is gone) is simply replaced.
    pid_file.write_text("999999999\n")
    again = cluster.server(
        *("--epochs", "1", "--linger-seconds", "-1", "--pid-file", str(pid_file), *QUICK_JOB),
        name="again",
    )
    assert pid_file.read_text() == f"{again.process.pid}\n"
    worker = cluster.worker(again, "w0")
    assert worker.wait(60) == 0  # sent home once trained, while the server lingers
    assert again.status()["state"] == "trained"
    late = cluster.worker(again, "late")  # a latecomer is sent home at once
    assert late.wait(30) == 0
    assert "server said goodbye (training complete)" in cluster.log("late")
    assert again.process.poll() is None  # lingering until stopped
    again.process.send_signal(signal.SIGTERM)
    assert again.wait(30) == 0
    assert not pid_file.exists()


@pytest.mark.system
def test_a_hangup_stops_server_and_workers_gracefully(cluster: Cluster) -> None:
    """A closed terminal or SSH session (SIGHUP) ended the server at once, exit 129, with no
    checkpoint and no results, and its workers alike."""
    server = cluster.server("--mode", "async", "--epochs", "50", *QUICK_JOB)
    group = cluster.worker(server, "w", "--processes", "2")
    wait_until(lambda: server.status()["steps"] > 20, 60, "some steps")
    server.process.send_signal(signal.SIGHUP)
    assert server.wait(30) == 0
    log = server.log.read_text()
    assert "signal SIGHUP: stopping gracefully" in log
    final = server.final_status()
    assert final["stop_reason"] == "signal SIGHUP"
    assert final["checkpoints"]["last"]["version"] == final["weight_version"]
    assert group.wait(60) == 0  # told why, they waited for it to return (5 s here), then left
    assert "server said goodbye (signal SIGHUP)" in cluster.log("w")
    assert "Traceback" not in cluster.log("w")
    other = cluster.server("--mode", "async", "--epochs", "50", *QUICK_JOB, name="other")
    worker = cluster.worker(other, "single", "--processes", "2")
    wait_until(lambda: other.status()["workers_live"] == 2, 60, "both joined")
    worker.send_signal(signal.SIGHUP)  # the group's parent passes it on: they leave
    assert worker.wait(30) == 0
    assert "killed by" not in cluster.log("single")
    other.process.send_signal(signal.SIGTERM)
    assert other.wait(30) == 0


@pytest.mark.system
def test_workers_started_first_survive_server_restart_and_crash(cluster: Cluster) -> None:
    port = free_port()
    workers = [
        cluster._spawn(
            ["worker", "--server", f"127.0.0.1:{port}", "--name", name, "--retry-seconds", "60"],
            cluster.tmp_path / f"{name}.log",
        )
        for name in ("w0", "w1", "w2")
    ]
    wait_until(lambda: "retrying with backoff" in cluster.log("w0"), 30, "a retry log line")
    assert all(w.poll() is None for w in workers)  # waiting for a server, not crashed

    args = ("--port", str(port), "--mode", "async", *SMALL_JOB)
    first = cluster.server(*args, "--epochs", "50", name="first")
    wait_until(
        lambda: (s := first.status())["workers_live"] == 3 and s["steps"] > 10,
        60,
        "all three training on the first server",
    )
    assert "reached the server" in cluster.log("w0")
    first.process.send_signal(signal.SIGTERM)  # a restart, as `systemctl restart` does it
    assert first.wait(30) == 0

    second = cluster.server(*args, "--epochs", "50", name="second")
    wait_until(lambda: second.status()["workers_live"] == 3, 60, "the workers to rejoin")
    workers[2].send_signal(signal.SIGTERM)  # a worker leaves politely: it says goodbye
    assert workers[2].wait(30) == 0
    rows = wait_until(
        lambda: [r for r in second.status()["workers"] if r["state"] == "gone"], 10, "goodbye"
    )
    assert [(r["name"], r["left_reason"]) for r in rows] == [
        ("w2", "goodbye: worker stopped (signal SIGTERM)")
    ]
    wait_until(lambda: second.status()["steps"] > 10, 60, "training on the second server")
    second.process.send_signal(signal.SIGKILL)  # a crash: no goodbye at all
    second.wait(30)

    # One epoch may be over before a worker's backoff ends: lingering, the server sends
    # such a latecomer home with "training complete" too.
    third = cluster.server(*args, "--epochs", "1", "--linger-seconds", "-1", name="third")
    assert [w.wait(60) for w in workers[:2]] == [0, 0]
    third.process.send_signal(signal.SIGTERM)
    assert third.wait(30) == 0
    final = third.final_status()
    assert final["epochs_done"] == 1 and _ledger_exact(final)
    assert {row["name"] for row in final["workers"]} == {"w0", "w1"}
    for name in ("w0", "w1"):
        log = cluster.log(name)
        assert "said goodbye (signal SIGTERM) mid-job" in log
        assert "lost the server" in log
        assert log.count("joined snet") == 3


@pytest.mark.system
def test_frozen_server_is_dropped_and_rejoined(cluster: Cluster) -> None:
    # QUICK_JOB: the subject is the drop and the rejoin, not learning
    server = cluster.server(
        "--mode", "async", "--epochs", "2", "--heartbeat-seconds", "0.5", *QUICK_JOB
    )
    worker = cluster.worker(server, "w0", "--retry-seconds", "60", "--server-timeout-seconds", "2")
    wait_until(lambda: server.status()["steps"] > 10, 60, "training to start")
    assert server.status()["epoch"] == 1  # the first epoch: /status counts from 1
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
    assert len(rows) >= 2 and {row["name"] for row in rows} == {"w0"}  # it joined again
    assert rows[0]["state"] == "gone" and rows[-1]["updates_sent"] > 0
    assert final["epochs_done"] == 2 and _ledger_exact(final)
