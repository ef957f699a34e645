"""``--verify-cv`` (issue 12): two workers score each epoch's CV set and must agree; the
server scores it itself when they do not, or when only one worker is there. In process:
a real server and real workers, and a hand-driven peer that forges its CV results."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from snet.protocol.messages import EvalResult, Evaluate

from async_raw import AsyncRawClient
from inprocess import Lab, LabServer
from inprocess import wait_until as wait_in_lab
from short_data import short_job

pytestmark = pytest.mark.parametrize("lab", ["uvloop"], indirect=True)


def verified_async_job() -> tuple[str, ...]:
    """Two epochs checked by two workers, on a third of the data: the subject is the
    checks, each epoch's, not what the net learns."""
    return ("--mode", "async", "--epochs", "2", "--verify-cv", "--min-workers", "2",
            "--linger-seconds", "30", *short_job())  # fmt: skip


async def _trained(server: LabServer) -> dict[str, Any]:
    async def done() -> bool:
        return bool((await server.status())["state"] == "trained")

    await wait_in_lab(done, 90, "training to finish")
    return await server.status()


async def test_two_honest_workers_agree_on_every_epoch(lab: Lab) -> None:
    server = await lab.server(*verified_async_job())
    for name in ("w1", "w2"):
        lab.worker(server, name)
    status = await _trained(server)
    checks = status["cv_checks"]
    assert checks["scorers"] == 2 and checks["refused"] == 0
    assert checks["agreed"] + checks["refereed"] == 2  # a worker may have left at the end
    assert all(epoch["cv_accuracy"] is not None for epoch in status["epochs"])


async def test_alone_a_worker_is_checked_by_the_server_which_agrees_with_it(lab: Lab) -> None:
    """One worker: no second opinion, so the server scores each epoch itself; its float64
    forward pass agrees with the worker's (nothing refused), and training runs its course."""
    server = await lab.server("--mode", "sync", "--epochs", "2", "--verify-cv",
                              "--linger-seconds", "30", *short_job())  # fmt: skip
    lab.worker(server, "w1")
    status = await _trained(server)
    assert status["cv_checks"] == {"scorers": 2, "agreed": 0, "refereed": 2, "refused": 0}
    assert "the server scores the CV set itself" in lab.log("server")


async def test_in_np_mode_the_server_scores_every_epoch_and_the_run_ends(lab: Lab) -> None:
    """np mode and --verify-cv: the server scores every epoch itself; the second copy it
    asked for found no scorer, and the run waited for it forever after its first epoch."""
    server = await lab.server("--mode", "np", "--epochs", "2", "--verify-cv", "--min-workers",
                              "2", "--linger-seconds", "30", *short_job())  # fmt: skip
    for name in ("w1", "w2"):
        lab.worker(server, name)
    status = await _trained(server)
    assert status["cv_checks"]["scorers"] == 1
    assert all(epoch["cv_accuracy"] is not None for epoch in status["epochs"])


async def test_a_forged_cv_result_is_refused_and_the_servers_score_kept(lab: Lab) -> None:
    # The forger takes a lease and never delivers it: the epoch ends once it is late.
    server = await lab.server(*verified_async_job(), "--stall-seconds", "0.5")
    forger = await AsyncRawClient.connect(server.port, "forger")
    await forger.handshake()
    lab.worker(server, "honest")
    forged = 0

    async def forge() -> None:
        nonlocal forged
        while True:
            asked: Evaluate = await forger.receive(Evaluate, timeout=120)
            frames = len(server.server.coordinator.plan.cv_frames)
            await forger.send(EvalResult(asked.version, asked.epoch, frames, frames, 0.0))
            forged += 1

    forging = asyncio.get_running_loop().create_task(forge())
    try:
        status = await _trained(server)
    finally:
        forging.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await forging
    assert forged >= 1
    assert status["cv_checks"]["refused"] == forged
    for epoch in status["epochs"]:
        assert epoch["cv_accuracy"] is not None and epoch["cv_accuracy"] < 1.0  # not 100 %
    assert "differs from the server's" in lab.log("server")
    await forger.close()
