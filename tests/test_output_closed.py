"""A command whose output's reader goes (``snet train | head``) stops as SIGPIPE would
stop a program that writes, with exit status 141 and one line on stderr, not a traceback;
the demo stops its run gracefully, so that the same command goes on from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import helpers
from helpers import QUICK_JOB, SMALL_JOB, check_output

EXIT_READER_GONE = 141


def _closed_after_first_epoch(args: list[str], cwd: Path, merged: bool = False) -> tuple[int, str]:
    """``snet ARGS`` with its output read up to the first epoch line and then closed, as
    ``| head`` does: the exit status and what it wrote to stderr (``merged``: stderr into
    the same pipe, as ``2>&1 | head``, so nothing of it can be read)."""
    argv = [sys.executable, "-m", "snet.cli", *args]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True, cwd=cwd, env=helpers.system_ring_environment(),
    )  # fmt: skip
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith("epoch"):
                break
        else:
            raise AssertionError("no epoch line")
        process.stdout.close()
        code = process.wait(timeout=60)
        errors = "" if process.stderr is None else process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    check_output("snet " + args[0], errors)  # no traceback
    return code, errors


@pytest.mark.system  # starts real processes
def test_train_whose_reader_goes_stops_with_141_and_keeps_what_it_trained(
    tmp_path: Path,
) -> None:
    code, errors = _closed_after_first_epoch(
        ["train", *SMALL_JOB, "--epochs", "6", "--out-dir", "out"], tmp_path
    )
    assert code == EXIT_READER_GONE
    (line,) = errors.splitlines()  # as Ctrl-C: the weights trained so far are kept
    assert line.startswith("snet train: stopped (its output's reader has gone) after epoch ")
    assert line.endswith("of 6: the weights so far in out/weights.npz")
    with np.load(tmp_path / "out" / "weights.npz") as saved:
        done = int(saved["epoch"])
        # epoch 1's line was read whole: the write that failed was a later epoch's
        assert 2 <= done <= 5 and f"after epoch {done} of 6" in line

    # stderr in the same pipe (2>&1 | head): its line cannot be written, the stop holds
    merged = ["train", *SMALL_JOB, "--epochs", "6", "--out-dir", "merged"]
    assert _closed_after_first_epoch(merged, tmp_path, merged=True)[0] == EXIT_READER_GONE
    with np.load(tmp_path / "merged" / "weights.npz") as saved:
        assert 2 <= int(saved["epoch"]) <= 5


@pytest.mark.system  # starts real processes
def test_demo_whose_reader_goes_stops_its_run_which_goes_on_again(tmp_path: Path) -> None:
    # QUICK_JOB: the subject is the stop and the going on, not how well the net learns; in
    # bunches of 128 the demo's workers' updates were most of the test's CPU (three runs).
    demo = ["demo", "--mode", "sync", *QUICK_JOB, "--epochs", "6", "--out-dir", "out"]
    code, errors = _closed_after_first_epoch(demo, tmp_path)
    assert code == EXIT_READER_GONE
    assert "snet demo: stopping: its output's reader has gone (the run is kept in out" in errors
    stopped = json.loads((tmp_path / "out" / "status.json").read_text())
    done = stopped["epochs_done"]
    # stopped, not trained; after epoch 1, whose line was read whole
    assert stopped["state"] == "stopping" and 2 <= done <= 5

    # stderr in the same pipe (2>&1 | head): its line cannot be written, the stop holds
    merged = ["demo", "--mode", "sync", *QUICK_JOB, "--epochs", "6", "--out-dir", "merged"]
    assert _closed_after_first_epoch(merged, tmp_path, merged=True)[0] == EXIT_READER_GONE
    halted = json.loads((tmp_path / "merged" / "status.json").read_text())
    assert halted["state"] == "stopping" and 2 <= halted["epochs_done"] <= 5

    again = helpers.run_process(
        [sys.executable, "-m", "snet.cli", *demo], cwd=tmp_path,
        env=helpers.system_ring_environment(), timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "done (trained)" in again.stdout
    final = json.loads((tmp_path / "out" / "status.json").read_text())
    assert len(final["epochs"]) == 6
    assert final["epochs"][:done] == stopped["epochs"][:done]  # went on from the kept run
    for epoch in final["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0, ledger
