"""Hooks a user writes cannot stop a run nor the documents it reports: figures JSON cannot
encode switch the hook off; a constructor that raises is one line at start-up; a server
that cannot write its results stops and says so. And the built-in MCUPS figures cover
every epoch and only the time spent training."""

from __future__ import annotations

import datetime
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snet.protocol import hooks as hooks_module
from snet.protocol.errors import ConfigError
from snet.protocol.hooks import BunchEvent, EpochEvent, Hook, HookSet, McupsHook, RunInfo, load_hook
from snet.server.app import SnetServer
from snet.server.checkpoint import CheckpointStore
from snet.server.reported import finite

from inprocess import Lab, wait_until
from short_data import short_job
from user_errors import error


class Stamp(Hook):
    """The stranger's hook: a datetime among its figures."""

    name = "stamp"

    def __init__(self) -> None:
        self.at: datetime.datetime | None = None

    def after_epoch(self, event: EpochEvent) -> None:
        self.at = datetime.datetime.now()

    def figures(self) -> dict[str, Any]:
        return {"last_epoch_at": self.at}


class Tally(Hook):
    name = "tally"

    def figures(self) -> dict[str, Any]:
        return {"seen": {1, 2}}  # a set


class Raising(Hook):
    name = "raising"

    def figures(self) -> dict[str, Any]:
        raise RuntimeError("no figures today")


class Plain(Hook):
    name = "plain"

    def figures(self) -> dict[str, Any]:
        return {"pair": (1, 2.5), "nan": float("nan")}


class BadInit(Hook):
    def __init__(self) -> None:
        raise ValueError("nope")


@pytest.fixture
def user_hooks(monkeypatch: pytest.MonkeyPatch) -> str:
    """The classes above as the importable module ``user_hooks`` (as ``--hooks`` names it)."""
    module = types.ModuleType("user_hooks")
    for cls in (Stamp, Tally, BadInit):
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "user_hooks", module)
    return "user_hooks"


EPOCH = EpochEvent(0, 0.1, 16, 10, 4, 3, 1.0, True)


def test_figures_json_cannot_encode_switch_the_hook_off_as_raising_does() -> None:
    stamp = Stamp()
    hooks = HookSet([stamp, Tally(), Raising(), Plain()])
    assert hooks.figures()["stamp"] == {"last_epoch_at": None}  # encodable so far
    hooks.call("after_epoch", EPOCH)
    figures = hooks.figures()
    json.dumps(finite(figures), allow_nan=False)  # as /status and status.json write them
    assert figures["stamp"]["disabled"] and "datetime" in figures["stamp"]["error"]
    assert figures["stamp"]["error"].startswith("figures: TypeError: ")
    assert figures["tally"]["disabled"] and "set" in figures["tally"]["error"]
    assert figures["raising"]["disabled"] and "no figures today" in figures["raising"]["error"]
    assert figures["plain"]["pair"] == [1, 2.5] and finite(figures)["plain"]["nan"] is None
    assert hooks.hooks[-1].name == "plain" and len(hooks.hooks) == 1  # the others: off
    hooks.call("after_epoch", EPOCH)  # not called again
    assert stamp.at is not None and hooks.figures()["stamp"]["disabled"]


class Keeper(Hook):
    """Keeps a history; ``state`` is what it gives the checkpoint."""

    def __init__(self, name: str, state: Any) -> None:
        self.name, self.state = name, state

    def checkpoint_state(self) -> Any:
        return self.state


def test_a_state_the_checkpoint_cannot_hold_switches_the_hook_off() -> None:
    """It made every checkpoint fail ("cannot encode a checkpoint"): none was written."""
    arrays = {"sums": np.arange(3.0), "best": np.float32(0.5)}  # a checkpoint holds these
    hooks = HookSet([Keeper("dated", {"at": datetime.date(2026, 1, 1)}), Keeper("arrays", arrays)])
    saved = hooks.checkpoint_state()
    assert list(saved) == ["arrays"] and saved["arrays"] is arrays
    assert hooks.figures()["dated"]["disabled"]
    assert hooks.figures()["dated"]["error"].startswith("checkpoint_state: TypeError: ")


def test_a_hook_whose_constructor_raises_is_a_config_error(user_hooks: str) -> None:
    with pytest.raises(ConfigError, match="hook 'user_hooks:BadInit': ValueError: nope"):
        load_hook(f"{user_hooks}:BadInit")


def test_snet_server_says_so_in_one_line(
    user_hooks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["server", "--port", "0", "--http-port", "0", "--out-dir", str(tmp_path / "out"),
            "--hooks", f"{user_hooks}:BadInit"]  # fmt: skip
    message = error(argv, capsys)
    assert "cannot load hook 'user_hooks:BadInit': ValueError: nope" in message


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the hooks, not the loop
async def test_a_hook_with_figures_json_cannot_encode_does_not_stop_the_server(
    lab: Lab, user_hooks: str
) -> None:
    """It hung after training (status.json never written, workers kept) and /status gave 500."""
    server = await lab.server("--epochs", "1", "--linger-seconds", "-1", "--hooks",
                              f"{user_hooks}:Stamp", *short_job())  # fmt: skip
    worker = lab.worker(server, "w1")
    assert await worker.wait(60) == 0  # told goodbye: trained
    status = await server.status()
    assert status["state"] == "trained"
    assert status["hooks"]["stamp"]["disabled"]
    assert "datetime" in status["hooks"]["stamp"]["error"]
    assert b"snet_" in await server.get("/metrics")
    final = server.final_status()
    assert final["state"] == "trained" and final["hooks"]["stamp"]["disabled"]
    server.stop("signal SIGTERM")
    assert await server.wait(30) == "trained"  # stopped while it served its results


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_results_that_cannot_be_written_stop_the_server_with_the_error(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception while writing the results left the server waiting, its workers too.
    The workers are told why, not "training complete": they had gone home (exit 0, which
    systemd does not restart), and the restarted server, resuming short of the end from
    its last checkpoint, waited for them forever. Now they wait for it to come back."""

    def full_disk(self: SnetServer) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SnetServer, "write_final_weights", full_disk)
    server = await lab.server("--epochs", "1", *short_job())
    worker = lab.worker(server, "w1")
    reason = await server.wait(60)
    assert reason == "failed: results not written: OSError: [Errno 28] No space left on device"
    assert "ERROR   snet.server: failed: results not written" in lab.log("server")
    await wait_until(lambda: "mid-job; waiting" in lab.log("w1"), 10, "the worker waiting")
    assert f"server said goodbye ({reason}) mid-job" in lab.log("w1")
    assert not worker.task.done()  # waiting for the restarted server, not gone home
    worker.stop("signal SIGTERM")
    assert await worker.wait(10) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_results_written_on_the_second_try_end_the_run_as_trained(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write at training's end fails, the one at shutdown succeeds: the exit named
    the first failure (status 1) though the files were written."""
    written = SnetServer.write_final_weights
    tries: list[int] = []

    def full_once(self: SnetServer) -> Path:
        tries.append(1)
        if len(tries) == 1:
            raise OSError(28, "No space left on device")
        return written(self)

    monkeypatch.setattr(SnetServer, "write_final_weights", full_once)
    server = await lab.server("--epochs", "1", *short_job())
    worker = lab.worker(server, "w1")
    assert await server.wait(60) == "trained"
    assert await worker.wait(30) == 0 and len(tries) == 2
    assert server.final_status()["state"] == "trained"
    assert "ERROR   snet.server: failed: results not written" in lab.log("server")


def _failing_finished_checkpoints(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """The checkpoint store's first ``failures`` writes of a finished run's state fail
    (a full disk); the list counts them."""
    write, failed = CheckpointStore.write, []

    def full_disk(self: CheckpointStore, state: dict[str, Any]) -> Path:
        if state["coordinator"]["finished"] and len(failed) < failures:
            failed.append(1)
            raise OSError(28, "No space left on device")
        return write(self, state)

    monkeypatch.setattr(CheckpointStore, "write", full_disk)
    return failed


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
@pytest.mark.parametrize(
    ("code", "said"),
    [(28, "[Errno 28] No space left on device"), (1, "[Errno 1] Operation not permitted: '")],
)
async def test_a_run_of_failed_checkpoints_is_logged_once_and_its_end_said(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, code: int, said: str
) -> None:
    """A full disk under --checkpoint-steps 50 logged "cannot write a checkpoint" 270
    times in 9 s. A run of failed writes is logged at its first (then once a minute), and
    the write that ends it says how many failed; also when each names another temporary
    file (an immutable directory logged 53 lines in 5 s)."""
    write, failed = CheckpointStore.write, []

    def full_for_a_while(self: CheckpointStore, state: dict[str, Any]) -> Path:
        if len(failed) < 20:
            failed.append(1)
            if code == 28:
                raise OSError(28, "No space left on device")
            raise OSError(code, "Operation not permitted", f"/out/.ckpt.{len(failed)}.tmp")
        return write(self, state)

    monkeypatch.setattr(CheckpointStore, "write", full_for_a_while)
    server = await lab.server("--epochs", "1", "--checkpoint-steps", "1", *short_job())
    worker = lab.worker(server, "w1")
    assert await server.wait(60) == "trained" and len(failed) == 20
    assert await worker.wait(30) == 0
    log = lab.capture.text()  # the writer thread's lines are no process's: the lab's all
    assert log.count("cannot write a checkpoint") == 1, log
    assert f"cannot write a checkpoint (1 in a row): {said}" in log
    assert re.search(r"checkpoint ckpt-\d+\.snet written, after 20 that could not be", log), log
    assert server.final_status()["checkpoints"]["failed"] == 20


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_last_checkpoint_that_failed_is_written_again_at_the_end(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint of the run's end failed once (space freed just after): it counted as
    taken, so none was written again, the server ended "trained", and the same command on
    its out-dir resumed short of the end and waited for workers (a finished run's says so
    and exits)."""
    failed = _failing_finished_checkpoints(monkeypatch, 1)
    server = await lab.server("--epochs", "1", *short_job())
    worker = lab.worker(server, "w1")
    assert await server.wait(60) == "trained" and failed == [1]
    assert await worker.wait(30) == 0
    # a completed run: no worker to wait for (and, asked to, none to tell it ended:
    # that wait is tests/test_resumed_completed.py's)
    again = await lab.server("--epochs", "1", *short_job(), "--resumed-linger-seconds", "0")
    assert await again.wait(30) == "trained"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_last_checkpoint_that_cannot_be_written_is_results_not_written(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose end never reaches the disk is not "trained" (exit 0, which systemd
    leaves down): its restart resumes short of the end and needs the workers back."""
    _failing_finished_checkpoints(monkeypatch, 99)
    server = await lab.server("--epochs", "1", *short_job())
    worker = lab.worker(server, "w1")
    reason = await server.wait(60)
    assert reason.startswith("failed: results not written: OSError: the last checkpoint was not")
    await wait_until(lambda: "mid-job; waiting" in lab.log("w1"), 10, "the worker waiting")
    worker.stop("signal SIGTERM")
    assert await worker.wait(10) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_trace_file_on_a_full_disk_ends_the_trace_not_the_run(lab: Lab) -> None:
    """A trace record that could not be written raised in the step machinery, which
    stopped the server, and its exit was a traceback from closing the file. /dev/full
    answers every write with ENOSPC."""
    server = await lab.server("--epochs", "1", "--trace-file", "/dev/full", *short_job())
    worker = lab.worker(server, "w1")
    assert await server.wait(60) == "trained"
    assert await worker.wait(30) == 0
    log = lab.log("server")
    assert "cannot write the trace file /dev/full ([Errno 28] No space left on device): " in log
    assert log.count("cannot write the trace file") == 1  # said once


class Clock:
    """``time.perf_counter`` for the MCUPS hook, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def _epoch(hooks: HookSet, clock: Clock, epoch: int, seconds: float) -> None:
    """An epoch of 1000 patterns in two bunches over ``seconds``, then its CV."""
    hooks.call("before_epoch", epoch, 0.1)
    for _ in range(2):
        clock.now += seconds / 2
        hooks.call("after_bunch", BunchEvent(epoch, 1, 1, 500, 400, 1.0, 0.1))
    hooks.call("after_epoch", EPOCH)


def test_mcups_has_every_epoch_and_only_the_training_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(hooks_module, "time", clock)
    mcups = McupsHook()
    hooks = HookSet([mcups])
    hooks.call("before_training", RunInfo("3:4:2", 2000, "sync", 2, 1000))  # 2000 connections
    _epoch(hooks, clock, 0, 1.0)
    _epoch(hooks, clock, 1, 4.0)
    hooks.call("after_training")
    # 2000 connections x 1000 patterns: 2 million updates an epoch, in 1 s then 4 s
    assert hooks.figures()["mcups"] == {"mcups": 0.8, "per_epoch": [2.0, 0.5]}
    clock.now += 60.0  # lingering: the overall figure stays what training made it
    assert hooks.figures()["mcups"]["mcups"] == 0.8

    restarted = McupsHook()  # a server resumed from the checkpoint, trains nothing
    again = HookSet([restarted])
    again.call("before_training", RunInfo("3:4:2", 2000, "sync", 2, 1000))
    again.restore_checkpoint(hooks.checkpoint_state())
    clock.now += 30.0
    assert again.figures()["mcups"] == {"mcups": 0.8, "per_epoch": [2.0, 0.5]}


def test_mcups_restores_a_checkpoint_from_before_it_kept_its_totals() -> None:
    mcups = McupsHook()
    mcups.restore_checkpoint({"per_epoch": [1.5]})
    assert mcups.figures() == {"mcups": 0.0, "per_epoch": [1.5]}
