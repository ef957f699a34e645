"""`snet status --watch` (issue 18): it reads /status again until the run ends, and ends
cleanly on Ctrl-C and when its reader goes away. Real processes: signals and pipes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import QUICK_JOB, Cluster, check_output
from inprocess import Lab


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT's default in the child: a test run started in the background by a
    non-interactive shell has SIGINT ignored, its children inherit that, and Python then
    raises no KeyboardInterrupt (the watch went on through the test's Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _watch(cluster: Cluster, url: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "snet.cli",
        "status",
        "--watch",
        "--url",
        url,
        "--interval",
        "0.2",
    ]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )
    cluster.processes.append(process)  # type: ignore[arg-type]  # killed at teardown if left
    return process


@pytest.mark.system
def test_status_watch_follows_the_run_to_its_end_and_stops_cleanly(cluster: Cluster) -> None:
    # QUICK_JOB: the watch's subject is the readings and its end, not learning
    server = cluster.server("--epochs", "2", "--linger-seconds", "5", *QUICK_JOB)
    address = server.url.removeprefix("http://")  # a bare HOST:PORT is taken as http://

    # Ctrl-C: exit 0, no traceback
    interrupted = _watch(cluster, address)
    assert interrupted.stdout is not None
    waiting = "server snet (waiting_for_workers)"  # no worker has joined yet
    assert interrupted.stdout.readline().startswith(waiting)
    interrupted.send_signal(signal.SIGINT)
    out, err = interrupted.communicate(timeout=30)
    assert interrupted.returncode == 0, err
    check_output("snet status --watch (SIGINT)", out + err)

    # `snet status --watch | head -1`: the reader leaves; the watch ends quietly
    headless = _watch(cluster, address)
    assert headless.stdout is not None and headless.stderr is not None
    assert headless.stdout.readline().startswith(waiting)
    headless.stdout.close()
    assert headless.wait(timeout=30) == 0
    err = headless.stderr.read()
    check_output("snet status --watch | head -1", err)
    assert err == ""

    # until the run ends: readings one after another, plain text in a pipe
    follower = _watch(cluster, server.url)
    assert follower.stdout is not None
    first = follower.stdout.readline()  # read before any worker starts: it waits for one
    assert first.startswith(waiting)
    cluster.worker(server, "w0")
    rest, err = follower.communicate(timeout=120)
    out = first + rest
    assert follower.returncode == 0, err
    check_output("snet status --watch", out + err)
    readings = [r for r in re.split(r"(?m)^(?=server snet \()", out) if r]
    assert len(readings) >= 2
    assert readings[-1].startswith("server snet (trained)")
    assert "progress 100.0%" in readings[-1] and "epoch 2/2," in readings[-1]
    assert "\x1b" not in out and "\r" not in out


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: see tests/README.md
async def test_events_are_never_silent_long_and_end_with_the_last_state(lab: Lab) -> None:
    # documents a minute apart: a comment every 2 s between them (KEEPALIVE_SECONDS), so
    # a watch that gives up after 5 s of silence keeps following a live server
    server = await lab.server("--event-seconds", "60", *QUICK_JOB)
    session = await lab.http()
    async with session.get(server.url + "/events") as stream:

        async def line(timeout: float) -> str:
            raw = await asyncio.wait_for(stream.content.readline(), timeout)
            return raw.decode().rstrip("\n")

        assert [await line(10) for _ in range(2)] == ["retry: 2000", ""]
        assert await line(10) == "event: status"
        assert json.loads((await line(10)).removeprefix("data: "))["state"] == (
            "waiting_for_workers"
        )
        assert await line(10) == ""
        started = time.monotonic()
        assert [await line(3) for _ in range(2)] == [":", ""]  # not a document
        assert [await line(3) for _ in range(2)] == [":", ""]
        assert 2.5 < time.monotonic() - started < 6  # two comments, about 2 s apart
        server.stop("stopped")
        rest = []  # the last document, then the end of the stream
        while text := (await asyncio.wait_for(stream.content.readline(), 10)).decode():
            rest.append(text.rstrip("\n"))
    documents = [json.loads(r.removeprefix("data: ")) for r in rest if r.startswith("data: ")]
    assert [d["state"] for d in documents] == ["stopping"]
    assert await server.wait(30) == "stopped"
