"""The test harness itself: the fast ring's loop fails on unhandled errors, the lab's and
the system ring's logs are scanned for tracebacks."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from helpers import Cluster, check_output
from inprocess import PROCESS, Lab
from loop_guard import LOOPS, run_guarded

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
