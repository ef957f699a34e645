"""A job that diverges stops, saying so, rather than refusing its updates for ever
(server/divergence.py); a peer whose updates are all refused stops nobody's run."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from snet.cli.main import main
from snet.server.divergence import DivergenceWatch

from helpers import SMALL_JOB
from inprocess import Lab
from short_data import short_data

DIVERGING = ["--activation", "relu", "--learning-rates", "20", "--momentum", "0.9"]


async def test_a_diverging_job_stops_with_why_and_keeps_its_run(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "3", *SMALL_JOB, *DIVERGING,
                              "--data", short_data())  # fmt: skip
    workers = [lab.worker(server, f"w{i}") for i in range(2)]
    reason = await server.wait(60)
    assert reason.startswith("training diverged: the last 100 updates, from every worker, ")
    assert "were refused and none applied to version " in reason
    assert "a lower learning rate, started over with --fresh, may train" in reason
    assert "ERROR" in lab.log("server") and "training diverged" in lab.log("server")
    status = server.final_status()
    assert status["stop_reason"] == reason and status["epochs_done"] == 0
    assert list((server.out_dir / "checkpoints").glob("ckpt-*")), "the run was not kept"
    with np.load(server.out_dir / "weights.npz") as weights:  # the last that were applied
        assert int(weights["version"]) == status["weight_version"] > 0
        assert all(np.isfinite(weights[f"{kind}{i}"]).all() for kind in "Wb" for i in (0, 1))
    for worker in workers:
        worker.stop("test over")  # they wait for the server to come back, as after a stop
        assert await worker.wait(30) == 0


def test_refusals_of_one_peer_do_not_stop_a_run_others_train() -> None:
    watch = DivergenceWatch(min_refused=10, per_worker=3)
    live = [1, 2]
    for _ in range(50):  # worker 2 sends garbage as fast as it can; worker 1 waits
        assert watch.refuse(2, "implausible", live, 7) is None
    for _ in range(2):
        assert watch.refuse(1, "not finite", live, 7) is None
    why = watch.refuse(1, "update norm 1e12 per pattern is implausible", live, 7)
    assert why is not None and "the last 53 updates, from every worker" in why
    assert "to version 7 (the last: update norm 1e12" in why
    assert watch.refuse(1, "again", live, 7) is None  # said once
    honest = DivergenceWatch(min_refused=10, per_worker=3)
    for round_ in range(40):
        honest.refuse(2, "implausible", live, round_)
        if round_ % 10 == 9:
            honest.applied()  # worker 1's update: the run moves
    assert not honest.diverged
    alone = DivergenceWatch(min_refused=10, per_worker=3)
    assert [alone.refuse(2, "x", [2], 0) is None for _ in range(10)] == [True] * 9 + [False]


def test_snet_train_of_a_diverging_job_stops_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from the arithmetic either
        status = main(["train", "--epochs", "2", "--network", "117:64:10", *DIVERGING,
                       "--data", short_data(), "--out-dir", str(out)])  # fmt: skip
    said = capsys.readouterr()
    assert status == 1
    assert said.err.startswith("snet train: training diverged in epoch 1: the gradients of ")
    assert "bunches were not finite (loss nan), so no step could be taken" in said.err
    assert said.err.rstrip().endswith("a lower learning rate may train (no weights written)")
    assert "Warning" not in said.err and not (out / "weights.npz").exists()
