"""The demo's preloaded worker process (cli/preloaded_worker.py): it loads a worker's code
before the demo knows the command line, then runs the one it is given as ``snet`` would;
discarded, or left without a command, it goes without a word (real processes: the system
ring). The demo's own use of it is tested by every test that runs the demo."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from snet.cli.preloaded_worker import PreloadedWorker

import helpers

pytestmark = pytest.mark.system
EXIT_SECONDS = 60


def _started() -> PreloadedWorker:
    return PreloadedWorker.start(helpers.system_ring_environment())


def _reads_its_pipe(pid: int) -> bool:
    """Whether ``pid`` sleeps reading a pipe (its command: it has loaded)."""
    return "pipe" in Path(f"/proc/{pid}/wchan").read_text()


def test_given_a_command_it_runs_it_as_the_snet_command_would(
    capfd: pytest.CaptureFixture[str],
) -> None:
    words = ["worker", "--server", "127.0.0.1:9", "--backend", "bogus"]
    expected = helpers.run_process(
        [sys.executable, "-m", "snet.cli", *words], env=helpers.system_ring_environment()
    )
    process = _started().run(words)
    code = asyncio.run(asyncio.wait_for(process.wait(), EXIT_SECONDS))
    assert code == process.returncode == expected.returncode == 2
    out, err = capfd.readouterr()
    helpers.check_output("the preloaded worker", out + err)
    assert (out, err) == (expected.stdout, expected.stderr)
    assert err.startswith("snet: ") and "bogus" in err


def test_discarded_it_is_gone_at_once_without_a_word(capfd: pytest.CaptureFixture[str]) -> None:
    preloaded = _started()
    pid = preloaded.process.pid
    preloaded.discard()
    assert preloaded.process.returncode == -signal.SIGKILL  # reaped: nothing left running
    assert not Path(f"/proc/{pid}").exists()
    preloaded.discard()  # twice is once
    assert capfd.readouterr() == ("", "")


def test_its_pipe_closed_without_a_command_it_exits_0_without_a_word(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """As when the demo that started it died before giving it a command."""
    preloaded = _started()
    assert preloaded.process.stdin is not None
    preloaded.process.stdin.close()
    assert preloaded.process.wait(EXIT_SECONDS) == 0
    assert capfd.readouterr() == ("", "")


def test_a_terminals_ctrl_c_before_its_command_is_left_to_the_demo(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The demo acts on it (it kills a process it has not given a command yet); the
    process waits on, and runs the command it is given as the command would."""
    preloaded = _started()
    try:
        helpers.wait_until(lambda: _reads_its_pipe(preloaded.process.pid), EXIT_SECONDS, "wait")
        preloaded.process.send_signal(signal.SIGINT)
        words = ["worker", "--server", "127.0.0.1:9", "--backend", "bogus"]
        process = preloaded.run(words)
        assert asyncio.run(asyncio.wait_for(process.wait(), EXIT_SECONDS)) == 2
    finally:
        preloaded.discard()
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("snet: ") and "bogus" in err
