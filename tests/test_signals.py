"""The one signal helper (cli/runtime.py): the first SIGTERM/SIGINT asks for a graceful
stop, a second one forces the exit. Run in a real child process, signalled for real."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from helpers import DrivenProcess

CHILD = """
import asyncio, logging
from snet.cli.runtime import install_stop_signals

async def main() -> None:
    def stop(reason: str) -> None:
        print("stop:", reason, flush=True)  # a graceful stop that never finishes
    install_stop_signals(stop, logging.getLogger("test"))
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def _wait_for_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


@contextmanager
def _child() -> Iterator[subprocess.Popen[str]]:
    """CHILD running, ready for signals; killed at the end if it is still there, and its
    output scanned for tracebacks (``DrivenProcess``)."""
    with DrivenProcess(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert _wait_for_line(process) == "ready"
        yield process


@pytest.mark.system  # starts real processes
def test_first_signal_stops_gracefully_and_second_forces_exit() -> None:
    with _child() as process:
        process.send_signal(signal.SIGTERM)
        assert _wait_for_line(process) == "stop: signal SIGTERM"
        assert process.poll() is None  # still running: the graceful stop is the caller's
        time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 1
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()


@pytest.mark.system  # starts real processes
def test_the_first_signal_delivered_twice_at_once_is_not_a_second() -> None:
    """GNU ``timeout`` sends its command SIGTERM, then its own process group, which holds
    the command, the same again: a server under it exited 1 at once, nothing written."""
    with _child() as process:
        process.send_signal(signal.SIGTERM)
        # the second once the first was heard (two sent back to back may merge into one)
        assert _wait_for_line(process) == "stop: signal SIGTERM"
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert process.poll() is None  # still stopping gracefully: the same request
        time.sleep(0.5)  # past REPEAT_SECONDS: a user insisting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 1


def test_the_rule_of_stop_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli/stop_signals.py on a clock of the test's: the first stops, the same again within
    REPEAT_SECONDS is nothing new, anything later or another signal insists."""
    import snet.cli.stop_signals as rule

    now = [100.0]
    monkeypatch.setattr(rule.time, "monotonic", lambda: now[0])
    received = rule.StopSignals()
    assert received.meaning(signal.SIGTERM) is rule.Meaning.STOP
    now[0] += rule.REPEAT_SECONDS / 2
    assert received.meaning(signal.SIGTERM) is rule.Meaning.REPEAT
    assert received.meaning(signal.SIGINT) is rule.Meaning.INSIST  # another signal
    now[0] += rule.REPEAT_SECONDS
    assert received.meaning(signal.SIGTERM) is rule.Meaning.INSIST  # a user insisting


def test_a_signal_ignored_from_the_start_stays_ignored() -> None:
    """A shell's background job starts with SIGINT ignored (so Ctrl-C reaches only the
    foreground): snet train's handlers leave it so, as Python itself does."""
    from snet.cli.stop_signals import raised_on_stop

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with raised_on_stop():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_snet_trains_handler_takes_the_first_signal_delivered_twice_as_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """snet train's handlers (``raised_on_stop``) under GNU timeout's double SIGTERM: the
    first raises ``Terminated`` (the run stops and writes its weights), the same signal
    again at once is nothing, and only a later one would exit now. Called directly, as
    the kernel would: two signals sent to this process back to back may merge into one."""
    import snet.cli.stop_signals as rule

    now = [100.0]
    monkeypatch.setattr(rule.time, "monotonic", lambda: now[0])
    exits: list[int] = []
    monkeypatch.setattr(rule.os, "_exit", exits.append)
    with rule.raised_on_stop():
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with pytest.raises(rule.Terminated):
            handler(signal.SIGTERM, None)
        now[0] += rule.REPEAT_SECONDS / 2
        handler(signal.SIGTERM, None)  # GNU timeout's second: neither raises nor exits
        assert exits == []
        now[0] += rule.REPEAT_SECONDS
        handler(signal.SIGTERM, None)  # a user insisting
        assert exits == [1]
