"""The one signal helper (cli/runtime.py): the first SIGTERM/SIGINT asks for a graceful
stop, a second one forces the exit. Run in a real child process, signalled for real."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

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


@pytest.mark.system  # starts real processes
def test_first_signal_stops_gracefully_and_second_forces_exit() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert _wait_for_line(process) == "ready"
        process.send_signal(signal.SIGTERM)
        assert _wait_for_line(process) == "stop: signal SIGTERM"
        assert process.poll() is None  # still running: the graceful stop is the caller's
        time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 1
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.system  # starts real processes
def test_the_first_signal_delivered_twice_at_once_is_not_a_second() -> None:
    """GNU ``timeout`` sends its command SIGTERM, then its own process group, which holds
    the command, the same again: a server under it exited 1 at once, nothing written."""
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert _wait_for_line(process) == "ready"
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        assert _wait_for_line(process) == "stop: signal SIGTERM"
        time.sleep(0.2)
        assert process.poll() is None  # still stopping gracefully: the same request
        time.sleep(0.5)  # past REPEAT_SECONDS: a user insisting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
