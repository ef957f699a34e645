"""Progress everyone can see (issue 18): the fraction of the job done, its rate and ETA in
/status, /metrics and ``snet status``; a waiting-for-workers state; epochs counted from 1
wherever a reader sees them; a progress bar on a terminal only."""

from __future__ import annotations

import io
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from snet.cli.main import main
from snet.cli.progress_bar import ProgressBar, bar_text, clock
from snet.cli.status import render
from snet.server.job_progress import WINDOW_SECONDS, ProgressMeter

from helpers import SMALL_JOB
from inprocess import Lab, wait_until
from short_data import short_data, short_job
from slow_backend import Slow


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ")[1])
    return None


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_the_server_waits_for_min_workers_and_says_so(lab: Lab) -> None:
    """/status says "waiting_for_workers" (not "training") until --min-workers joined."""
    server = await lab.server("--epochs", "2", "--min-workers", "2", *short_job())
    lab.worker(server, "w1")
    await wait_until(lambda: server.server.coordinator.sessions, 30, "the first worker")
    status = await server.status()
    assert status["state"] == "waiting_for_workers" and status["min_workers"] == 2
    assert status["epochs"][0]["seconds"] == 0.0  # no training time yet (the wait showed)
    assert status["workers_live"] == 1 and status["progress"]["fraction"] == 0.0
    assert "waiting for workers: 1 of 2 joined" in render(status)
    metrics = (await server.get("/metrics")).decode()
    assert _metric(metrics, "snet_waiting_for_workers") == 1.0
    assert _metric(metrics, "snet_progress_ratio") == 0.0

    lab.worker(server, "w2")
    assert await server.wait(90) == "trained"
    final = server.final_status()
    assert final["state"] == "trained"
    assert final["epoch"] == 2 and [e["epoch"] for e in final["epochs"]] == [1, 2]
    with np.load(server.out_dir / "weights.npz") as weights:  # whole epochs, as snet train's
        assert int(weights["epoch"]) == 2  # (it was the last one's index, 1)
    assert [e["ledger"]["epoch"] for e in final["epochs"]] == [1, 2]  # its ledger's too
    assert final["checkpoints"]["last"]["epoch"] == 2  # the last checkpoint's, from 1
    progress = final["progress"]
    assert progress["fraction"] == 1.0 and progress["eta_seconds"] == 0.0
    assert (
        progress["frames_done"]
        == progress["frames_planned"]
        == 2 * final["epochs"][0]["ledger"]["frames"]
    )
    assert [e["epoch"] for e in final["hooks"]["accuracy"]["epochs"]] == [1, 2]
    assert len(final["hooks"]["mcups"]["per_epoch"]) == 2  # the last one was missing
    assert "epoch 1 done at version" in lab.log("server")
    assert "epoch 0 " not in lab.log("server")  # no log line counts from 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the waiting state, not the loop
async def test_with_the_default_one_worker_the_server_waits_for_it_and_says_so(lab: Lab) -> None:
    """The default --min-workers 1: before any worker joins, /status said "training"."""
    server = await lab.server("--epochs", "1", *short_job())
    status = await server.status()
    assert status["state"] == "waiting_for_workers" and status["min_workers"] == 1
    assert "waiting for workers: 0 of 1 joined" in render(status)
    assert _metric((await server.get("/metrics")).decode(), "snet_waiting_for_workers") == 1.0
    lab.worker(server, "w1")
    assert await server.wait(90) == "trained"
    assert server.final_status()["state"] == "trained"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # it waits on the clock for a rate
async def test_progress_rate_and_eta_while_training(lab: Lab) -> None:
    """Mid-run: part of the job done, a rate, an ETA, the same in /metrics and the table
    (a third of the data, its bunches slept 5 ms: the figures are the test, not them)."""
    server = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB,
                              "--data", short_data())  # fmt: skip
    lab.worker(server, "w1", backend=Slow(0.005))

    async def moving() -> dict[str, Any] | None:
        status = await server.status()
        progress = status["progress"]
        ready = progress["frames_per_second"] and 0 < progress["fraction"] < 1
        return status if ready else None

    status = await wait_until(moving, 60, "a measured rate mid-run")
    progress = status["progress"]
    assert status["state"] == "training" and status["epoch"] >= 1
    assert progress["frames_planned"] == 200 * len(server.server.coordinator.plan.train_frames)
    assert 0 < progress["frames_done"] < progress["frames_planned"]
    assert progress["frames_per_second"] > 0 and progress["eta_seconds"] > 0
    remaining = progress["frames_planned"] - progress["frames_done"]
    assert progress["eta_seconds"] == pytest.approx(
        remaining / progress["frames_per_second"], rel=0.01
    )
    metrics = (await server.get("/metrics")).decode()
    assert 0 < (_metric(metrics, "snet_progress_ratio") or 0) < 1
    assert (_metric(metrics, "snet_frames_per_second") or 0) > 0
    assert (_metric(metrics, "snet_eta_seconds") or 0) > 0
    table = render(status)
    assert f"epoch {status['epoch']}/200," in table and "frames/s, ETA " in table
    server.stop("test over")
    assert await server.wait(30) == "test over"


def test_the_meter_measures_over_its_window_and_restarts_after_a_restore() -> None:
    meter = ProgressMeter()
    assert meter.rate() is None
    meter.sample(100.0, 0)
    meter.sample(100.2, 500)  # closer than SAMPLE_SECONDS to the last: not kept
    assert meter.rate() is None
    meter.sample(101.0, 1000)
    assert meter.rate() == pytest.approx(1000.0)
    for second in range(2, 60):
        meter.sample(100.0 + second, 1000 * second if second < 20 else 40_000 + 10 * second)
    assert meter.samples[0][0] >= 159.0 - WINDOW_SECONDS - 1  # about 30 s of samples kept
    assert meter.rate() == pytest.approx(10.0)  # the old pace has left the window
    meter.sample(161.0, 5)  # fewer patterns than before: the counts were restored
    assert list(meter.samples) == [(161.0, 5)] and meter.rate() is None


def test_the_meters_figures_count_whole_epochs_and_the_current_one() -> None:
    epochs = [SimpleNamespace(train_patterns=100, ended=1.0),
              SimpleNamespace(train_patterns=25, ended=None)]  # fmt: skip
    stats = SimpleNamespace(patterns_applied=125, epochs_planned=4, epochs_done=1, epochs=epochs)
    finished = SimpleNamespace(is_set=lambda: False)
    coordinator: Any = SimpleNamespace(
        stats=stats, plan=SimpleNamespace(train_frames=range(100)), finished=finished
    )
    meter = ProgressMeter(deque([(0.0, 0)]))
    figures = meter.figures(coordinator, 5.0)
    assert figures == {
        "fraction": 0.3125,
        "epoch_fraction": 0.25,
        "frames_done": 125,
        "frames_planned": 400,
        "frames_per_second": 25.0,
        "eta_seconds": 11.0,
    }


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    assert bar_text(0.5, 3, 10, 1234.4, 83) == (
        "[############............]  50.0%  epoch 3/10  1,234 frames/s  ETA 1:23"
    )
    assert bar_text(0.0, 1, 10, None, None) == "[........................]   0.0%  epoch 1/10"
    assert clock(3725) == "1:02:05"
    screen = Terminal()
    bar = ProgressBar(screen)
    bar.draw("[#...] 1%")
    bar.print("epoch  1 done")
    bar.clear()
    assert screen.getvalue() == "\r[#...] 1%\x1b[K\r\x1b[Kepoch  1 done\n"
    pipe = io.StringIO()
    plain = ProgressBar(pipe)
    plain.draw("[#...] 1%", force=True)
    plain.print("epoch  1 done")
    plain.clear()
    assert pipe.getvalue() == "epoch  1 done\n"  # no bar, no escape code
    monkeypatch.setenv("TERM", "dumb")
    assert not ProgressBar(Terminal()).enabled


def test_snet_train_in_a_pipe_prints_plain_lines_counted_from_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`snet train` whose output is not a terminal: one plain line per epoch (on a third
    of the data: tests/short_data.py)."""
    out = tmp_path / "out"
    job = ["--epochs", "2", "--network", "117:16:10", "--data", short_data()]
    assert main(["train", *job, "--out-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\r" not in printed
    lines = printed.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["epoch", "1"], ["epoch", "2"]]
    assert lines[2] == f"weights in {out / 'weights.npz'}"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the out-dir, not the loop
async def test_a_fresh_run_stopped_at_once_leaves_its_own_weights_beside_its_status(
    lab: Lab,
) -> None:
    """``--fresh --force`` over a finished run, stopped before it trained: weights.npz was
    the old run's (version 32 here) beside the new run's status.json (version 0)."""
    first = await lab.server("--epochs", "1", *short_job())
    lab.worker(first, "w1")
    assert await first.wait(90) == "trained"
    with np.load(first.out_dir / "weights.npz") as saved:
        assert int(saved["version"]) > 0

    again = await lab.server("--epochs", "1", "--fresh", "--force", *short_job())
    again.stop("test over")
    assert await again.wait(30) == "test over"
    status = again.final_status()
    with np.load(again.out_dir / "weights.npz") as saved:
        assert int(saved["version"]) == status["weight_version"] == 0
    assert not status["epochs_done"]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # a log line, not the loop
async def test_init_weights_beside_a_checkpoint_is_said_to_be_unused(lab: Lab) -> None:
    """Documented as ignored when there is a checkpoint to resume from; now also said."""
    first = await lab.server("--epochs", "1", *short_job())
    lab.worker(first, "w1")
    assert await first.wait(90) == "trained"
    weights = first.out_dir / "weights.npz"
    again = await lab.server("--epochs", "1", "--init-weights", str(weights), *short_job())
    again.stop("test over")
    await again.wait(30)
    assert f"--init-weights {weights} not used: resuming the run checkpointed in" in lab.log(
        "server"
    )


def test_the_demo_marks_an_epoch_newbob_rolled_back_as_snet_train_does() -> None:
    """An epoch whose weights newbob rolled back was printed as any other by the demo;
    ``snet train`` says "(rolled back)"."""
    from snet.cli.demo import _print_epochs
    from snet.cli.progress_bar import ProgressBar

    def record(epoch: int, kept: bool | None) -> SimpleNamespace:
        row = {"cv_accuracy": 0.9, "learning_rate": 0.1, "train_accuracy": 0.95, "kept": kept}
        return SimpleNamespace(epoch=epoch, as_dict=lambda: row)

    stats = SimpleNamespace(epochs=[record(0, True), record(1, False), record(2, None)])
    coordinator = SimpleNamespace(job=SimpleNamespace(epochs=3), stats=stats)
    server = SimpleNamespace(coordinator=coordinator)
    out = io.StringIO()
    # scored before this start (a finished run shown again): no times
    _print_epochs(server, 0.0, ProgressBar(out), set(), {0, 1, 2})  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == [
        "epoch  1/3  lr 0.1     train  95.00%  CV  90.00%",
        "epoch  2/3  lr 0.1     train  95.00%  CV  90.00%  (rolled back)",
        "epoch  3/3  lr 0.1     train  95.00%  CV  90.00%",  # not decided (a list schedule)
    ]
