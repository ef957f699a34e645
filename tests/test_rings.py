"""The test harness itself: the fast ring's loop fails on unhandled errors, the lab's and
the system ring's logs are scanned for tracebacks, and no test starts a process but
through helpers.py, which scans the output of every process it starts."""

from __future__ import annotations

import ast
import asyncio
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Cluster, DrivenProcess, run_process, wait_until
from inprocess import PROCESS, Lab
from loop_guard import LOOPS, run_guarded
from output_checks import check_output

TRACEBACK = "Traceback (most recent call last):\n  File 'x', line 1\n"


async def _lose_a_task_exception() -> None:
    async def fail() -> None:
        raise RuntimeError("nobody looks at this")

    task = asyncio.get_running_loop().create_task(fail())
    await asyncio.sleep(0.01)
    del task  # never awaited: its exception is lost when it is collected


async def _fail_in_a_callback() -> None:
    def fail() -> None:
        raise RuntimeError("a callback failed")

    asyncio.get_running_loop().call_soon(fail)
    await asyncio.sleep(0.01)


async def _leave_a_failing_task() -> None:
    async def fail_when_cancelled() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("failed on its way out") from None

    asyncio.get_running_loop().create_task(fail_when_cancelled())
    await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_lost_task_exception_fails_the_test(kind: str) -> None:
    with pytest.raises(AssertionError, match="Task exception was never retrieved") as failure:
        run_guarded(kind, _lose_a_task_exception)
    assert "nobody looks at this" in str(failure.value)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_failed_callback_and_a_task_failing_at_the_end_fail_the_test(kind: str) -> None:
    with pytest.raises(AssertionError, match="a callback failed"):
        run_guarded(kind, _fail_in_a_callback)
    with pytest.raises(AssertionError, match="failed on its way out"):
        run_guarded(kind, _leave_a_failing_task)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_clean_run_gives_its_result_and_a_test_failure_keeps_its_own_error(kind: str) -> None:
    async def answer() -> int:
        return 42

    assert run_guarded(kind, answer) == 42

    async def fail_twice() -> None:
        await _lose_a_task_exception()
        raise KeyError("the test's own")

    with pytest.raises(KeyError, match="the test's own") as failure:
        run_guarded(kind, fail_twice)
    assert "nobody looks at this" in "".join(failure.value.__notes__)


class _Alarm(BaseException):
    """Stands in for pytest-timeout's alarm, which is not an ``Exception`` either."""


@pytest.mark.parametrize("kind", LOOPS)
def test_an_alarm_in_a_callback_ends_the_test_and_so_does_the_deadline(kind: str) -> None:
    async def ring_in_a_callback() -> None:
        def ring() -> None:
            raise _Alarm("time is up")

        asyncio.get_running_loop().call_soon(ring)
        await asyncio.sleep(60)

    with pytest.raises(_Alarm, match="time is up"):
        run_guarded(kind, ring_in_a_callback)

    async def sleep() -> None:
        await asyncio.sleep(60)

    with pytest.raises(AssertionError, match=r"did not end within 0\.05 s"):
        run_guarded(kind, sleep, deadline=0.05)


def test_a_traceback_in_a_processes_output_fails_unless_expected() -> None:
    text = "starting\n" + TRACEBACK + "ValueError: boom\n"
    with pytest.raises(AssertionError, match="ValueError: boom"):
        check_output("server", text)
    check_output("server", text, expected="the test makes it fail on purpose")
    with pytest.raises(AssertionError, match="never retrieved"):
        check_output("w0", "Task exception was never retrieved\nfuture: <Task ...>")
    check_output("w0", "INFO joined snet\n")


def test_a_logged_traceback_in_the_lab_fails_unless_expected(tmp_path: Path) -> None:
    lab = Lab(tmp_path, "asyncio")
    lab._start_logging()
    try:
        token = PROCESS.set("w0")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("snet.worker").exception("compute failed")
        finally:
            PROCESS.reset(token)
    finally:
        lab._stop_logging()
    assert "compute failed" in lab.log("w0") and lab.log("server") == ""
    with pytest.raises(AssertionError, match=r"w0:(.|\n)*ValueError: boom"):
        lab.check_logs()
    lab.expect_traceback("w0", "the test logs one on purpose")
    lab.check_logs()


def test_the_clusters_teardown_scans_every_processes_log(tmp_path: Path) -> None:
    """What ``Cluster.close`` reads: the log of each process it started (here two logs
    written by hand stand in for them)."""
    cluster = Cluster(tmp_path)
    for name, text in (("server", "INFO serving\n"), ("w0", TRACEBACK + "ValueError: w0\n")):
        (tmp_path / f"{name}.log").write_text(text)
        cluster.logs.append(tmp_path / f"{name}.log")
    with pytest.raises(AssertionError, match=r"w0(.|\n)*ValueError: w0") as failure:
        cluster.close()
    assert "server" not in str(failure.value)
    cluster.expect_traceback("w0", "the test writes one on purpose")
    cluster.close()


@pytest.mark.system  # starts real processes
def test_a_traceback_in_a_finished_commands_output_fails_the_test(tmp_path: Path) -> None:
    fail = [sys.executable, "-c", "print('starting', flush=True); raise ValueError('boom')"]
    with pytest.raises(AssertionError, match=r"Traceback \(most recent(.|\n)*ValueError: boom"):
        run_process(fail)
    with pytest.raises(AssertionError, match="ValueError: boom"):  # before check's exit status
        run_process(fail, check=True)
    with pytest.raises(AssertionError, match="ValueError: boom"):  # stdout sent elsewhere
        run_process(fail, stdout=subprocess.DEVNULL)
    done = run_process(fail, expect_traceback="the test makes it fail on purpose")
    assert done.returncode == 1 and done.stdout == "starting\n"


CHILD = """
import os, sys, time, traceback
try:
    raise ValueError("boom")
except ValueError:
    traceback.print_exc()
sys.stderr.close()
os.close(2)  # its traceback all written: a reader of stderr sees its end
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.system  # starts real processes
def test_a_traceback_in_a_driven_processes_output_fails_the_test_when_it_stops(
    tmp_path: Path,
) -> None:
    """Whether the test left the traceback unread in a pipe, read it itself, or sent it
    to a file: the process is killed when the block ends, then its output scanned."""
    argv = [sys.executable, "-c", CHILD]
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    unread = pytest.raises(AssertionError, match=r"Traceback \(most recent(.|\n)*ValueError: boom")
    with unread as failure, DrivenProcess(argv, **pipes) as process:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    assert str(failure.value).startswith(f"traceback in the output of {sys.executable} -c")
    assert process.returncode == -signal.SIGKILL  # killed: it would have slept a minute

    read = pytest.raises(AssertionError, match="ValueError: boom")
    with read, DrivenProcess(argv, **pipes) as process:
        assert process.stderr is not None and "ValueError: boom" in process.stderr.read()

    log = tmp_path / "child.log"
    logged = pytest.raises(AssertionError, match="ValueError: boom")
    with (
        log.open("wb") as handle,
        logged,
        DrivenProcess(argv, stdout=handle, stderr=subprocess.STDOUT, logs=[log]),
    ):
        wait_until(lambda: "ready" in log.read_text(), 30, "the child's line")

    with DrivenProcess(argv, **pipes, expect_traceback="it prints one on purpose") as process:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    with DrivenProcess([sys.executable, "-c", "print('fine')"], **pipes) as process:
        assert process.communicate(timeout=30) == ("fine\n", "")


# Test modules that may start a process themselves, each with its reason: every other one
# starts processes through helpers.py, whose run_process, DrivenProcess and Cluster scan
# the output of what they start for tracebacks (issue 13).
RAW_PROCESSES_ALLOWED = {
    "helpers.py": "where processes start: what it starts has its output scanned",
}
# What starts a process: (module, function); ``os.spawn*``, ``os.exec*`` too.
PROCESS_STARTERS = {
    *(("subprocess", name) for name in ("run", "Popen", "call", "check_call", "check_output")),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("asyncio", "create_subprocess_exec"),
    ("asyncio", "create_subprocess_shell"),
    ("asyncio.subprocess", "create_subprocess_exec"),
    ("asyncio.subprocess", "create_subprocess_shell"),
    ("os", "system"),
    ("os", "popen"),
    ("os", "fork"),
    ("os", "forkpty"),
    ("os", "posix_spawn"),
    ("os", "posix_spawnp"),
    ("pty", "spawn"),
    ("pty", "fork"),
}
LOOP_STARTERS = {"subprocess_exec", "subprocess_shell"}  # loop.subprocess_exec(...)


def _starts(module: str, name: str) -> bool:
    return (module, name) in PROCESS_STARTERS or (
        module == "os" and name.startswith(("spawn", "exec"))
    )


def processes_started(source: str) -> list[str]:
    """Where ``source`` (a module's text) starts a process itself: "line: what" each,
    calls and subclasses of ``subprocess.Popen`` alike, however it was imported."""
    tree = ast.parse(source)
    known: dict[str, str] = {}  # a name in the module -> the dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                known[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                known[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return known.get(node.id)
        if isinstance(node, ast.Attribute):
            head = dotted(node.value)
            return None if head is None else f"{head}.{node.attr}"
        return None

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Call):
            targets.append(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr in LOOP_STARTERS:
                found.append((node.lineno, f".{node.func.attr}()"))
        elif isinstance(node, ast.ClassDef):
            targets.extend(node.bases)
        for target in targets:
            name = dotted(target)
            if name is not None:
                module, _, function = name.rpartition(".")
                if _starts(module, function):
                    found.append((node.lineno, name))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_processes_start_only_through_the_helpers_that_scan_their_output() -> None:
    """Every process a test starts has its output scanned for tracebacks when it stops:
    no test module starts one with subprocess, asyncio or os itself (issue 13)."""
    tests = Path(__file__).resolve().parent
    offences, starters = [], set()
    for module in sorted(tests.glob("*.py")):
        if found := processes_started(module.read_text()):
            starters.add(module.name)
            if module.name not in RAW_PROCESSES_ALLOWED:
                offences += [f"tests/{module.name}:{where}" for where in found]
    assert not offences, (
        "start these through helpers.py (run_process, DrivenProcess, Cluster), which scan "
        "what the process wrote for tracebacks:\n" + "\n".join(offences)
    )
    assert starters == set(RAW_PROCESSES_ALLOWED)  # an allowance that is no longer needed


def test_the_rule_finds_a_process_started_however_it_is_written() -> None:
    source = """
import asyncio, os, subprocess
import subprocess as sp
from subprocess import Popen as Started, check_output
from asyncio import create_subprocess_exec

subprocess.run(["snet", "status"])
sp.call(["snet"])
Started(["snet"])
check_output(["snet"])
create_subprocess_exec("snet")
asyncio.create_subprocess_shell("snet")
os.system("snet")
os.execv("snet", ["snet"])
loop.subprocess_exec(factory, "snet")

class Mine(subprocess.Popen):
    pass

process: subprocess.Popen[str]  # a type is no start
subprocess.PIPE, subprocess.Popen._execute_child
run(["not subprocess's"])
"""
    assert processes_started(source) == [
        "7: subprocess.run",
        "8: subprocess.call",
        "9: subprocess.Popen",
        "10: subprocess.check_output",
        "11: asyncio.create_subprocess_exec",
        "12: asyncio.create_subprocess_shell",
        "13: os.system",
        "14: os.execv",
        "15: .subprocess_exec()",
        "17: subprocess.Popen",
    ]
