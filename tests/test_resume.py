"""The server never forgets: SIGKILLed and restarted by the same command, it resumes.

Real processes on 127.0.0.1: a server killed at random moments of a run (its version
passing random marks) and started again with the same command line, as systemd would,
while two workers keep reconnecting. The run must complete with every epoch's ledger
exact (each training frame applied once), the trace of the surviving weight lineage too
(steps after the checkpoint a server resumed from are undone: they are not in the
weights), and a final CV within 0.5 points of an uninterrupted run's: in sync mode
(deterministic without faults), and in async mode on a job whose uninterrupted runs agree
(a convex one; the default job's async runs differ by most of a point with no kills at
all). The async and newbob runs' final weights are also their lineages' (the surviving
steps replayed, to float rounding), and so is each epoch's CV newbob decided on.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.replay import Replay, read_trace
from snet.protocol.job import JobSpec
from snet.protocol.network import NetworkSpec, initial_weights
from snet.protocol.schedule import NewbobSchedule
from snet.server.export import read_weights

from helpers import Cluster, ServerProcess, free_port, wait_until

TRAIN_FRAMES = 48_479  # the default data's training frames


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


def _progress(server: ServerProcess) -> tuple[int, bool]:
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
            version, trained = _progress(server)
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
SETUPS = {
    "async": ("--mode", "async", "--min-workers", "2", "--updates-per-step", "2"),
    "sync": ("--mode", "sync", "--min-workers", "2"),
}
JOBS = {kind: (*setup, *SMALLER) for kind, setup in SETUPS.items()}


def _kill_marks(versions: int, kills: int) -> tuple[int, list[int]]:
    seed = random.randrange(1 << 30)
    marks = random.Random(seed).sample(range(versions // 10, versions * 8 // 10), kills)
    return seed, sorted(marks)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("kind", list(JOBS))
def test_server_killed_three_times_resumes_exactly_once(cluster: Cluster, kind: str) -> None:
    job = JOBS[kind]
    # Sync runs are deterministic without faults: the CV difference from an uninterrupted
    # run is the kills'. An async run is not, and only needs to know roughly how many
    # versions it makes to place the kills (two updates of 512 patterns a step).
    reference = reference_cv(cluster, "reference", job) if kind == "sync" else None
    versions = reference["weight_version"] if reference else 10 * TRAIN_FRAMES // 1024
    seed, marks = _kill_marks(versions, 3)
    run, kills = run_with_kills(cluster, "chaos", (*job, "--checkpoint-seconds", "0.5"), marks)
    assert kills == 3, f"seed {seed}: marks {marks} of {versions} versions"
    final = run.final()
    assert_exactly_once(run, 10)
    assert final["resumed"]["version"] <= final["weight_version"]
    rates = [e["learning_rate"] for e in final["epochs"]]
    assert rates == [JobSpec().learning_rate(epoch) for epoch in range(10)]  # the schedule
    if reference is not None:
        difference = final["cv_accuracy"] - reference["cv_accuracy"]
        assert abs(difference) <= 0.005, (seed, final["cv_accuracy"], reference["cv_accuracy"])


class Lineage:
    """A trace's surviving lineage replayed in one process from the job's initial weights
    (``bench/replay.py``): each update recomputed on the weights of its base version, and,
    given the run's kept flags, newbob's roll-backs as the server makes them (the weights
    of the last kept epoch loaded, the momentum cleared, a new version). Every version is
    kept (a softmax layer's 1,180 floats each): under load a worker's update was once 76
    versions stale."""

    def __init__(
        self, trace: Path, job: JobSpec, kernels: str, kept: list[bool] | None = None
    ) -> None:
        """``kernels``: the step the run's workers ran (``SNET_KERNELS``): on the same step
        the replay is bit for bit (1.4e-7 of drift with numpy's against the compiled one,
        and a CV frame apart now and then)."""
        self.run = Replay(job, "none", {}, keep_versions=1 << 20, kernels=kernels)
        self.kept = kept
        self.cv: list[float] = []  # per epoch, of the weights the epoch ended with
        self._best: np.ndarray | None = None
        epoch = 0
        for step in read_trace(trace):
            if step["epoch"] != epoch:
                self._epoch_ended(epoch)
                epoch = step["epoch"]
            assert step["version"] == self.run.version + 1, (step["version"], self.run.version)
            self.run.step(step)
        self._epoch_ended(epoch)

    def _epoch_ended(self, epoch: int) -> None:
        if self.kept is None:
            return
        self.cv.append(self.run.cv_accuracy())
        if self.kept[epoch]:
            self._best = self.run.history[self.run.version]
        else:
            assert self._best is not None, "the first epoch is always kept"
            self.run.rule.load(self._best)
            self.run.version += 1
            self.run.history[self.run.version] = self.run.rule.weights

    def assert_written(self, run: Run, start: np.ndarray) -> None:
        """The run wrote exactly this lineage's weights and version: at most float rounding
        (were the workers' sums ever taken in another order), against how far training
        moved the weights; a momentum, rate or roll-back lost at a kill would put them about
        a step's length apart, far beyond rounding."""
        final = run.final()
        saved = read_weights(run.out_dir / "weights.npz")
        assert self.run.version == saved.version == final["weight_version"]
        weights = self.run.rule.weights
        drift = np.linalg.norm(weights - saved.flat) / np.linalg.norm(saved.flat - start)
        assert drift <= 1e-5, drift  # 0.0 in the runs measured: bit for bit


# An async job whose uninterrupted runs agree. The default job's (nonlinear) network ends
# its 10 epochs 0.7-0.9 points apart from run to run (91.49-92.41 % in four runs; 0.85 with
# two more epochs of decay, 0.8 with a four times smaller rate, 0.7 with 64 hidden units):
# each async run's staleness and bunch order take it its own way, and it is still
# improving when it stops. A softmax layer (117:10) is convex, and at a rate small enough
# for it (at 0.2 its CV jumps between 45 and 56 % until the rate decays: 0.23 points apart
# at the end) and then halved to 0.00125, every order ends at the same optimum: five
# uninterrupted runs ended 62.77-62.83 % (0.05 points apart, CV loss 1.1715-1.1717;
# docs/reliability.md). So a CV difference there is the kills', not the lineage's.
CONVERGING_RATES = "0.02,0.02,0.02,0.02,0.01,0.005,0.0025,0.00125"
CONVERGING = ("--network", "117:10", "--epochs", "8", "--learning-rates", CONVERGING_RATES)
NEWBOB = (*SETUPS["async"], "--network", "117:10", "--schedule", "newbob", "--epochs", "12",
          "--learning-rates", "0.02", "--newbob-ramp", "0.2", "--newbob-stop", "0.05")  # fmt: skip


@pytest.mark.timeout(480)
def test_async_resumed_run_is_exactly_its_lineage(cluster: Cluster) -> None:
    """An async run killed at 3 random moments, against an uninterrupted one of a job
    whose uninterrupted runs agree to a twentieth of a point:

    - its final weights are its lineage's: the surviving steps of its trace replayed from
      the job's initial weights, each update recomputed on its base version, give the
      weights the run wrote (to float rounding) and its CV. So the kills took nothing from
      the state (weights, momentum, rates, versions) the run went on from;
    - its final CV is within 0.5 points of the uninterrupted run's."""
    job = (*SETUPS["async"], *CONVERGING)
    reference = reference_cv(cluster, "reference", job)
    seed, marks = _kill_marks(reference["weight_version"], 3)
    run, kills = run_with_kills(cluster, "chaos", (*job, "--checkpoint-seconds", "0.5"), marks)
    assert kills == 3, f"seed {seed}: marks {marks}"
    assert_exactly_once(run, 8)
    final = run.final()

    spec = JobSpec(
        network=NetworkSpec.parse("117:10"),
        learning_rates=tuple(float(rate) for rate in CONVERGING_RATES.split(",")),
        epochs=8,
    )
    lineage = Lineage(run.trace, spec, cluster.env["SNET_KERNELS"])
    lineage.assert_written(run, initial_weights(spec.network, spec.seed))
    assert abs(lineage.run.cv_accuracy() - 100 * final["cv_accuracy"]) <= 0.01
    difference = final["cv_accuracy"] - reference["cv_accuracy"]
    assert abs(difference) <= 0.005, (seed, final["cv_accuracy"], reference["cv_accuracy"])


@pytest.mark.timeout(360)
def test_newbob_resumes_its_schedule(cluster: Cluster) -> None:
    """Newbob's rate, ramping, roll-backs and stop survive the kills: every epoch's rate
    and kept flag is what the rule gives for the CV errors the run recorded, and the run
    is exactly its lineage: the surviving steps replayed with its roll-backs give the
    weights it wrote and, epoch by epoch, the CV accuracy it decided on. (Not the CV of an
    uninterrupted run within 0.5 points: on this convex job newbob runs usually end
    62.7-62.9 %, but one in about twelve meets a dip while ramping, stops early at 62.2 %,
    and the difference measured newbob's luck, not the kills.) Four runs measured rolled
    back epochs 5 and 8 each; a run that rolls none back is still held to its lineage."""
    seed, marks = _kill_marks(800, 3)
    run, kills = run_with_kills(cluster, "newbob", (*NEWBOB, "--checkpoint-seconds", "0.5"), marks)
    assert kills == 3, f"seed {seed}: marks {marks}"
    final = run.final()
    assert_exactly_once(run, final["epochs_done"])
    accuracy = [e["cv_accuracy"] for e in final["epochs"]]
    rule = NewbobSchedule(0.02, 0.5, 0.2, 0.05, max_epochs=12)
    expected = [rule.after_epoch(100 * (1 - a)) for a in accuracy]
    rates = [e["learning_rate"] for e in final["epochs"]]
    assert rates[1:] == [d.next_rate for d in expected[:-1]]
    kept = [e["kept"] for e in final["epochs"]]
    assert kept == [not d.restore_best for d in expected]
    assert expected[-1].stop

    spec = JobSpec(network=NetworkSpec.parse("117:10"), epochs=12)
    lineage = Lineage(run.trace, spec, cluster.env["SNET_KERNELS"], kept)
    lineage.assert_written(run, initial_weights(spec.network, spec.seed))
    assert len(lineage.cv) == len(accuracy)
    assert np.allclose(lineage.cv, [100 * a for a in accuracy], atol=0.01), (lineage.cv, accuracy)


@pytest.mark.timeout(240)
def test_torn_checkpoint_other_job_locked_dir_and_results_kept(cluster: Cluster) -> None:
    job = ("--mode", "async", "--epochs", "3", "--checkpoint-seconds", "0.3", *SMALLER_NET)
    run = Run(cluster, "run", job)
    server = run.start()
    # A second server on the same out-dir: refused in one line, exit 1. (Before the
    # workers start: the job trains in a few seconds, and must not end before the kill.)
    clash = cluster.run("server", "--port", "0", "--http-port", "0", *run.args[-4:-2])
    assert clash.returncode == 1, clash.stderr
    assert f"out-dir {run.out_dir} is in use by another snet server (pid {server.process.pid})" in (
        clash.stderr
    )
    assert "Traceback" not in clash.stderr

    workers = run.workers(server)
    wait_until(lambda: _progress(server)[0] > 300, 60, "a few hundred steps")
    server.process.send_signal(signal.SIGKILL)
    server.wait(30)
    checkpoints = sorted((run.out_dir / "checkpoints").glob("ckpt-*.snet"))
    # The last K (default 2), consecutive; K + 1 when the kill fell between a new file's
    # rename and the pruning of the oldest (pruning itself: test_checkpoint.py, and below).
    numbers = [int(path.stem.removeprefix("ckpt-")) for path in checkpoints]
    assert len(numbers) in (2, 3) and numbers == list(range(numbers[0], numbers[-1] + 1))
    newest, previous = checkpoints[-1], checkpoints[-2]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # killed mid-write

    # A checkpoint of another network: one line, exit 2, nothing touched.
    other = cluster.run("server", *run.args, "--port", "0", "--network", "117:32:10")
    assert other.returncode == 2, other.stderr
    errors = [line for line in other.stderr.splitlines() if line.startswith("snet: ")]
    assert len(errors) == 1, other.stderr
    assert "is a checkpoint of another job (network 117:64:10 there, 117:32:10 here)" in errors[0]
    assert "Traceback" not in other.stderr

    server = run.start()
    log = server.log.read_text()
    assert f"{newest.name}: truncated" in log and "trying the previous checkpoint" in log
    assert f"resumed from {previous.name}" in log
    run.finish(server, workers)
    assert_exactly_once(run, 3)
    assert len(list((run.out_dir / "checkpoints").glob("ckpt-*.snet"))) == 2  # pruned to K
    final = run.final()
    earlier = {row["name"] for row in final["earlier"]["workers"]}  # the first life's
    assert earlier and earlier <= {"run-w0", "run-w1"} and len(final["earlier"]["compression"]) == 1
    assert [e["epoch"] for e in final["hooks"]["accuracy"]["epochs"]] == [1, 2, 3]  # kept (from 1)
    trained = (run.out_dir / "weights.npz").read_bytes()

    # Restarted on the finished run and stopped at once: the trained weights stay.
    server = run.start()
    assert server.status()["state"] == "trained"
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert (run.out_dir / "weights.npz").read_bytes() == trained
    assert run.final()["state"] == "trained"

    # --fresh would discard a finished run: refused without --force.
    fresh = cluster.run("server", "--port", "0", "--http-port", "0", *run.args, "--fresh")
    assert fresh.returncode == 2 and "holds the results of a finished run" in fresh.stderr
    assert (run.out_dir / "weights.npz").read_bytes() == trained


@pytest.mark.timeout(240)
def test_sigterm_checkpoints_where_it_stopped(cluster: Cluster) -> None:
    """A stop (``systemctl restart``) loses nothing: the server resumes at the very version
    it stopped at, and what it wrote at the stop are the weights it resumes with."""
    # In bunches of 512 (SMALLER): the subject is the version the stop is resumed at, not
    # learning; three epochs make about 140 versions, and the stop comes after a third.
    run = Run(cluster, "stop", ("--mode", "async", "--epochs", "3", *SMALLER))
    server = run.start()
    workers = run.workers(server)
    wait_until(lambda: _progress(server)[0] > 50, 60, "fifty steps")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    stopped = run.final()
    version, digest = stopped["weight_version"], stopped["weights_digest"]
    assert stopped["checkpoints"]["last"]["version"] == version
    server = run.start()
    assert f"version {version} (weights digest {digest})" in server.log.read_text()
    run.finish(server, workers)
    assert_exactly_once(run, 3)
