"""How the demo chooses its workers' priority (cli/worker_priority.py): ``auto`` is the
idle policy only while the machine's other processes leave it to the demo, read from
/proc; the policy reaches every thread of a process and of those it forked; a bad choice
is one line and exit 2. (The demo's own worker processes: tests/test_demo_stops.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from snet.cli import worker_priority
from snet.cli.main import main
from snet.cli.worker_priority import OTHERS_BUSY_LIMIT, OthersLoad, chosen_priority
from snet.transport import cpu_time

import helpers


class FixedLoad(OthersLoad):
    def __init__(self, cores: float | None) -> None:
        super().__init__()
        self._cores = cores

    def cores(self, restart: bool = False) -> float | None:
        return self._cores


@pytest.mark.parametrize(
    ("asked", "others", "chosen"),
    [
        ("idle", 3.0, "idle"),  # as asked, however busy
        ("low", 0.0, "low"),
        ("auto", 0.0, "idle"),
        ("auto", OTHERS_BUSY_LIMIT * 0.9, "idle"),
        ("auto", OTHERS_BUSY_LIMIT, "low"),
        ("auto", 1.5, "low"),
        ("auto", None, "low"),  # cannot tell (no /proc, too soon): as before
    ],
)
def test_auto_is_idle_only_while_other_processes_leave_the_cores_alone(
    asked: str, others: float | None, chosen: str
) -> None:
    assert chosen_priority(asked, FixedLoad(others)) == chosen


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, float]]:
    """The machine's busy ticks, the demo's processes' ticks and the clock, as set."""
    now = {"busy": 1000, "ours": 300, "at": 50.0}
    monkeypatch.setattr(cpu_time, "busy_ticks", lambda: int(now["busy"]))
    monkeypatch.setattr(cpu_time, "process_ticks", lambda pid: int(now["ours"]))
    monkeypatch.setattr(cpu_time, "descendants", lambda pid: [pid, pid + 1])
    monkeypatch.setattr(worker_priority.time, "monotonic", lambda: now["at"])
    yield now


def test_the_others_load_is_the_machines_work_less_the_demos_own(ticks: dict[str, float]) -> None:
    load = OthersLoad()  # this process and one below it, as the fixture has them
    hz = os.sysconf("SC_CLK_TCK")
    ticks["at"] += 0.5
    ticks["busy"] += hz * 0.8  # 0.8 cores' worth in half a second, 0.6 of them ours
    ticks["ours"] += hz * 0.6 / 2  # two processes, each read as this
    assert load.cores() == pytest.approx(0.4, abs=2 / hz)
    ticks["at"] += 0.5  # since the start: 1 s, nothing more done
    assert load.cores(restart=True) == pytest.approx(0.2, abs=2 / hz)
    ticks["at"] += 0.5  # from the restart on: half a second, a whole core of others'
    ticks["busy"] += hz * 0.5
    assert load.cores() == pytest.approx(1.0, abs=2 / hz)


def test_too_short_a_time_or_a_process_gone_says_nothing(
    ticks: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    load = OthersLoad()
    ticks["at"] += worker_priority.MIN_SAMPLE_SECONDS / 2
    ticks["busy"] += 500
    assert load.cores() is None
    ticks["at"] += 1.0
    assert load.cores() is not None
    monkeypatch.setattr(cpu_time, "process_ticks", lambda pid: None)
    assert load.cores() is None


def test_the_proc_readings_and_a_process_that_is_gone() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    end = time.process_time() + 0.05
    while time.process_time() < end:  # some CPU of its own to read
        pass
    own, times = cpu_time.process_ticks(os.getpid()), os.times()
    assert own is not None and abs(own - sum(times[:4]) * hz) <= 2  # utime stime cutime cstime
    mine = cpu_time.own_cpu_seconds(os.getpid())
    assert mine is not None and abs(mine - sum(times[:2])) <= 2 / hz
    tree = cpu_time.tree_cpu_seconds(os.getpid())
    assert tree is not None and tree >= (own - 2) / hz
    busy = cpu_time.busy_ticks()
    assert busy is not None and busy >= own
    assert cpu_time.process_ticks(2**22 + 1) is None  # above any pid_max
    assert cpu_time.tree_cpu_seconds(2**22 + 1) is None
    assert not worker_priority.run_when_idle(2**22 + 1)


# A process that starts a thread and forks a child that starts one, then waits: what the
# demo's numpy workers' process does once it has its command (threads, forked workers).
FAMILY = """
import os, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.system
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_the_idle_policy_reaches_every_thread_of_a_process_and_of_its_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = [sys.executable, "-c", FAMILY]
    family = helpers.DrivenProcess(argv, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)  # fmt: skip
    with family, contextlib.ExitStack() as cleanup:
        cleanup.callback(os.killpg, family.pid, signal.SIGKILL)  # its forked child too
        assert family.stdout is not None and family.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while len(worker_priority._threads_below(family.pid)) < 4:  # 2 processes, 2 each
            assert time.monotonic() < deadline, worker_priority._threads_below(family.pid)
            time.sleep(0.01)
        assert worker_priority.run_when_idle(family.pid)
        threads = worker_priority._threads_below(family.pid)
        assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_IDLE}
        assert len(cpu_time.descendants(family.pid)) == 2
        # a kernel without /proc/PID/task/TID/children: the child found by its parent
        read = cpu_time._read

        def without_children_files(path: str) -> str:
            if path.endswith("/children"):
                raise FileNotFoundError(path)
            return read(path)

        monkeypatch.setattr(cpu_time, "_read", without_children_files)
        assert len(cpu_time.descendants(family.pid)) == 2


def test_a_bad_choice_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["demo", "--worker-priority", "nice"]) == 2
    said = capsys.readouterr().err
    assert said == (
        "snet: --worker-priority (or SNET_DEMO_WORKER_PRIORITY) must be one of auto, idle, "
        "low, got 'nice'\n"
    )
    monkeypatch.setenv("SNET_DEMO_WORKER_PRIORITY", "fast")
    assert main(["demo"]) == 2
    assert "got 'fast'" in capsys.readouterr().err
    # idle is the numpy workers': refused for boards alone, not silently dropped
    monkeypatch.setenv("SNET_DEMO_WORKER_PRIORITY", "idle")
    assert main(["demo", "--workers", "0", "--spert", "1"]) == 2
    assert capsys.readouterr().err == (
        "snet: --worker-priority (or SNET_DEMO_WORKER_PRIORITY) idle is for numpy workers, and "
        "there are none (--workers 0): boards run at nice +5\n"
    )


def test_workers_on_idle_cores_while_others_hold_the_cores_are_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stranger's quiet demo got busy after it started: its idle-policy workers crawled,
    an epoch of 1 s took 14, and nothing said why."""
    from snet.cli.demo_workers import BUSY_HINT_SECONDS, BusyHint

    cores = os.cpu_count() or 1
    others = iter([0.2 * cores, 0.9 * cores, 0.9 * cores])  # a quiet window, then busy ones

    class Windows(OthersLoad):  # each cores(restart=True) ends one window, starts the next
        @property
        def seconds(self) -> float:
            return BUSY_HINT_SECONDS

        def cores(self, restart: bool = False) -> float | None:
            assert restart
            return next(others)

    BusyHint(False, Windows).look()  # at nice +5: nothing to say, nothing measured
    hint = BusyHint(True, Windows)
    hint.look()  # the quiet window
    assert capsys.readouterr().err == ""
    hint.look()  # a busy one: said
    hint.look()  # and not again
    said = capsys.readouterr().err
    assert said.count("\n") == 1, said
    assert said.startswith(f"snet demo: other processes have kept {0.9 * cores:.1f} cores busy")
    assert "--worker-priority low" in said


def test_an_idle_policy_the_system_refuses_leaves_the_workers_at_nice_and_is_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Asked for, a refused SCHED_IDLE is said (the banner then says nice +5); chosen by
    auto, it is not (auto promised nothing)."""
    import asyncio

    from snet.cli.demo_workers import DemoWorkers

    gone = 2**22 + 1  # above any pid_max: sched_setscheduler fails as on a refusing system
    for asked, said in (("idle", True), ("auto", False)):
        workers = DemoWorkers([], 1, group=gone)
        asyncio.run(workers.settle_priority(asked, FixedLoad(0.0)))
        assert workers.priority == "low"
        refused = "refused its workers the idle policy (SCHED_IDLE): they run at nice +5"
        assert (refused in capsys.readouterr().err) is said
