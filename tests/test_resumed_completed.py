"""What a completed run leaves where a kill can catch it. A server killed between its
last checkpoint and telling its workers that training is complete resumes a completed
run. It exited 5 ms after resuming (a probe), so the
workers, retrying, were never told: they waited out their retry window and exited 3, and
their systemd units restarted them for ever. Now it serves a while for them."""

from __future__ import annotations

import asyncio

import pytest

from snet.server.config import RESUMED_LINGER_SECONDS, ServerConfig

from inprocess import Lab
from inprocess import wait_until as wait_in_lab
from short_data import short_job, tiny_data


def test_a_completed_run_resumed_is_served_long_enough_for_retrying_workers() -> None:
    assert ServerConfig().linger_after(False) == 0  # the default: gone once trained
    assert ServerConfig().linger_after(True) == RESUMED_LINGER_SECONDS
    assert RESUMED_LINGER_SECONDS > 2 * 5.0  # two of a retrying worker's longest pauses
    assert ServerConfig(linger_seconds=60).linger_after(True) == 60  # longer, if asked
    assert ServerConfig(linger_seconds=-1).linger_after(True) == -1  # until stopped


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_resumed_completed_run_tells_the_workers_that_come_back(lab: Lab) -> None:
    job = ("--mode", "async", "--epochs", "1", *short_job())
    first = await lab.server(*job)
    workers = [lab.worker(first, f"w{i}") for i in range(2)]
    assert await first.wait(60) == "trained"  # --linger-seconds 0: gone at once
    assert [await worker.wait(30) for worker in workers] == [0, 0]
    again = await lab.server(*job, name="server")  # its out-dir: as a restart after a kill
    await asyncio.sleep(0.5)
    assert not again.task.done() and (await again.status())["state"] == "trained"
    said = f"workers that come back are told so for {RESUMED_LINGER_SECONDS:g} s"
    assert said in lab.log("server")
    late = lab.worker(again, "late")
    assert await late.wait(30) == 0
    assert "training complete" in lab.log("late")
    again.stop("signal SIGTERM")
    assert await again.wait(30) == "trained"
    assert again.final_status()["stop_reason"] == "trained"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_the_test_files_score_reaches_status_json_while_the_results_are_served(
    lab: Lab,
) -> None:
    """status.json is written as training completes, before the test file is scored: the
    score reached it only at a graceful stop, so a kill while serving the results (the
    Kubernetes manifest's --linger-seconds=-1) lost it for good (a probe)."""
    test = tiny_data()  # (of the training data: its score is the subject, not its value)
    server = await lab.server("--epochs", "1", *short_job(), "--test-data", str(test),
                              "--linger-seconds", "-1")  # fmt: skip
    worker = lab.worker(server, "w1")
    assert await worker.wait(60) == 0

    async def scored() -> object:
        return (await server.status())["test"]

    said = await wait_in_lab(scored, 30, "the test file scored")
    on_disk = server.final_status()  # before any stop: as a kill would leave it
    assert on_disk["test"] == said and said["data"] == test
    assert (on_disk["state"], on_disk["stop_reason"]) == ("trained", "trained")
    server.stop("signal SIGTERM")
    assert await server.wait(30) == "trained"
    assert server.final_status()["test"] == said
