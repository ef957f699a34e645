"""Many machines: a server and three workers, each with its own network stack.

The server, three workers and a monitor (which reads /status over HTTP, as an operator
would from another machine) each run in their own network namespace with their own
address, cabled to a bridge (see netlab.py). They train together; then one worker's cable
is pulled: the worker notices the silence, the server drops it and gives its frames to
the others; the cable goes back and the worker rejoins and trains again. Nothing is lost:
every completed epoch used each training frame exactly once.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import SMALL_JOB, Cluster, wait_until
from netlab import NetLab

PORT, HTTP_PORT = 7000, 7080  # each namespace has its own ports: no clash with anything
WORKERS = ("w1", "w2", "w3")
CUT = "w3"
# /status is read on the monitor host by one `snet status --watch --json`, whose readings
# (one JSON line each) the test reads from its log. A `snet status` started for each read
# cost a few tenths of a second of CPU per read, beside the server and workers training.
WATCH_SECONDS = 0.25
POLL_SECONDS = 0.25


@pytest.fixture
def lab() -> Iterator[NetLab]:
    reason = NetLab.unavailable()
    if reason is not None:
        pytest.skip(f"many-host test skipped: {reason}")
    net = NetLab()
    try:
        net.start()
        yield net
    finally:
        net.close()


def _rows(status: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return sorted((r for r in status["workers"] if r["name"] == name), key=lambda r: r["id"])


@pytest.mark.system
def test_three_workers_on_their_own_hosts_one_link_cut_and_mended(
    lab: NetLab, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    server_ip = lab.add_host("srv", 1)
    monitor_ip = lab.add_host("mon", 100)
    worker_ips = {name: lab.add_host(name, 10 + i) for i, name in enumerate(WORKERS, 1)}
    tmp = cluster.tmp_path
    # A server beyond loopback needs a token: every host has it in its environment, as a
    # systemd unit's EnvironmentFile would give it (server, workers and snet status).
    cluster.env["SNET_TOKEN"] = "many-hosts-secret"
    ready, out_dir = tmp / "server.ready", tmp / "server-out"
    server = cluster._spawn(
        [
            *("server", "--host", server_ip, "--port", str(PORT), "--http-port", str(HTTP_PORT)),
            *("--mode", "async", "--epochs", "1000", *SMALL_JOB),
            *("--heartbeat-seconds", "0.5", "--worker-timeout-seconds", "6"),
            *("--ready-file", str(ready), "--out-dir", str(out_dir)),
        ],
        tmp / "server.log",
        prefix=lab.command("srv"),
    )
    wait_until(lambda: ready.exists() or server.poll() is not None, 30, "the server to listen")
    assert server.poll() is None, (tmp / "server.log").read_text()
    url = f"http://{server_ip}:{HTTP_PORT}"

    monitor_log = tmp / "mon.log"
    monitor = cluster._spawn(
        ["status", "--watch", "--json", "--interval", str(WATCH_SECONDS), "--url", url],
        monitor_log,
        prefix=lab.command("mon"),
    )

    def status() -> dict[str, Any]:
        """The monitor's newest reading of /status (from its host, across the bridge)."""
        assert monitor.poll() is None, monitor_log.read_text()[-3000:]
        for line in reversed(monitor_log.read_text().splitlines()):
            try:
                document: dict[str, Any] = json.loads(line)
            except ValueError:  # a line still being written
                continue
            return document
        return {"workers_live": 0, "steps": 0}  # no reading yet

    workers = {
        name: cluster._spawn(
            [
                *("worker", "--server", f"{server_ip}:{PORT}", "--name", name),
                *("--retry-seconds", "60", "--server-timeout-seconds", "3"),
            ],
            tmp / f"{name}.log",
            prefix=lab.command(name),
        )
        for name in WORKERS
    }
    first = wait_until(
        lambda: (s := status())["workers_live"] == 3 and s["steps"] > 20 and s,
        60,
        "three workers training together",
        POLL_SECONDS,
    )
    seen = {row["name"]: row["address"].rsplit(":", 1)[0] for row in first["workers"]}
    assert seen == worker_ips  # the server saw each worker at its own host's address
    with capsys.disabled():
        print(
            f"\nmany hosts: switch netns {lab.switch} (bridge br0); server {server_ip}:{PORT} "
            f"(HTTP {url}) in netns {lab.namespace('srv')}; monitor {monitor_ip} in netns "
            f"{lab.namespace('mon')}; "
            + "; ".join(f"{n} {a} in netns {lab.namespace(n)}" for n, a in worker_ips.items())
        )
        print(
            f"many hosts: server sees workers at {sorted(r['address'] for r in first['workers'])}"
        )

    before = _rows(first, CUT)[-1]
    cut_at = status()["weight_version"]
    lab.cut(CUT)
    log = tmp / f"{CUT}.log"
    wait_until(lambda: "nothing from the server for" in log.read_text(), 30, "the worker to notice")
    gone = wait_until(
        lambda: (s := status()) and _rows(s, CUT)[0]["state"] == "gone" and s,
        30,
        "the drop",
        POLL_SECONDS,
    )
    version = gone["weight_version"]
    wait_until(
        lambda: status()["weight_version"] > version + 20, 60, "the others to go on", POLL_SECONDS
    )
    lab.mend(CUT)
    rejoined = wait_until(
        lambda: (
            (s := status())
            and len(rows := _rows(s, CUT)) >= 2
            and rows[-1]["state"] == "training"
            and rows[-1]["updates_sent"] > 50
            and s
        ),
        90,
        "the cut worker to rejoin and train",
        POLL_SECONDS,
    )
    again = _rows(rejoined, CUT)[-1]
    assert again["id"] > before["id"] and again["address"].startswith(worker_ips[CUT] + ":")

    for process in workers.values():  # leave politely, then stop the server
        process.send_signal(signal.SIGTERM)
    assert [p.wait(30) for p in workers.values()] == [0, 0, 0]
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    final = json.loads((out_dir / "status.json").read_text())
    done = [e for e in final["epochs"] if e["end_version"] is not None]
    assert len(done) >= 2
    for epoch in done:  # the cut lost nothing: each frame applied exactly once per epoch
        assert epoch["ledger"]["used_once"] == epoch["ledger"]["frames"], epoch["ledger"]
        assert epoch["ledger"]["used_more"] == 0
    assert sum(e["ledger"]["requeued_frames"] for e in done) > 0
    assert final["cv_accuracy"] > 0.5
    worker_log = log.read_text()
    assert "lost the server" in worker_log and worker_log.count("joined snet") >= 2
    with capsys.disabled():
        print(
            f"many hosts: {CUT} cut at version {cut_at}, dropped by the server at version "
            f"{gone['weight_version']}, rejoined as worker "
            f"{again['id']} (was {before['id']}); {len(done)} epochs, "
            f"{final['updates_applied']} updates, CV {100 * final['cv_accuracy']:.2f}%, "
            f"{sum(e['ledger']['requeued_frames'] for e in done)} frames requeued, none lost"
        )
