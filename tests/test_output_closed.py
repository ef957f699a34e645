"""A command whose output's reader goes (``snet train | head``) stops as SIGPIPE would
stop a program that writes, with exit status 141 and one line on stderr, not a traceback;
the demo stops its run gracefully, so that the same command goes on from it. An output
that cannot be written (``> /dev/full``, a full disk; a terminal gone) is one line and
exit 1, and ``snet train`` and the demo keep what they trained (cli/output.py)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import helpers
from helpers import QUICK_JOB, SMALL_JOB
from output_checks import check_output
from user_errors import tiny_set

EXIT_READER_GONE = 141


def _closed_after_first_epoch(args: list[str], cwd: Path, merged: bool = False) -> tuple[int, str]:
    """``snet ARGS`` with its output read up to the first epoch line and then closed, as
    ``| head`` does: the exit status and what it wrote to stderr (``merged``: stderr into
    the same pipe, as ``2>&1 | head``, so nothing of it can be read)."""
    argv = [sys.executable, "-m", "snet.cli", *args]
    with helpers.DrivenProcess(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True, cwd=cwd, env=helpers.system_ring_environment(),
    ) as process:  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("epoch"):
                break
        else:
            raise AssertionError("no epoch line")
        process.stdout.close()
        code = process.wait(timeout=60)
        errors = "" if process.stderr is None else process.stderr.read()
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
    # the epochs scored before this start are shown without a time (the seconds since this
    # start would pass for theirs), the ones it trained with theirs
    scored = sum(1 for epoch in stopped["epochs"] if epoch["cv_accuracy"] is not None)
    lines = [line for line in again.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 6 and scored >= 1
    assert [line.endswith(" s)") for line in lines] == [False] * scored + [True] * (6 - scored)
    for epoch in final["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0, ledger


def _onto_a_full_disk(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``snet ARGS > /dev/full`` (every write answered ENOSPC, as by a full disk)."""
    return helpers.run_process(
        ["sh", "-c", '"$0" -m snet.cli "$@" > /dev/full', sys.executable, *args],
        cwd=cwd, env=helpers.system_ring_environment(), timeout=120,
    )  # fmt: skip


@pytest.mark.system  # starts real processes
@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--json"],
        ["plan", "--network", "117:64:10", "--workers", "1,2"],
        ["eval", "--weights", "w.npz", "--data", "d.npz", "--json"],
        ["data", "convert", "d.npz", "copy.npz"],
        ["tls", "init", "pki"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_results_onto_a_full_disk_are_one_line_and_exit_1(tmp_path: Path, args: list[str]) -> None:
    """``snet plan --json > /dev/full`` ended in a traceback (as did every command that
    prints its results), with exit status 1 all the same."""
    if args[0] == "tls":
        pytest.importorskip("cryptography")
    if args[0] in ("eval", "data"):
        tiny_set(tmp_path / "d.npz")
    if args[0] == "eval":
        train = ["train", "--network", "39:8:3", "--context", "1", "--epochs", "1",
                 "--data", "d.npz", "--out-dir", "."]  # fmt: skip
        assert _onto_a_full_disk(train, tmp_path).returncode == 1  # weights kept: below
        args = [*args[:2], str(tmp_path / "weights.npz"), *args[3:]]
    done = _onto_a_full_disk(args, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()  # plan's notes come first
    assert lines[-1] == f"snet {args[0]}: cannot write its output: No space left on device"
    assert [line for line in lines if "output" in line] == lines[-1:]  # said once


@pytest.mark.system  # starts real processes
def test_a_demo_onto_a_full_disk_stops_before_it_trains(tmp_path: Path) -> None:
    """Its first line cannot be written: the run stops as when its reader goes (its
    workers told and stopped, the run kept), where it had left them to their lifeline."""
    done = _onto_a_full_disk(["demo", *QUICK_JOB, "--epochs", "1", "--out-dir", "out"], tmp_path)
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if line.startswith("snet ")]
    assert said == [
        "snet demo: stopping: its output cannot be written (No space left on device) (the "
        "run is kept in out: the same command goes on from it)"
    ]
    assert json.loads((tmp_path / "out" / "status.json").read_text())["state"] == "stopping"


@pytest.mark.system  # starts real processes
def test_train_onto_a_full_disk_stops_and_keeps_what_it_trained(tmp_path: Path) -> None:
    done = _onto_a_full_disk(["train", *SMALL_JOB, "--epochs", "4", "--out-dir", "out"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "snet train: stopped (its output cannot be written: No space left on device) after "
        "epoch 1 of 4: the weights so far in out/weights.npz"
    ]
    with np.load(tmp_path / "out" / "weights.npz") as saved:
        assert int(saved["epoch"]) == 1  # the first epoch's line was the first write


@pytest.mark.system  # starts real processes
def test_demo_whose_terminal_goes_stops_its_run_and_keeps_it(tmp_path: Path) -> None:
    """A terminal that goes away (its pseudo-terminal's master closed: every write is
    EIO) mid-run: the demo stops its run as when its reader goes, and says so."""
    demo = ["demo", "--mode", "sync", *QUICK_JOB, "--epochs", "6", "--out-dir", "out"]
    terminal, end = pty.openpty()
    process = helpers.DrivenProcess(
        [sys.executable, "-m", "snet.cli", *demo], stdout=end, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path, env=helpers.system_ring_environment(),
    )  # fmt: skip
    os.close(end)
    shown = b""
    try:
        deadline = time.monotonic() + 60
        while b"epoch  1/6  lr" not in shown:  # the epoch's line, not the bar's
            assert time.monotonic() < deadline, shown[-500:]
            try:
                shown += os.read(terminal, 4096)
            except OSError:  # EIO: the demo has exited
                raise AssertionError(process.communicate(timeout=30)[1]) from None
        os.close(terminal)  # the terminal goes
        terminal = -1
        code = process.wait(timeout=60)
        errors = process.stderr.read() if process.stderr else ""
    finally:
        if terminal >= 0:
            os.close(terminal)
        process.stop()  # killed if still there; what it wrote to stderr scanned
    check_output("snet demo (its terminal)", shown.decode(errors="replace"))
    check_output("snet demo", errors)
    assert code == 1, errors
    assert (
        "snet demo: stopping: its output cannot be written (Input/output error) (the run "
        "is kept in out: the same command goes on from it)" in errors.splitlines()
    )
    stopped = json.loads((tmp_path / "out" / "status.json").read_text())
    assert stopped["state"] == "stopping" and 1 <= stopped["epochs_done"] <= 5


@pytest.mark.system  # starts real processes
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    ("args", "who"),
    [(["--help"], "snet"), (["--version"], "snet"), (["status", "--help"], "snet status"),
     (["tls", "init", "--help"], "snet tls")],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)  # fmt: skip
def test_help_and_version_onto_a_full_disk_are_one_line_and_exit_1(
    tmp_path: Path, args: list[str], who: str, buffered: bool
) -> None:
    """argparse prints help and the version itself and swallows a failed write: the text
    was lost and, stdout being buffered, the flush at exit failed after it, "Exception
    ignored" with a traceback and status 120 (unbuffered: the traceback of the write,
    exit 1). Now they end as every command's output does."""
    env = {**helpers.system_ring_environment(), "PYTHONUNBUFFERED": "" if buffered else "1"}
    done = helpers.run_process(
        ["sh", "-c", '"$0" -m snet.cli "$@" > /dev/full', sys.executable, *args],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        1,
        f"{who}: cannot write its output: No space left on device\n",
    )


@pytest.mark.system  # starts real processes
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["--help"], ["--version"]], ids=" ".join)
def test_help_whose_reader_has_gone_ends_quietly_as_sigpipe_would(
    tmp_path: Path, args: list[str], buffered: bool
) -> None:
    """A reader gone before the help is written (its pipe's read end closed): exit 141,
    as for a command whose reader goes, with nothing to stop and so no line; it was exit 0
    (unbuffered: argparse swallowed the error) or 120 and a traceback (the flush at exit)."""
    env = {**helpers.system_ring_environment(), "PYTHONUNBUFFERED": "" if buffered else "1"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = helpers.run_process(
            [sys.executable, "-m", "snet.cli", *args], stdout=write_end, cwd=tmp_path, env=env,
        )  # fmt: skip
    finally:
        os.close(write_end)
    check_output("snet " + args[0], done.stderr)  # no traceback
    assert (done.returncode, done.stderr) == (EXIT_READER_GONE, "")


@pytest.mark.system  # starts real processes
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_the_benchmark_suites_help_onto_a_full_disk_is_one_line_and_exit_1(
    buffered: bool,
) -> None:
    """`snet bench --help` passes through to `python -m bench` in the checkout, whose
    plain argparse parser lost the help on a full disk and exited 0 without a word."""
    env = {**helpers.system_ring_environment(), "PYTHONUNBUFFERED": "" if buffered else "1"}
    done = helpers.run_process(
        ["sh", "-c", '"$0" -m bench --help > /dev/full', sys.executable],
        cwd=Path(__file__).resolve().parent.parent, env=env,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        1,
        "python -m bench: cannot write its output: No space left on device\n",
    )
