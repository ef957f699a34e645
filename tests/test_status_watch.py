"""`snet status --watch` (issue 18): it reads /status again until the run ends, and ends
cleanly on Ctrl-C and when its reader goes away. Real processes: signals and pipes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time

import pytest

from helpers import QUICK_JOB, Cluster
from inprocess import Lab
from output_checks import check_output


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT's default in the child: a test run started in the background by a
    non-interactive shell has SIGINT ignored, its children inherit that, and Python then
    raises no KeyboardInterrupt (the watch went on through the test's Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _watch(cluster: Cluster, url: str) -> subprocess.Popen[str]:
    """``snet status --watch``: killed at teardown if left, its output scanned."""
    return cluster.drive(
        *("status", "--watch", "--url", url, "--interval", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )


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


def _readings(out: str) -> list[str]:
    return [r for r in re.split(r"(?m)^(?=server snet \()", out) if r]


@pytest.mark.system
def test_status_watch_sees_the_end_of_a_run_whose_server_exits_at_once(cluster: Cluster) -> None:
    # --linger-seconds 0 (the default): the server exits as soon as its results are
    # written, usually before a watch's next reading of /status; the watch follows
    # /events, whose last document the server sends before it closes
    server = cluster.server("--epochs", "1", *QUICK_JOB)
    follower = _watch(cluster, server.url)
    assert follower.stdout is not None
    assert follower.stdout.readline().startswith("server snet (waiting_for_workers)")
    cluster.worker(server, "w0")
    rest, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert err == ""
    check_output("snet status --watch (linger 0)", rest)
    last = _readings(rest)[-1]
    assert last.startswith(("server snet (stopping)", "server snet (trained)")), last
    assert "progress 100.0%" in last and "epoch 1/1," in last
    assert server.wait(30) == 0


@pytest.mark.system
def test_status_watch_of_a_server_killed_mid_run_ends_with_status_1(cluster: Cluster) -> None:
    server = cluster.server("--epochs", "200", *QUICK_JOB)
    # the URL of the status page, as `snet demo` prints it, names the server as well
    follower = _watch(cluster, server.url + "/status/")
    assert follower.stdout is not None
    cluster.worker(server, "w0")
    for _ in range(10_000):  # a reading every 0.2-0.5 s; "" if the watch ended
        line = follower.stdout.readline()
        assert line, "the watch ended before the run trained"
        if line.startswith("server snet (training)"):
            break
    server.process.send_signal(signal.SIGKILL)
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 1, err
    check_output("snet status --watch (server killed)", out + err)
    assert err.startswith("snet: the server stopped answering (")
    assert err.rstrip().endswith("; last state training")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: see tests/README.md
async def test_events_are_never_silent_long_and_end_with_the_last_state(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    # documents a minute apart: a comment every KEEPALIVE_SECONDS between them (2 s; a
    # tenth of that here, where its waits would be the fast ring's longest), so a watch
    # that gives up after 5 s of silence keeps following a live server
    import snet.server.http

    keepalive = 0.2
    monkeypatch.setattr(snet.server.http, "KEEPALIVE_SECONDS", keepalive)
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
        assert time.monotonic() - started >= 1.5 * keepalive  # paced, not a flood
        server.stop("stopped")
        rest = []  # the last document, then the end of the stream
        while text := (await asyncio.wait_for(stream.content.readline(), 10)).decode():
            rest.append(text.rstrip("\n"))
    documents = [json.loads(r.removeprefix("data: ")) for r in rest if r.startswith("data: ")]
    assert [d["state"] for d in documents] == ["stopping"]
    assert await server.wait(30) == "stopped"
