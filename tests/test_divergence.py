"""A job that diverges stops, saying so, rather than refusing its updates for ever
(server/divergence.py); a peer whose updates are all refused stops nobody's run."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from snet.protocol.messages import Lease, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.divergence import DivergenceWatch

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, wait_until
from short_data import short_data
from user_errors import error

DIVERGING = ["--activation", "relu", "--learning-rates", "20", "--momentum", "0.9"]
LAYOUT_64 = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))  # SMALL_JOB's


async def test_a_diverging_job_stops_with_why_and_keeps_its_run(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "3", *SMALL_JOB, *DIVERGING,
                              "--data", short_data())  # fmt: skip
    workers = [lab.worker(server, f"w{i}") for i in range(2)]
    reason = await server.wait(60)
    assert reason.startswith("training diverged: the last 100 updates, from every worker (")
    assert "w0 from 127.0.0.1" in reason and "w1 from 127.0.0.1" in reason  # who sent them
    assert "were refused and none applied to version " in reason
    assert "a lower learning rate, started over with --fresh, may train" in reason
    assert "ERROR" in lab.log("server") and "training diverged" in lab.log("server")
    status = server.final_status()
    assert status["stop_reason"] == reason and status["epochs_done"] == 0
    assert list((server.out_dir / "checkpoints").glob("ckpt-*")), "the run was not kept"
    with np.load(server.out_dir / "weights.npz") as weights:  # the last that were applied
        assert int(weights["version"]) == status["weight_version"] > 0
        assert all(np.isfinite(weights[f"{kind}{i}"]).all() for kind in "Wb" for i in (0, 1))
    for worker in workers:
        worker.stop("test over")  # they wait for the server to come back, as after a stop
        assert await worker.wait(30) == 0


async def test_a_diverging_np_job_stops_with_why_at_its_first_non_finite_answer(lab: Lab) -> None:
    """np: a slice holder's NaN partial outputs were refused and the bunch left waiting
    until the holder was dropped as late, re-sliced, joined again, for ever: the run said
    ``training``, ``updates_rejected`` 0. Every bunch needs every slice: it stops at once."""
    server = await lab.server("--mode", "np", "--epochs", "3", *SMALL_JOB, *DIVERGING,
                              "--data", short_data())  # fmt: skip
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        workers = [lab.worker(server, f"w{i}") for i in range(2)]
        reason = await server.wait(60)
    assert not [w for w in warned if issubclass(w.category, RuntimeWarning)]  # said once, below
    assert reason.startswith("training diverged: "), reason
    assert "NaN or Inf" in reason and "(at worker w" in reason and "'s answer for bunch " in reason
    assert "in np mode no bunch completes without every slice; a lower learning rate" in reason
    status = server.final_status()
    assert status["stop_reason"] == reason and status["updates_rejected"] >= 1
    for worker in workers:
        worker.stop("test over")
        assert await worker.wait(30) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the policies' rule
@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_peer_whose_every_update_is_refused_sets_nobodys_pace(lab: Lab, mode: str) -> None:
    """A peer that joined and sent a NaN update every half second had each refusal taken
    for a sign of life: sync rounds and async steps waited for it at every step, the run
    at its pace (166k -> 2.9k patterns a second, an outside audit's client). A step waits
    only for workers an update of which was applied; the honest worker trains the epoch."""
    server = await lab.server("--mode", mode, "--epochs", "1", *SMALL_JOB,
                              "--data", short_data())  # fmt: skip
    honest = lab.worker(server, "honest")
    await wait_until(lambda: _applied(server, 1), 30, "the honest worker's first step")
    peer = await AsyncRawClient.connect(server.port, "nan")
    await peer.handshake()
    base: Weights = await peer.receive(Weights)
    nan = np.full(LAYOUT_64.size, np.nan, "<f4")
    sent = 0

    async def newest(version: int, seconds: float) -> int:
        """The newest weights' version sent to the peer within ``seconds`` (reading)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while data := await peer.reader.read(1 << 20):  # b"": the server closed
                    peer.inbox.extend(peer.decoder.feed(data))
        versions = [m.version for m in peer.inbox if isinstance(m, Weights)]
        peer.inbox[:] = [m for m in peer.inbox if not isinstance(m, Weights)]
        return max([version, *versions])

    async def trickle() -> None:  # every lease it is given, an update each half second
        nonlocal sent
        version = base.version
        while True:
            lease: Lease = await peer.receive(Lease, timeout=60)
            for offset in range(0, len(lease.indices) - 127, 128):
                # on the newest weights: refused for its numbers, not as stale (sync), which a
                # slow latecomer's update is, and after which the rounds do wait for it
                await peer.send(Update(version, lease.lease_id, offset, 128, 1.0, 0, 0.01, nan))
                sent += 1
                version = await newest(version, 0.5)  # about 130 steps in the epoch: a minute

    attack = asyncio.create_task(trickle())
    try:
        assert await server.wait(30) == "trained"
    finally:
        attack.cancel()
    assert sent >= 2
    status = server.final_status()
    assert status["updates_rejected"] >= 1 and status["epochs_done"] == 1
    await peer.close()
    assert await honest.wait(30) == 0


async def _applied(server: LabServer, count: int) -> bool:
    return bool((await server.status())["updates_applied"] >= count)


def test_refusals_of_one_peer_do_not_stop_a_run_others_train() -> None:
    live = {1: "honest", 2: "garbage"}
    watch = DivergenceWatch(live.keys(), min_refused=10, per_worker=3)
    for _ in range(50):  # worker 2 sends NaN as fast as it can; worker 1 is computing
        assert watch.refuse(_session(2), "not finite", 7) is None
    for _ in range(2):
        assert watch.refuse(_session(1), "not finite", 7) is None
    why = watch.refuse(_session(1), "update norm 1e12 per pattern is implausible", 7)
    assert why is not None and "the last 53 updates, from every worker (w1 from " in why
    assert "to version 7 (the last: update norm 1e12" in why
    assert watch.refuse(_session(1), "again", 7) is None  # said once
    honest = DivergenceWatch(live.keys(), min_refused=10, per_worker=3)
    for round_ in range(40):
        honest.refuse(_session(2), "implausible", round_)
        if round_ % 10 == 9:
            honest.applied()  # worker 1's update: the run moves
    assert not honest.diverged
    banked = DivergenceWatch(live.keys(), min_refused=10, per_worker=3)
    for _ in range(9):
        banked.refuse(_session(2), "implausible", 0)
    del live[2]  # it leaves, its count with it: 3 of worker 1's do not make 10
    assert [banked.refuse(_session(1), "x", 0) for _ in range(3)] == [None] * 3
    alone = DivergenceWatch([2], min_refused=10, per_worker=3)
    assert [alone.refuse(_session(2), "x", 0) is None for _ in range(10)] == [True] * 9 + [False]


def _session(worker_id: int) -> Any:
    return SimpleNamespace(worker_id=worker_id, name=f"w{worker_id}", address="10.0.0.9")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the coordinator's rule
async def test_a_peer_naming_leases_it_does_not_hold_stops_nothing(lab: Lab) -> None:
    """Refusals for whom or when an update was sent are not a diverging job's: a lone peer
    sending updates for unknown leases stopped a fresh run as "diverged" in 0.4 s."""
    server = await lab.server("--mode", "async", "--epochs", "30", "--min-workers", "2",
                              *SMALL_JOB, "--data", short_data())  # fmt: skip
    peer = await AsyncRawClient.connect(server.port, "garbage")
    await peer.handshake()
    element = np.zeros(ElementLayout.for_network(NetworkSpec.parse("117:64:10")).size, "<f4")
    for lease_id in range(150):
        await peer.send(Update(0, 500_000 + lease_id, 0, 1, 1.0, 0, 0.1, element))
    status = await wait_until(lambda: _refused(server, 150), 30, "150 refusals")
    assert status["stop_reason"] is None and status["state"] != "stopping"
    await peer.close()
    server.stop("test over")
    assert await server.wait(30) == "test over"


async def _refused(server: LabServer, count: int) -> dict[str, Any] | None:
    status = await server.status()
    return status if status["updates_rejected"] >= count else None


def test_snet_train_of_a_diverging_job_stops_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning from the arithmetic either
        said = error(["train", "--epochs", "2", "--network", "117:64:10", *DIVERGING,
                      "--data", short_data(), "--out-dir", str(out)], capsys, 1)  # fmt: skip
    assert said.startswith("snet train: training diverged in epoch 1: the gradients of ")
    assert "bunches were not finite (loss nan), so no step could be taken" in said
    assert said.endswith("a lower learning rate may train (no weights written)")
    assert "Warning" not in said and not (out / "weights.npz").exists()
