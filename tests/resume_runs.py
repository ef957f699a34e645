"""A resumable run for the resume tests: one job on a fixed port and out-dir whose server
is SIGKILLed and started again by the same command, and what its trace and status say
(tests/test_resume.py, tests/test_resume_stops.py)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from helpers import Cluster, ServerProcess, free_port, wait_until

TRAIN_FRAMES = 48_479  # the default data's training frames

# The default job's schedule (10 epochs, the rate decaying from epoch 6) on a smaller net
# in bunches of 512 (95 steps an epoch): the subject is what the kills take, not how well
# the net learns, and the default net in bunches of 128 made these two tests a sixth of
# the suite's time. With ``--min-workers 2``: a restarted server leases nothing until both
# workers are back, as with a fixed set of workers. Otherwise the first worker to rejoin
# trains alone for a moment, in steps of one update instead of two (more progress per
# pattern at the same rate), and the final CV came out up to 0.65 points *higher* than the
# reference's: that would measure the step size, not the kills. For the same reason the
# async run takes two updates per step whoever is live (a late worker does not shrink the
# steps either). Sync runs so set up are deterministic (the default net's CV was 0.917029
# in three runs), so a sync run with kills is held to 0.5 points of one. Async ones are not
# (the default net's: 0.9139-0.9241 in twelve runs), so this test holds the async run to
# the ledger and the schedule, and the 0.5-point bound for async resumes is held on a job
# whose uninterrupted runs agree (CONVERGING below).
SMALLER_NET = ("--network", "117:64:10")
SMALLER = (*SMALLER_NET, "--bunch-size", "512")


def surviving_steps(trace: Path) -> list[dict[str, Any]]:
    """The steps whose weights the run ended with: a ``resumed`` record undoes every step
    after the version it names (that server's work since its checkpoint was lost)."""
    steps: list[dict[str, Any]] = []
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if "resumed" in record:
            steps = [s for s in steps if s["version"] <= record["resumed"]]
        else:
            steps.append(record)
    return steps


def frames_per_epoch(steps: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    frames: dict[int, list[int]] = defaultdict(list)
    for step in steps:
        for update in step["updates"]:
            frames[step["epoch"]] += update["frames"]
    return {epoch: np.array(used) for epoch, used in frames.items()}


class Run:
    """One job on a fixed port and out-dir, its server restarted by the same command."""

    def __init__(self, cluster: Cluster, name: str, job: tuple[str, ...]) -> None:
        self.cluster = cluster
        self.out_dir = cluster.tmp_path / f"{name}-out"
        self.trace = cluster.tmp_path / f"{name}.trace"
        self.name = name
        self.port = free_port()
        self.args = (*job, "--port", str(self.port), "--out-dir", str(self.out_dir),
                     "--trace-file", str(self.trace))  # fmt: skip
        self.starts = 0

    def start(self, *extra: str) -> ServerProcess:
        """The server, by the same command each time. It serves until stopped once trained
        (``--linger-seconds -1``), so a worker that was still rejoining is sent home too."""
        self.starts += 1
        name = f"{self.name}-{self.starts}"
        return self.cluster.server(*self.args, "--linger-seconds", "-1", *extra, name=name)

    def workers(self, server: ServerProcess, count: int = 2) -> list[subprocess.Popen[bytes]]:
        return [
            self.cluster.worker(server, f"{self.name}-w{i}", "--retry-seconds", "120")
            for i in range(count)
        ]

    def finish(self, server: ServerProcess, workers: list[subprocess.Popen[bytes]]) -> None:
        """The workers are sent home once trained; then the server is stopped (SIGTERM)."""
        assert [w.wait(180) for w in workers] == [0] * len(workers)
        assert server.status()["state"] == "trained"
        # the results are written when training completes, not when the server stops
        wait_until(lambda: self.final_if_written().get("state") == "trained", 30, "results")
        assert (self.out_dir / "weights.npz").exists()
        server.process.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0

    def final_if_written(self) -> dict[str, Any]:
        try:
            return self.final()
        except (OSError, ValueError):
            return {}

    def final(self) -> dict[str, Any]:
        status: dict[str, Any] = json.loads((self.out_dir / "status.json").read_text())
        return status


def progress(server: ServerProcess) -> tuple[int, bool]:
    """The weight version and whether training is complete."""
    status = server.status()
    return int(status["weight_version"]), status["state"] == "trained"


def run_with_kills(
    cluster: Cluster, name: str, job: tuple[str, ...], marks: list[int]
) -> tuple[Run, int]:
    """Run ``job`` with two workers, SIGKILLing the server as its version passes each
    mark (once it has a checkpoint to resume from) and starting it again with the same
    command. Returns the run and the number of kills made."""
    run = Run(cluster, name, job)
    server = run.start()
    workers = run.workers(server)
    checkpoints = run.out_dir / "checkpoints"
    kills = 0
    for mark in marks:

        def due(server: ServerProcess = server, mark: int = mark) -> tuple[int, bool] | None:
            version, trained = progress(server)
            if trained or (version >= mark and any(checkpoints.glob("ckpt-*.snet"))):
                return version, trained
            return None  # the mark not passed yet, or nothing to resume from yet

        _, trained = wait_until(due, 120, f"version {mark}")
        if trained:
            break
        server.process.send_signal(signal.SIGKILL)
        server.wait(30)
        kills += 1
        server = run.start()
        assert "resumed from ckpt-" in server.log.read_text()
    run.finish(server, workers)
    return run, kills


def reference_cv(cluster: Cluster, name: str, job: tuple[str, ...]) -> dict[str, Any]:
    run = Run(cluster, name, job)
    server = run.start()
    run.finish(server, run.workers(server))
    return run.final()


def assert_exactly_once(run: Run, epochs: int) -> None:
    status = run.final()
    assert status["state"] == "trained" and status["epochs_done"] == epochs
    for record in status["epochs"]:
        ledger = record["ledger"]
        assert ledger["used_once"] == ledger["frames"] == TRAIN_FRAMES, record
        assert ledger["used_more"] == ledger["unused"] == 0
    used = frames_per_epoch(surviving_steps(run.trace))
    assert sorted(used) == list(range(epochs))
    for frames in used.values():  # the weights' own lineage: each frame once per epoch
        assert len(frames) == TRAIN_FRAMES and len(np.unique(frames)) == TRAIN_FRAMES
