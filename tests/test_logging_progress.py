"""Logs that mean something (issue 18): DEBUG lines per step, lease and update; workers'
periodic progress lines; ``--log-format json`` (one JSON object per line)."""

from __future__ import annotations

import json
import logging
import re
import signal
import sys

import pytest

from snet.cli.logformat import JsonFormatter
from snet.client.progress_log import ProgressLog

import helpers
from helpers import SMALL_JOB, Cluster
from inprocess import Lab, wait_until
from short_data import short_job
from slow_backend import Slow


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_debug_shows_steps_leases_and_updates_and_info_does_not(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    # The line is due after 0.5 s and written at the worker's next look (every second, or
    # every heartbeat if sooner): look every 0.25 s, so that it comes at 0.5 s, not 1 s.
    lab.worker(
        server,
        "quiet",
        "--progress-seconds",
        "0.5",
        "--heartbeat-seconds",
        "0.25",
        backend=Slow(0.005),
    )  # the line is the test, not the bunches: 5 ms each
    line = re.compile(
        r"INFO +snet.worker: progress: \d+ updates in the last \d+ s \(\d+ in all\), \d+ "
        r"patterns, \d+ patterns/s, weights \d+\.\d\d versions behind on average \(max \d+\)"
    )
    await wait_until(lambda: line.search(lab.log("quiet")), 30, "a worker's progress line")
    server.stop("test over")
    assert await server.wait(30) == "test over"
    for name in ("server", "quiet"):  # at info: no per-step, per-lease or per-update line
        assert not re.search(r"(step|lease|update) \d+:", lab.log(name)), lab.log(name)

    again = await lab.server("--mode", "async", "--epochs", "1", *short_job(), name="again")
    logging.getLogger("snet").setLevel(logging.DEBUG)  # what --log-level debug sets
    talkative = lab.worker(again, "talkative")
    assert await talkative.wait(60) == 0 and await again.wait(30) == "trained"
    log = lab.log("again")
    assert re.search(r"DEBUG +snet.server: lease 1: \d+ frames of epoch 1 to worker talkative", log)
    assert re.search(r"DEBUG +snet.server: step 1: 1 updates, \d+ patterns, [\d.]+ ms", log)
    worker_log = lab.log("talkative")
    assert re.search(r"DEBUG +snet.worker: lease 1: \d+ frames of epoch 1", worker_log)
    assert re.search(
        r"DEBUG +snet.worker: update 1: lease \d+ at frame 0, \d+ patterns on weights 0 "
        r"\(0 behind\), [\d.]+ ms", worker_log
    )  # fmt: skip


def test_the_progress_line_counts_since_the_last_and_says_when_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "snet.worker")
    progress = ProgressLog(every_seconds=10.0, since=0.0)
    progress.update_sent(1, 0, 64, base=3, newest=5, seconds=0.01)
    progress.update_sent(1, 64, 64, base=5, newest=5, seconds=0.01)
    progress.tick(5.0)  # too early: nothing
    assert caplog.records == []
    progress.tick(10.0)
    progress.tick(25.0)
    first, idle = caplog.records
    assert first.getMessage() == (
        "progress: 2 updates in the last 10 s (2 in all), 128 patterns, 13 patterns/s, "
        "weights 1.00 versions behind on average (max 2)"
    )
    assert (first.updates_sent, first.patterns, first.weights_behind_max) == (2, 128, 2)  # type: ignore[attr-defined]
    assert idle.getMessage() == (
        "progress: no update in the last 15 s (2 in all): waiting for frames, weights or the server"
    )
    ProgressLog(every_seconds=0.0, since=0.0).tick(1e9)  # 0: never
    assert len(caplog.records) == 2


def test_a_json_log_line_has_time_level_logger_message_and_fields() -> None:
    record = logging.LogRecord("snet.server", logging.INFO, "x.py", 1, "epoch %d done", (3,), None)
    record.epoch = 3
    line = json.loads(JsonFormatter().format(record))
    assert set(line) == {"time", "level", "logger", "message", "epoch"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert (line["level"], line["logger"], line["message"], line["epoch"]) == (
        "info", "snet.server", "epoch 3 done", 3,
    )  # fmt: skip
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        failed = logging.LogRecord("snet", logging.ERROR, "x.py", 1, "oops", (), sys.exc_info())
    text = JsonFormatter().format(failed)
    assert "\n" not in text and "ValueError: bad" in json.loads(text)["exception"]


@pytest.mark.system
def test_server_and_worker_log_json_lines(cluster: Cluster) -> None:
    """`snet server --log-format json` and `snet worker --log-format json`: every line of
    their logs is one JSON object, the epoch lines with their fields."""
    server = cluster.server("--epochs", "200", "--log-format", "json", *SMALL_JOB)
    worker = cluster.worker(server, "w0", "--log-format", "json", "--progress-seconds", "0.5")
    helpers.wait_until(
        lambda: '"progress: ' in cluster.log("w0") and '"epoch 1 done' in cluster.log("server"),
        60,
        "an epoch's end and a progress line",
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    for name in ("server", "w0"):
        lines = [json.loads(line) for line in cluster.log(name).splitlines()]
        assert lines and all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    done = [d for d in map(json.loads, cluster.log("server").splitlines())
            if d["message"].startswith("epoch 1 done")]  # fmt: skip
    assert len(done) == 1 and done[0]["epoch"] == 1 and 0 < done[0]["train_accuracy"] < 1
    progress = [d for d in map(json.loads, cluster.log("w0").splitlines())
                if d["message"].startswith("progress: ")]  # fmt: skip
    assert progress and all(d["updates_sent"] > 0 for d in progress)
