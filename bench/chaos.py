"""Chaos benchmark: the default job while its server and workers are SIGKILLed and restarted.

    python -m bench.chaos --server-kills 5 --worker-kills 20 [--workers 3] [--pairs N] [--seed N]

A fault-free run of the job (server and workers as processes on 127.0.0.1) and a run of the
same job while the server is SIGKILLed ``--server-kills`` times and random workers
``--worker-kills`` times at random moments; each is started again at once with the same
command line, as systemd (``Restart=on-failure``) would. A server kill is only made on a
server that has published a step since it (re)started, so every kill costs training.
``--pairs N`` runs N such pairs interleaved (A B, B A, ...: each pair back to back, so the
shared machine's drifting load weighs on both halves alike) and reports the median,
lowest and highest of the pairs' ratios and of every per-kill figure. Reported per pair:

- goodput: training patterns of the job (epochs x training frames) per second of wall
  time from the first start to the end of training, and its ratio to the fault-free run;
- per server kill: the versions (steps) and updates lost (published by the killed server
  after the checkpoint the next one resumed from, read from the trace), and the time from
  the kill to the first step of the restarted server, split (from the server's log) into
  starting Python and importing, loading the state (data plan, checkpoint), the first
  worker's rejoining, and the first step;
- per worker kill: the seconds until that worker joined again;
- the final CV accuracy of both runs, and the ledger check: every epoch's ledger in
  ``status.json`` exact, and in the trace's surviving lineage (the steps the final weights
  descend from) every training frame exactly once per epoch.

Prints a JSON document (and writes it with ``--json``). The package's sources are
compiled to bytecode first, as an installed package's are: this machine's environment
sets ``PYTHONDONTWRITEBYTECODE``, and every restarted process would otherwise compile them
again (about a fifth of a server's start-up CPU time).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import snet

from .arguments import emit, output_path
from .chaos_reading import (
    kill_phases,
    ledger_check,
    lineage,
    server_log_times,
    worker_rejoin_seconds,
)

POLL_SECONDS = 0.02  # while a restarted server's first step is awaited (a short wait)
# Between kills, and through the fault-free run alike: /status is the observer's only
# view, and building and parsing it (it grows with the epochs run) 50 times a
# second took CPU from the run being measured, on the faulty run's side only.
WATCH_SECONDS = 0.25
PHASES = ("start_and_imports", "state_load", "first_worker_rejoins", "first_step")
START_SECONDS = 60.0
RUN_SECONDS = 900.0


def precompile() -> None:
    """Bytecode for the package's sources (its parts are symlinked directories, which
    ``compileall`` does not follow, so each is compiled where it lies)."""
    for part in sorted({p.resolve() for p in Path(snet.__file__).parent.iterdir() if p.is_dir()}):
        compileall.compile_dir(part, quiet=1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class JobRun:
    """One job's server (restartable by the same command) and workers, as processes."""

    def __init__(self, directory: Path, job: list[str], workers: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.port = _free_port()
        self.trace = directory / "trace.jsonl"
        self.ready = directory / "server.ready"
        self.command = [
            sys.executable, "-m", "snet.cli", "server", "--port", str(self.port),
            "--http-port", "0", "--out-dir", str(directory / "out"),
            "--ready-file", str(self.ready), "--trace-file", str(self.trace),
            "--log-level", "info", *job,
        ]  # fmt: skip
        self.worker_count = workers
        self.server: subprocess.Popen[bytes] | None = None
        self.http_port = 0
        self.workers: list[subprocess.Popen[bytes]] = []
        self.starts = 0
        self.completed = False
        self._logs: list[Any] = []

    def _spawn(self, command: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.directory / log_name, "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def start_server(self) -> float:
        """Start the server (the same command every time); returns when it is ready."""
        self.ready.unlink(missing_ok=True)
        self.starts += 1
        self.server = self._spawn(self.command, "server.log")
        deadline = time.monotonic() + START_SECONDS
        while not self.ready.exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (see {self.directory}/server.log)")
            time.sleep(POLL_SECONDS)
        self.http_port = json.loads(self.ready.read_text())["http_port"]
        return time.monotonic()

    def worker_command(self, index: int) -> list[str]:
        return [sys.executable, "-m", "snet.cli", "worker", "--server",
                f"127.0.0.1:{self.port}", "--name", f"w{index}", "--log-level", "info"]  # fmt: skip

    def start_workers(self) -> None:
        self.workers = [
            self._spawn(self.worker_command(i), f"w{i}.log") for i in range(self.worker_count)
        ]

    def restart_worker(self, index: int) -> float:
        """SIGKILL worker ``index`` and start it again; returns the kill's wall time."""
        self.workers[index].send_signal(signal.SIGKILL)
        killed = time.time()
        self.workers[index].wait(30)
        self.workers[index] = self._spawn(self.worker_command(index), f"w{index}.log")
        return killed

    def version(self) -> int | None:
        """The server's weight version, or None when it does not answer."""
        try:
            url = f"http://127.0.0.1:{self.http_port}/status"
            with urllib.request.urlopen(url, timeout=2) as response:
                status = json.loads(response.read())
        except (OSError, ValueError):
            return None
        self.completed = self.completed or status["state"] in ("trained", "stopping")
        return int(status["weight_version"])

    def watch_until_done(self) -> None:
        """Wait for the server to exit, asking its version as between kills (so the
        fault-free run carries the same observer as the faulty one)."""
        assert self.server is not None
        deadline = time.monotonic() + RUN_SECONDS
        while self.server.poll() is None and time.monotonic() < deadline:
            self.version()
            time.sleep(WATCH_SECONDS)
        self.server.wait(30)

    def trained(self) -> bool:
        """Training is complete (a kill now would not be a fault of the run)."""
        return self.completed or (self.server is not None and self.server.poll() is not None)

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.directory / "out" / "status.json").read_text())
        return document

    def close(self) -> None:
        for process in [*self.workers, self.server]:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(30)
        for log in self._logs:
            log.close()


def run_job(directory: Path, job: list[str], workers: int) -> dict[str, Any]:
    """The fault-free run."""
    run = JobRun(directory, job, workers)
    try:
        started = run.start_server()
        run.start_workers()
        run.watch_until_done()
        seconds = time.monotonic() - started
    finally:
        run.close()
    return summarise(run, seconds, [])


def run_chaos(
    directory: Path, job: list[str], workers: int, server_kills: int, worker_kills: int,
    versions: int, rng: random.Random,
) -> dict[str, Any]:  # fmt: skip
    """The same job under faults, at random moments of its progress: each kill waits for
    the weight version to pass a mark drawn from 5-90% of the fault-free run's versions."""
    span = (versions // 20, versions * 9 // 10)
    events = sorted(
        [(rng.randrange(*span), "server") for _ in range(server_kills)]
        + [(rng.randrange(*span), "worker") for _ in range(worker_kills)]
    )
    run = JobRun(directory, job, workers)
    kills: list[dict[str, Any]] = []
    worker_kill_times: list[tuple[float, str]] = []
    try:
        started = run.start_server()
        run.start_workers()
        base = 0  # the version the running server started from
        for mark, kind in events:
            # the mark passed, and (for a server kill) a step since the server started
            while not run.trained():
                version = run.version()
                if version is not None and version >= mark and (kind == "worker" or version > base):
                    break
                time.sleep(WATCH_SECONDS)
            if run.trained():
                break
            if kind == "worker":
                index = rng.randrange(workers)
                worker_kill_times.append((run.restart_worker(index), f"w{index}"))
                continue
            assert run.server is not None
            run.server.send_signal(signal.SIGKILL)
            killed, killed_at = time.monotonic(), time.time()
            run.server.wait(30)
            run.start_server()
            base = run.version() or 0  # the version it resumed from
            while not run.trained() and ((version := run.version()) is None or version <= base):
                time.sleep(POLL_SECONDS)
            seconds = round(time.monotonic() - killed, 3)
            kills.append({"at_version": mark, "kill_to_first_step_seconds": seconds,
                          "start": run.starts - 1, "killed_at": killed_at,
                          "first_step_at": killed_at + seconds})  # fmt: skip
        run.watch_until_done()
        seconds = time.monotonic() - started
    finally:
        run.close()
    starts = server_log_times(directory / "server.log")
    for kill in kills:
        kill["phases_seconds"] = kill_phases(kill, starts[kill.pop("start")])
    result = summarise(run, seconds, kills)
    result["worker_kills"] = len(worker_kill_times)
    result["worker_kill_to_rejoin_seconds"] = worker_rejoin_seconds(
        directory / "server.log", worker_kill_times
    )
    return result


def summarise(run: JobRun, seconds: float, kills: list[dict[str, Any]]) -> dict[str, Any]:
    status = run.status()
    steps, resumes = lineage(run.trace)
    for kill, resume in zip(kills, resumes, strict=False):
        kill.update(resume)
    patterns = sum(e["ledger"]["frames"] for e in status["epochs"])
    checkpoints = status.get("checkpoints") or {}
    return {
        "seconds": round(seconds, 2),
        "patterns": patterns,
        "goodput_patterns_per_second": round(patterns / seconds),
        "cv_accuracy": status["cv_accuracy"],
        "epochs_done": status["epochs_done"],
        "weight_version": status["weight_version"],
        "server_starts": run.starts,
        "server_kills": kills,
        "ledger": ledger_check(status, steps),
        "last_checkpoint_write_seconds": (checkpoints.get("last") or {}).get("write_seconds"),
    }


def compare(clean: dict[str, Any], chaos: dict[str, Any], order: str) -> dict[str, Any]:
    """One pair: a fault-free run and a run with faults, measured back to back."""
    kills = chaos["server_kills"]
    return {
        "order": order,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "fault_free": clean,
        "chaos": chaos,
        "goodput_ratio": round(
            chaos["goodput_patterns_per_second"] / clean["goodput_patterns_per_second"], 3
        ),
        "cv_difference_points": round(100 * (chaos["cv_accuracy"] - clean["cv_accuracy"]), 3),
        "updates_lost_per_server_kill": [k.get("updates_lost") for k in kills],
        "kill_to_first_step_seconds": [k["kill_to_first_step_seconds"] for k in kills],
    }


def spread(values: list[float]) -> dict[str, float]:
    """Median, lowest and highest of the pairs' figures (none: an empty record)."""
    if not values:
        return {}
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def run_pairs(
    root: Path, job: list[str], workers: int, server_kills: int, worker_kills: int,
    pairs: int, seed: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """Fault-free and faulty runs interleaved A B, B A, A B, ...: each pair is measured
    back to back, so the shared machine's load, which drifts over minutes, weighs on both
    halves of a pair alike (and the alternating order cancels a steady drift's bias). The
    kill marks of a pair that starts with faults are drawn from the previous fault-free
    run's versions."""
    results: list[dict[str, Any]] = []
    versions = 0
    for index in range(pairs):
        rng = random.Random(seed + index)
        directory = root / f"pair-{index}"
        chaos_first = index % 2 == 1 and versions > 0
        if chaos_first:
            chaos = run_chaos(directory / "chaos", job, workers, server_kills, worker_kills,
                              versions, rng)  # fmt: skip
        clean = run_job(directory / "clean", job, workers)
        versions = clean["weight_version"]
        if not chaos_first:
            chaos = run_chaos(directory / "chaos", job, workers, server_kills, worker_kills,
                              versions, rng)  # fmt: skip
        results.append(compare(clean, chaos, "faults first" if chaos_first else "fault-free first"))
        print(json.dumps({"pair": index, "goodput_ratio": results[-1]["goodput_ratio"],
                          "cv_difference_points": results[-1]["cv_difference_points"]}),
              file=sys.stderr, flush=True)  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-kills", type=int, default=5)
    parser.add_argument("--worker-kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--pairs", type=int, default=1, help="fault-free and faulty runs, interleaved"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--job", default="", help="extra job flags for both runs, one string")
    parser.add_argument("--json", type=output_path, help="also write the result here")
    parser.add_argument("--keep", help="run in this directory and keep the logs and traces")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    job = args.job.split()
    precompile()
    with tempfile.TemporaryDirectory(prefix="snet-chaos-") as scratch:
        pairs = run_pairs(Path(args.keep or scratch), job, args.workers, args.server_kills,
                          args.worker_kills, args.pairs, seed)  # fmt: skip
    kills = [kill for pair in pairs for kill in pair["chaos"]["server_kills"]]
    phases = {name: spread([k["phases_seconds"][name] for k in kills]) for name in PHASES}
    result = {
        "seed": seed,
        "workers": args.workers,
        "job": job or "default",
        "cpus": os.cpu_count(),
        "goodput_ratio": spread([pair["goodput_ratio"] for pair in pairs]),
        "cv_difference_points": spread([pair["cv_difference_points"] for pair in pairs]),
        "kill_to_first_step_seconds": spread([k["kill_to_first_step_seconds"] for k in kills]),
        "updates_lost_per_server_kill": spread([k.get("updates_lost") or 0 for k in kills]),
        "worker_kill_to_rejoin_seconds": spread(
            [s for pair in pairs for s in pair["chaos"]["worker_kill_to_rejoin_seconds"] if s]
        ),
        "kill_phases_seconds": phases,
        "ledgers_ok": all(pair["chaos"]["ledger"]["ok"] for pair in pairs),
        "pairs": pairs,
    }
    emit(json.dumps(result, indent=1), args.json)
    return 0 if result["ledgers_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
