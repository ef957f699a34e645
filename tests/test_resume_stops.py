"""The server never forgets, at the edges: a torn checkpoint, another job's, a second
server on a locked out-dir, a finished run's results, and a stop by SIGTERM (resumed at
the very version it stopped at). Real processes on 127.0.0.1 (tests/resume_runs.py)."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from snet.protocol.digest import weights_digest
from snet.server.export import read_weights

from helpers import Cluster, wait_until
from resume_runs import SMALLER, SMALLER_NET, Run, assert_exactly_once, progress
from short_data import short_job


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
    wait_until(lambda: progress(server)[0] > 300, 60, "a few hundred steps")
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
    assert (
        "is a checkpoint of another job (network 117:64:10 sigmoid there, 117:32:10 sigmoid here)"
        in errors[0]
    )
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

    # Restarted on the finished run and stopped at once: the trained weights stay, and
    # what a kill mid-write left of results is removed (it stayed for good)
    (run.out_dir / ".weights.npz.x1y2z3w4").write_bytes(b"half of a weights file")
    server = run.start()
    assert not list(run.out_dir.glob(".weights.npz.*"))
    assert server.status()["state"] == "trained"
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert (run.out_dir / "weights.npz").read_bytes() == trained
    assert run.final()["state"] == "trained"

    # A weights.npz older than the checkpoint (a server killed after a later checkpoint
    # than its last results): a restart that trains nothing writes the weights it resumed
    # (it left the stale file, version 1100 beside a run trained to 1911: a probe)
    with np.load(run.out_dir / "weights.npz") as saved:
        stale = {key: saved[key] for key in saved.files}
    stale["version"], stale["W0"] = np.array(1), stale["W0"] * 0.5
    np.savez(run.out_dir / "weights.npz", **stale)
    server = run.start()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    written, said = read_weights(run.out_dir / "weights.npz"), run.final()
    assert (written.version, weights_digest(written.flat)) == (
        said["weight_version"], said["weights_digest"])  # fmt: skip

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
    wait_until(lambda: progress(server)[0] > 50, 60, "fifty steps")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    stopped = run.final()
    version, digest = stopped["weight_version"], stopped["weights_digest"]
    assert stopped["checkpoints"]["last"]["version"] == version
    server = run.start()
    assert f"version {version} (weights digest {digest})" in server.log.read_text()
    run.finish(server, workers)
    assert_exactly_once(run, 3)


def test_snet_trains_results_are_not_replaced_by_a_server_or_the_demo(cluster: Cluster) -> None:
    """``snet train`` keeps no checkpoints: a server or the demo on its out-dir started a
    fresh run and replaced its finished weights.npz without a word (the other way round
    was refused already: cli/train.py)."""
    out = cluster.tmp_path / "trained"
    trained = cluster.run("train", *short_job(), "--epochs", "1", "--out-dir", str(out))
    assert trained.returncode == 0, trained.stderr
    weights = (out / "weights.npz").read_bytes()
    for command in (("server", "--port", "0", "--http-port", "0"), ("demo",)):
        for fresh in ((), ("--fresh",)):
            refused = cluster.run(*command, *short_job(), "--out-dir", str(out), *fresh)
            assert refused.returncode == 2, refused.stderr
            (line,) = [line for line in refused.stderr.splitlines() if line.startswith("snet: ")]
            assert "Traceback" not in refused.stderr
            assert line.startswith(f"snet: {out} holds the results of a finished run ({out}/")
            assert "weights.npz: snet train's, say)" in line and "--force" in line
    assert (out / "weights.npz").read_bytes() == weights


def test_a_stopped_runs_results_without_a_checkpoint_are_not_replaced(cluster: Cluster) -> None:
    """A server's weights.npz and status.json of a run that trained, its checkpoints gone:
    a fresh run started over them without a word (found by a probe)."""
    out = cluster.tmp_path / "stopped"
    out.mkdir()
    (out / "weights.npz").write_bytes(b"the earlier run's")
    (out / "status.json").write_text('{"state": "stopping", "updates_applied": 120}')
    refused = cluster.run("server", "--port", "0", "--http-port", "0", "--out-dir", str(out))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"snet: {out} holds the results of a stopped run ({out}/weights.npz; status.json: "
        "updates applied); "
        "and no checkpoint to resume: a fresh run would overwrite them: "
        "--fresh --force to do so, or choose another --out-dir"
    )
    assert (out / "weights.npz").read_bytes() == b"the earlier run's"
    # one stopped before it trained wrote its initial weights: started again, as before
    (out / "status.json").write_text('{"state": "stopping", "updates_applied": 0}')
    again = cluster.server("--out-dir", str(out), name="again")
    assert again.status()["state"] == "waiting_for_workers"
