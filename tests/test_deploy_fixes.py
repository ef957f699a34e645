"""What got in the way when deploying, each checked: Kubernetes service links, a wrong
token under systemd, the Compose version, and `snet plan`'s link and strategies."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_deploy import DEPLOY, MANIFESTS, _configuration, _toml, _yaml_documents

from snet.cli.main import main
from snet.client.worker import EXIT_REFUSED

from helpers import Cluster, run_process, wait_until

SERVICE_LINK = "tcp://10.96.0.12:7000"


def test_kubernetes_pods_get_no_service_links() -> None:
    pods = [
        d["spec"]["template"]["spec"]
        for path in MANIFESTS
        for d in _yaml_documents(path)
        if d["kind"] in ("Deployment", "Job")
    ]
    assert len(pods) == 2
    assert all(pod["enableServiceLinks"] is False for pod in pods)


def test_a_service_link_in_place_of_a_port_is_ignored_and_explained(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SNET_PORT", SERVICE_LINK)  # a Service named "snet"
    monkeypatch.setenv("SNET_HTTP_PORT", "tcp://10.96.0.13:7080")  # ... and "snet-http"
    config = _configuration(["server", "--config", str(_toml())])
    assert (config.port, config.http_port) == (7000, 7080)  # the file's, not the links'
    err = capsys.readouterr().err
    assert f"ignoring SNET_PORT={SERVICE_LINK}: that is the Kubernetes service link" in err
    assert "a Service named 'snet'" in err and "a Service named 'snet-http'" in err
    assert "enableServiceLinks: false" in err


def test_a_server_under_a_service_named_snet_starts(cluster: Cluster, tmp_path: Path) -> None:
    config = tmp_path / "snet.toml"  # ports from the file, as the manifests' ConfigMap does
    config.write_text("[server]\nport = 0\nhttp_port = 0\n[job]\nepochs = 1\n")
    cluster.env.update(SNET_PORT=SERVICE_LINK, SNET_HTTP_PORT="tcp://10.96.0.13:7080")
    log = tmp_path / "server.log"
    ready = tmp_path / "ready.json"
    process = cluster._spawn(
        ["server", "--config", str(config), "--ready-file", str(ready), "--out-dir",
         str(tmp_path / "out"), "--linger-seconds", "-1"],
        log,
    )  # fmt: skip
    wait_until(lambda: ready.exists() or process.poll() is not None, 30, "the server")
    assert process.poll() is None, log.read_text()  # it used to exit 2 here
    assert json.loads(ready.read_text())["port"] > 0
    assert "ignoring SNET_PORT=tcp://10.96.0.12:7000" in log.read_text()


def test_a_real_port_in_the_environment_is_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNET_PORT", "7123")
    assert _configuration(["server"]).port == 7123


def test_the_worker_unit_does_not_restart_a_refused_worker() -> None:
    unit = (DEPLOY / "systemd/snet-worker@.service").read_text()
    (line,) = re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.MULTILINE)
    assert set(line.split()) == {"2", str(EXIT_REFUSED)}
    assert EXIT_REFUSED not in (0, 1, 2, 3)  # 1 is any unforeseen error: restarted
    assert "Restart=on-failure" in unit


def test_a_worker_with_a_wrong_token_exits_refused(cluster: Cluster) -> None:
    server = cluster.server("--token", "right", "--epochs", "1")
    worker = cluster.worker(server, "wrong", "--token", "wrong")
    assert worker.wait(30) == EXIT_REFUSED
    assert "refused by the server" in cluster.log("wrong")


def test_the_compose_file_says_it_needs_compose_v2() -> None:
    compose = (DEPLOY / "docker/compose.yaml").read_text()
    assert "Needs Docker Compose v2" in compose.splitlines()[1]
    assert "Docker Compose v2" in (DEPLOY / "README.md").read_text()
    (document,) = _yaml_documents(DEPLOY / "docker/compose.yaml")
    assert document["name"] == "snet"  # the v2 feature it names


def test_plan_says_what_snet_trains_and_asks_for_the_link(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--workers", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "snet trains pattern-parallel" in out and "in sync, async and bmuf mode" in out
    assert "note: no --link-mbps given" in out and "127.0.0.1 loopback" in out
    rows = [line.split() for line in out.splitlines() if line[:3].strip() in ("1", "2")]
    assert {row[1] for row in rows if len(row) > 2 and row[2] in ("sync", "async")} == {"pattern"}
    assert main(["plan", "--workers", "2", "--link-mbps", "1000"]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and "link: 1000 Mbit/s" in out
    assert main(["plan", "--workers", "2", "--strategies", "pattern,network"]) == 0
    assert "network-parallel rows" in capsys.readouterr().out


@pytest.mark.system  # starts real processes
def test_plan_json_names_the_link_and_notes_its_absence(tmp_path: Path) -> None:
    result = run_process(
        [sys.executable, "-m", "snet.cli", "plan", "--workers", "2", "--json"],
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["link_mbps"] is None
    assert "no --link-mbps given" in result.stderr
