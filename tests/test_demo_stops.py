"""How ``snet demo`` stops: a bad flag meant for its workers before anything starts; its
worker processes gone (failed at start, or killed) before training is done; the user's
SIGTERM or Ctrl-C before the first CV result; the demo itself killed, which its workers
do not outlive (real processes: the system ring)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snet.transport import cpu_time

import helpers
from helpers import SMALL_JOB, wait_until
from output_checks import check_output

pytestmark = pytest.mark.system
DEMO = ["demo", *SMALL_JOB, "--out-dir", "out"]
EXIT_SECONDS = 60  # for a demo to end once it should (the bugs: it waited forever)


class Demo:
    """``snet demo ARGS`` in a session of its own (its workers too: a terminal's Ctrl-C
    is sent to the process group), its output in files; what is left is killed, and its
    output scanned for tracebacks."""

    def __init__(self, cwd: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.out, self.err = cwd / "demo.out", cwd / "demo.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = helpers.DrivenProcess(
                [sys.executable, "-m", "snet.cli", *args], stdout=out, stderr=err, cwd=cwd,
                env={**helpers.system_ring_environment(), **(env or {})},
                start_new_session=True, logs=(self.out, self.err),
            )  # fmt: skip

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self) -> int:
        """Its exit status, once it has exited (at most ``EXIT_SECONDS``)."""
        code = self.process.wait(timeout=EXIT_SECONDS)
        check_output("snet demo", self.stdout() + self.stderr())
        return code

    def worker_pids(self) -> list[int]:
        """The demo's own child processes: its worker processes."""
        return cpu_time.children(self.process.pid)

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.cwd / "out" / "status.json").read_text())
        return document

    def group_gone(self) -> bool:
        """Nothing is left of the demo's process group (once the demo has exited)."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def descendants(self) -> list[int]:
        """The demo's worker processes and theirs (the forked workers of its group)."""
        return cpu_time.descendants(self.process.pid)[1:]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # its group: the demo and its workers
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.stop()  # waits for it, then scans its output


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: its new parent, init, reaps it late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _board(run: Demo) -> int | None:
    """The pid of the demo's board process (``snet spert``), once it has started."""
    for pid in run.worker_pids():
        with contextlib.suppress(FileNotFoundError):
            if b"spert" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return pid
    return None


def _status_url(run: Demo) -> str:
    """The /status address the demo printed (once it has)."""
    words = wait_until(
        lambda: [w for w in run.stdout().split() if w.endswith("/status")],
        EXIT_SECONDS,
        "the status address",
    )
    return str(words[0])


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        document: dict[str, Any] = json.loads(response.read())
        return document


@contextlib.contextmanager
def demo(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Demo]:
    run = Demo(cwd, [*DEMO, *args], env)
    try:
        yield run
    finally:
        run.close()


def test_a_bad_weights_codec_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Its workers' process, started first to load their code while the demo loads its
    own (cli/preloaded_worker.py), is gone with the demo, without a word."""
    with demo(tmp_path, "--weights-codec", "bogus") as run:
        assert run.wait() == 2
        assert run.group_gone()
    assert run.stdout() == ""  # no server, no workers
    assert run.stderr().startswith("snet: unknown weights codec 'bogus'; use none, fp16")
    assert len(run.stderr().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_workers_weights_form_from_their_environment_is_theirs(tmp_path: Path) -> None:
    """Without the demo's --weights-codec, the workers' own variable decides (the demo once
    passed its default on, so the variable was never read, and a bad one went unsaid)."""
    done = helpers.run_process(
        [sys.executable, "-m", "snet.cli", "demo", "--out-dir", "out"], cwd=tmp_path,
        env={**helpers.system_ring_environment(), "SNET_WORKER_WEIGHTS_CODEC": "bogus"},
        timeout=EXIT_SECONDS,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("snet: unknown weights codec 'bogus'; use none, fp16"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("SNET_WORKER_BACKEND", "bogus", "is not one of auto, numpy, torch, spert, modelled"),
        ("SNET_WORKER_THREADS", "abc", "is not a whole number"),
        ("SNET_SPERT_CHUNK_PATTERNS", "abc", "is not a whole number"),
    ],
)
def test_a_bad_worker_setting_in_the_environment_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    """Checked as the workers would read it: each of them said it (run together on one
    line), then the demo stopped the run it had started, saying the same command would
    go on from it."""
    done = helpers.run_process(
        [sys.executable, "-m", "snet.cli", *DEMO, "--spert", "1", "--spert-time-scale", "50"],
        cwd=tmp_path, env={**helpers.system_ring_environment(), variable: value},
        timeout=EXIT_SECONDS,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""  # no server, no workers
    assert done.stderr.splitlines() == [f"snet: {variable}: {value!r} {said}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("given", "variables", "said"),
    [
        (["--mode", "bmuf", "--weights-codec", "delta:powersgd:2"], {},
         "the demo's workers cannot take the job: weights codec delta:powersgd:2 sends a "
         "sliver of each change; bmuf workers start every block from the weights they hold"),
        (["--mode", "bmuf"], {"SNET_WORKER_COMPRESS": "topk:0.1"},
         "the demo's workers cannot take the job: update codec topk:0.1 carries a worker's "
         "momentum for gradients; bmuf workers send model deltas"),
        (["--mode", "np", "--weights-codec", "fp16"], {},
         "the demo's workers: --weights-codec fp16 does nothing: np mode's workers send no "
         "updates and are sent no weights (their flags and SNET_WORKER_* variables); leave "
         "them out"),
        (["--mode", "np"], {"SNET_WORKER_COMPRESS": "sign", "SNET_WORKER_WEIGHTS_CODEC": "fp16"},
         "the demo's workers: --compress sign and --weights-codec fp16 do nothing: np mode's "
         "workers send no updates and are sent no weights (their flags and SNET_WORKER_* "
         "variables); leave them out"),
        (["--network", "117:2048:10"], {"SNET_WORKER_MAX_FRAME_MB": "1"},
         "this worker's frame limit is 1 MiB (1048576 bytes), but the weights of network "
         "117:2048:10 take 1048616 bytes: give --max-frame-mb"),
    ],
)  # fmt: skip
def test_workers_that_could_not_take_the_job_are_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, given: list[str], variables: dict[str, str], said: str
) -> None:
    """The server would refuse their codecs at the handshake (exit 4), or they would
    refuse a frame too large for their limit (exit 2): the demo had started the run,
    written its results and exited 1."""
    done = helpers.run_process(
        [sys.executable, "-m", "snet.cli", "demo", "--out-dir", "out", *given],
        cwd=tmp_path, env={**helpers.system_ring_environment(), **variables},
        timeout=EXIT_SECONDS,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"snet: {said}"), line
    assert not (tmp_path / "out").exists()


def test_workers_that_fail_at_start_stop_the_run_which_is_kept(tmp_path: Path) -> None:
    # A setting the workers find wrong only as they start (a file they cannot read; a
    # setting of their own is refused before anything starts: the test above) fails
    # every worker.
    env = {"SNET_WORKER_TLS_CA": str(tmp_path / "missing-ca.pem")}
    with demo(tmp_path, "--epochs", "2", env=env) as run:
        assert run.wait() == 1
        errors = run.stderr()
    assert f"snet: tls_ca {tmp_path / 'missing-ca.pem'} does not exist" in errors
    # the same command would fail the same way: it is not said to go on from the run
    assert (
        "snet demo: stopping: its worker processes have all exited, with exit codes [2], "
        "before training finished (the run is kept in out; the job or a worker's settings "
        "must change first (see above))"
    ) in errors.splitlines()
    assert "done (its workers have gone) in " in run.stdout()
    assert "no epoch was scored, 0 updates" in run.stdout()
    assert run.status()["state"] == "stopping"


def test_a_board_that_fails_before_all_have_joined_stops_the_run(tmp_path: Path) -> None:
    # The board exits; the numpy worker, joined, would wait for it forever (the server
    # leases nothing until every one of the demo's workers has joined). It is killed as
    # it starts (importing its code: it cannot have joined), a bad setting of its own
    # being refused before anything starts.
    args = ("--workers", "1", "--spert", "1", "--spert-time-scale", "50")
    with demo(tmp_path, *args) as run:
        board = wait_until(lambda: _board(run), EXIT_SECONDS, "the board's process")
        os.kill(board, signal.SIGKILL)
        assert run.wait() == 1
        errors = run.stderr()
    assert (
        "snet demo: stopping: 1 of its 2 worker processes exited, with exit codes [-9], "
        "before all 2 workers had joined: training cannot start (the run is kept in out: "
        "the same command goes on from it)"
    ) in errors.splitlines()
    assert "done (its workers have gone) in " in run.stdout()


def test_its_worker_process_killed_mid_run_stops_the_run_which_is_kept(tmp_path: Path) -> None:
    with demo(tmp_path, "--epochs", "50") as run:
        wait_until(lambda: "\nepoch  1/50 " in run.stdout(), EXIT_SECONDS, "the first epoch")
        (group,) = run.worker_pids()  # snet worker --processes 2: it forked the two
        os.kill(group, signal.SIGKILL)
        assert run.wait() == 1
        errors = run.stderr()
        wait_until(run.group_gone, 30, "the forked workers to leave, their parent gone")
    assert (
        "snet demo: stopping: its worker processes have all exited, with exit codes [-9], "
        "before training finished (the run is kept in out: the same command goes on from it)"
    ) in errors.splitlines()
    assert "done (its workers have gone) in " in run.stdout()
    status = run.status()
    assert status["state"] == "stopping"
    printed = run.stdout().count("\nepoch ")  # each epoch line: an epoch trained and scored
    assert printed >= 1 and printed <= status["epochs_done"] < 50


@pytest.mark.parametrize("ctrl_c", [False, True], ids=["SIGTERM", "Ctrl-C"])
def test_stopped_by_the_user_before_the_first_cv_result(tmp_path: Path, ctrl_c: bool) -> None:
    """Stopped cleanly on the user's request: exit 0, as ``snet server`` does, and no
    score where none was made (it said "final CV frame accuracy 0.00%", and exited 1)."""
    # Every update a worker sends waits 60 s: no epoch can end before the stop.
    with demo(tmp_path, "--epochs", "2", env={"SNET_WORKER_FAULTS": "delay:update:1:60"}) as run:
        url = _status_url(run)
        wait_until(lambda: _status(url)["workers_live"] == 2, EXIT_SECONDS, "both joined")
        if ctrl_c:  # as a terminal sends it: to the demo and its workers (one group)
            os.killpg(run.process.pid, signal.SIGINT)
        else:
            run.process.send_signal(signal.SIGTERM)
        assert run.wait() == 0, run.stdout() + run.stderr()
    name = "SIGINT" if ctrl_c else "SIGTERM"
    (done,) = [line for line in run.stdout().splitlines() if line.startswith("done")]
    assert done.startswith(f"done (signal {name}) in ")
    assert ": no epoch was scored, " in done and "0.00%" not in done
    assert done.endswith("worker process exit codes [0]")  # one process, 2 workers
    assert run.status()["epochs_done"] == 0


def test_stopped_mid_epoch_its_score_is_said_to_be_of_the_weights_it_scored(
    tmp_path: Path,
) -> None:
    """Stopped mid-epoch: the last scored epoch's score was said as the "final CV frame
    accuracy" of weights.npz, which had trained on since (90.27 % said of weights that
    scored 91.34 %). (A delayed worker held the CV scoring too: no fault here; the run
    of 50 epochs is stopped once one is scored and the weights have moved on.)"""
    with demo(tmp_path, "--epochs", "50") as run:
        url = _status_url(run)
        wait_until(
            lambda: (
                (s := _status(url))["weights_cv_version"] is not None
                and s["weight_version"] > s["weights_cv_version"]
            ),
            EXIT_SECONDS,
            "a scored epoch, trained on since",
        )
        run.process.send_signal(signal.SIGTERM)
        assert run.wait() == 0, run.stdout() + run.stderr()
    (done,) = [line for line in run.stdout().splitlines() if line.startswith("done")]
    final = run.status()
    assert final["weight_version"] > final["weights_cv_version"]
    (scored,) = [e for e in final["epochs"] if e["end_version"] == final["weights_cv_version"]]
    said = f"{100 * final['weights_cv_accuracy']:.2f}%"
    assert done.startswith("done (signal SIGTERM) in ")
    assert (f": CV frame accuracy {said} of epoch {scored['epoch']}'s weights (those written "
            "trained on since: not scored), ") in done  # fmt: skip
    assert "final CV" not in done


def test_its_workers_and_boards_run_below_its_priority_and_end_when_it_is_killed(
    tmp_path: Path,
) -> None:
    """kill -9 of the demo (or the OOM killer): its workers retried its server, which died
    with it, for 5 minutes, logging to the terminal; now they end with it. While it runs
    they run at a lower priority than its server, which they all wait for."""
    from snet.cli.worker_priority import WORKER_NICENESS

    args = ("--epochs", "50", "--spert", "1", "--spert-time-scale", "50", "--worker-priority",
            "low")  # fmt: skip
    with demo(tmp_path, *args) as run:
        wait_until(lambda: "\nepoch  1/50 " in run.stdout(), EXIT_SECONDS, "the first epoch")
        workers = run.descendants()  # the group, its two forked workers and the board
        assert len(workers) == 4, workers
        niceness = min(os.getpriority(os.PRIO_PROCESS, run.process.pid) + WORKER_NICENESS, 19)
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in workers] == [niceness] * 4
        run.process.kill()
        assert run.process.wait(EXIT_SECONDS) == -signal.SIGKILL
        # Well within their 300 s of retrying. (One may still say it lost the server:
        # the kernel closes the demo's sockets before it signals the demo's children.)
        wait_until(lambda: not any(map(running, workers)), 30, "the workers to end")


def test_its_numpy_workers_run_on_idle_cores_when_asked_and_its_boards_below_it(
    tmp_path: Path,
) -> None:
    """--worker-priority idle: the numpy workers' group and the workers it forks run under
    SCHED_IDLE (cli/worker_priority.py), the board at nice +5, and the banner says so."""
    from snet.cli.worker_priority import WORKER_NICENESS

    args = ("--epochs", "50", "--spert", "1", "--spert-time-scale", "50", "--worker-priority",
            "idle")  # fmt: skip
    with demo(tmp_path, *args) as run:
        # the banner, once the policy is set; the forked workers may come after it
        wait_until(lambda: "\ndashboard: " in run.stdout(), EXIT_SECONDS, "the banner")
        assert "loop, workers on idle cores, boards at nice +5\n" in run.stdout()
        wait_until(lambda: len(run.descendants()) == 4, EXIT_SECONDS, "the workers")
        workers = run.descendants()
        board = _board(run)
        assert board is not None
        numpy_workers = [pid for pid in workers if pid != board]
        threads = [int(t) for pid in numpy_workers for t in os.listdir(f"/proc/{pid}/task")]
        assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_IDLE}
        assert os.sched_getscheduler(board) == os.SCHED_OTHER
        niceness = min(os.getpriority(os.PRIO_PROCESS, run.process.pid) + WORKER_NICENESS, 19)
        assert os.getpriority(os.PRIO_PROCESS, board) == niceness
        run.process.send_signal(signal.SIGTERM)
        assert run.process.wait(EXIT_SECONDS) == 0


def test_a_worker_whose_supervisor_is_gone_before_it_starts_ends_at_once(
    tmp_path: Path,
) -> None:
    """The demo killed before the worker it started asked to end with it (the kernel's
    request made in the worker, first thing): the worker sees it has another parent."""
    gone = helpers.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
    pid = int(gone.stdout)  # a process that has ended: its pid is nobody's parent
    done = helpers.run_process(
        [sys.executable, "-m", "snet.cli", "worker", "--server", "127.0.0.1:9"],
        cwd=tmp_path, timeout=EXIT_SECONDS,
        env={**helpers.system_ring_environment(), "SNET_SUPERVISOR_PID": str(pid)},
    )  # fmt: skip
    assert done.returncode == 128 + signal.SIGTERM  # as the demo's death would have ended it
    assert done.stdout == done.stderr == ""  # it tried no server


def test_workers_a_terminals_ctrl_c_stopped_while_starting_stopped_cleanly() -> None:
    """A terminal's Ctrl-C reaches the demo's workers too: one still starting (importing,
    loading the compiled step) leaves with status 130 (cli/main.py), which is clean when
    the demo was interrupted with them, and not otherwise (the demo said exit 1)."""
    from types import SimpleNamespace

    from snet.cli.demo_workers import DemoWorkers

    def workers(*codes: int) -> DemoWorkers:
        processes = [SimpleNamespace(returncode=code, pid=100 + i) for i, code in enumerate(codes)]
        return DemoWorkers(processes, len(codes))  # type: ignore[arg-type]

    assert workers(130, 0).stopped_cleanly(interrupted=True)
    assert not workers(130, 0).stopped_cleanly()  # no Ctrl-C reached the demo: not ours
    assert not workers(1, 0).stopped_cleanly(interrupted=True)
    assert workers(0, 0).stopped_cleanly()


def test_results_it_cannot_write_are_said_and_its_workers_stopped_at_once(tmp_path: Path) -> None:
    """A demo whose server could not write its results (a full disk; here weights.npz
    becomes a directory once it trains: one there at start is refused then) ended
    "weights in out/weights.npz", a file that was not there. Its workers, told the
    failure (not "training complete") so that a restarted server finds them, are
    stopped at once, not after the time given to workers leaving by themselves."""
    with demo(tmp_path, "--epochs", "4", "--workers", "1", "--bunch-size", "512") as run:
        wait_until(lambda: "\nepoch  1/4 " in run.stdout(), EXIT_SECONDS, "the first epoch")
        (tmp_path / "out" / "weights.npz" / "taken").mkdir(parents=True)
        assert run.wait() == 1
    printed = run.stdout()
    assert "done (failed: results not written: IsADirectoryError: " in printed
    assert ", no weights written; worker process exit codes [0]" in printed
    assert "weights in out/weights.npz" not in printed
    assert "had not left" not in run.stderr()
