"""A training run timed from launch: a server and workers as processes, on 127.0.0.1 or
each in a network namespace of ``bench.netns.SlowNetwork``, watched through /status.

``watch`` runs beside the server (in its namespace, where its HTTP port is reachable)
and prints one JSON line per change of /status: the wall time, the patterns applied, the
CV accuracy of every epoch so far. The parent stamps nothing itself, so a run in
namespaces and one on loopback are timed the same way, from the wall clock (the same in
every namespace)::

    python -m bench.nsrun URL          # the watcher (SNET_TOKEN from the environment)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snet.cli.runtime import blas_thread_env
from snet.cli.status import fetch_status

from .netns import SERVER_ADDRESS, SlowNetwork

TOKEN = "bench-nsrun-token"  # private namespaces only; never a real secret


def watch(url: str, interval: float = 0.1) -> None:
    """Print /status's progress as JSON lines until the server goes away."""
    token = os.environ.get("SNET_TOKEN", "")
    last: tuple[Any, ...] = ()
    failures = 0
    while failures < 50:
        try:
            status = fetch_status(url, timeout=5, token=token)
        except OSError:
            failures += 1
            time.sleep(interval)
            continue
        failures = 0
        cv = [e["cv_accuracy"] for e in status["epochs"] if e["cv_accuracy"] is not None]
        now = (status["patterns_processed"], tuple(cv), status["workers_live"])
        if now != last:
            line = {"t": time.time(), "patterns": now[0], "cv": cv, "live": now[2]}
            line["compression"] = status.get("compression")
            reports = [row.get("report") or {} for row in status.get("workers", [])]
            line["modelled_seconds"] = sum(r.get("modelled_seconds", 0.0) for r in reports)
            line["real_seconds"] = sum(r.get("real_seconds", 0.0) for r in reports)
            print(json.dumps(line), flush=True)
            last = now
        time.sleep(interval)


@dataclass
class Run:
    """A finished run: its /status readings (wall time from launch), the final status."""

    launched: float
    readings: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    final_written: float | None = None  # when the server wrote its final status

    def time_to(self, accuracy: float) -> float | None:
        """Seconds from launch to the first reading with an epoch's CV >= ``accuracy``;
        the last epoch's CV may come only with the final status (the server exits at
        once), which counts from the time it was written."""
        for reading in self.readings:
            if any(value >= accuracy for value in reading["cv"]):
                return float(reading["t"]) - self.launched
        cv = [e.get("cv_accuracy") or 0.0 for e in self.final.get("epochs", [])]
        if self.final_written is not None and any(value >= accuracy for value in cv):
            return self.final_written - self.launched
        return None

    def cv(self) -> list[float]:
        """Each epoch's CV accuracy: the final status's, else the last reading's."""
        if self.final.get("epochs"):
            return [e.get("cv_accuracy") for e in self.final["epochs"]]
        return list(self.readings[-1]["cv"]) if self.readings else []


def train(
    directory: Path,
    server_flags: list[str],
    workers: int,
    worker_flags: list[str] | None = None,
    network: SlowNetwork | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 1800.0,
    stop_after: float | None = None,
) -> Run:
    """Launch a server and ``workers`` workers (in ``network``'s namespaces if given) and
    watch until the server exits, or ``stop_after`` seconds after all the workers have
    made progress (then stop it); ``timeout`` bounds the whole run."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {**(env or blas_thread_env(1)), "SNET_TOKEN": TOKEN}
    host = SERVER_ADDRESS if network else "127.0.0.1"

    def inside(namespace: str | None, args: list[str]) -> list[str]:
        command = [sys.executable, "-m", *args]
        return network.command(namespace, command) if network and namespace else command

    processes: list[subprocess.Popen[bytes]] = []

    def spawn(namespace: str | None, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(directory / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                inside(namespace, args), stdout=log, stderr=subprocess.STDOUT, env=env
            )
        processes.append(process)
        return process

    run = Run(time.time())
    ready = directory / "ready.json"
    ready.unlink(missing_ok=True)  # a run before in the same directory
    server = spawn(
        network.server if network else None,
        ["snet.cli", "server", "--host", host, "--port", "0", "--http-port", "0",
         "--ready-file", str(ready), "--out-dir", str(directory / "out"),
         "--log-level", "warning", "--min-workers", str(workers), *server_flags],
        "server",
    )  # fmt: skip
    try:
        while not ready.exists():
            if server.poll() is not None or time.time() > run.launched + 60:
                raise RuntimeError(f"the server did not start: see {directory}/server.log")
            time.sleep(0.02)
        ports = json.loads(ready.read_text())
        port, http_port = ports["port"], ports["http_port"]
        for index in range(workers):
            namespace = network.worker_namespaces[index] if network else None
            spawn(
                namespace,
                ["snet.cli", "worker", "--server", f"{host}:{port}", "--name", f"w{index}",
                 "--log-level", "warning", "--retry-seconds", "30", *(worker_flags or [])],
                f"w{index}",
            )  # fmt: skip
        watcher = subprocess.Popen(
            inside(network.server if network else None,
                   ["bench.nsrun", f"http://{host}:{http_port}"]),
            stdout=subprocess.PIPE, env=env, cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        processes.append(watcher)
        assert watcher.stdout is not None
        deadline = run.launched + timeout
        for raw in watcher.stdout:
            reading = json.loads(raw)
            run.readings.append(reading)
            if stop_after is not None and reading["live"] == workers and reading["patterns"]:
                # measure from the first progress of them all: start-up is not counted
                deadline = min(deadline, reading["t"] + stop_after)
            if time.time() > deadline or server.poll() is not None:
                break
        if stop_after is None:
            server.wait(max(deadline - time.time(), 1.0))
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    status = directory / "out" / "status.json"
    if status.is_file():
        run.final, run.final_written = json.loads(status.read_text()), status.stat().st_mtime
    return run


if __name__ == "__main__":
    watch(sys.argv[1])
