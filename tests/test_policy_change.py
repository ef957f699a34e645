"""A staleness policy changed while training reaches the workers (in process): every
worker that follows changes is sent ``policy`` and its in-flight bound follows it; a
worker joining later is welcomed with the policy in force; an older peer, which did not
ask, is sent nothing it could not read and keeps training; a server restarted from its
checkpoint keeps the policy set at run time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from snet.client.policies import ComputePolicy, ComputeState
from snet.protocol.messages import FOLLOWS_POLICY, PolicyChange, Resync, Weights

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, LabWorker, wait_until

MAX_IN_FLIGHT = 3  # the job's own bound, above the one bounded:1 sets


async def _control(lab: Lab, server: LabServer, policy: str) -> dict[str, Any]:
    session = await lab.http()
    async with session.post(server.url + "/control", json={"staleness": policy}) as response:
        assert response.status == 200, await response.text()
        record: dict[str, Any] = json.loads(await response.read())
        return record


def _record_computes(policy: ComputePolicy, seen: list[tuple[int, int]]) -> None:
    """Note (bound, updates unsettled) whenever the worker's loop decides to compute."""
    decide = policy.may_compute

    def may_compute(state: ComputeState) -> bool:
        allowed = decide(state)
        if allowed:
            seen.append((policy.max_in_flight, state.in_flight))
        return allowed

    policy.may_compute = may_compute  # type: ignore[method-assign]


def _bounds(workers: list[LabWorker]) -> list[int | None]:
    return [w.worker.policy.max_in_flight if w.worker.policy else None for w in workers]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: see tests/README.md
async def test_a_policy_change_reaches_every_worker_and_bounds_its_updates(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "200", "--max-in-flight", str(MAX_IN_FLIGHT),
        "--min-workers", "3", *SMALL_JOB,
    )  # fmt: skip
    workers = [lab.worker(server, f"w{i}") for i in range(3)]
    await wait_until(
        lambda: all(w.worker.policy is not None and w.worker.updates_sent >= 3 for w in workers),
        60, "every worker training",
    )  # fmt: skip
    assert _bounds(workers) == [MAX_IN_FLIGHT] * 3
    seen: dict[str, list[tuple[int, int]]] = {w.name: [] for w in workers}
    for w in workers:
        assert w.worker.policy is not None
        _record_computes(w.worker.policy, seen[w.name])

    record = await _control(lab, server, "bounded:1")
    assert (record["to"], record["workers_told"], record["workers_not_told"]) == ("bounded:1", 3, 0)
    await wait_until(lambda: _bounds(workers) == [1, 1, 1], 30, "every worker to follow")
    assert all(w.worker.job is not None and w.worker.job.staleness == "bounded:1" for w in workers)
    marks = {name: len(computes) for name, computes in seen.items()}
    await wait_until(
        lambda: all(len(seen[name]) >= mark + 5 for name, mark in marks.items()),
        60, "five more updates from every worker",
    )  # fmt: skip
    for name, mark in marks.items():
        after = seen[name][mark:]
        # from the change on, a worker computes only with nothing unsettled
        assert all(bound == 1 and in_flight == 0 for bound, in_flight in after), (name, after)

    late = lab.worker(server, "late")  # joins after the change: the welcome's job says it
    await wait_until(lambda: _bounds([late]) == [1], 30, "the late worker to train")
    assert late.worker.job is not None and late.worker.job.staleness == "bounded:1"

    record = await _control(lab, server, "none")
    assert record["workers_told"] == 4
    everyone = [*workers, late]
    await wait_until(
        lambda: _bounds(everyone) == [MAX_IN_FLIGHT] * 4, 30, "the job's bound to come back"
    )
    status = await server.status()
    assert [c["to"] for c in status["staleness"]["changes"]] == ["bounded:1", "none"]
    assert "the server's staleness policy is now bounded:1" in lab.log("w0")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_an_older_worker_is_not_sent_a_policy_message(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    old = await AsyncRawClient.connect(server.port, "old")
    new = await AsyncRawClient.connect(server.port, "new")
    try:
        await old.handshake(capabilities=("codec:fp16",))  # written before policy existed
        await new.handshake(capabilities=("codec:fp16", FOLLOWS_POLICY))
        for client in (old, new):
            await client.receive(Weights)
        record = await _control(lab, server, "bounded:2")
        assert (record["workers_told"], record["workers_not_told"]) == (1, 1)
        change = await new.receive(PolicyChange)
        assert change == PolicyChange(0, "bounded:2")
        # the server answers a resync with weights: whatever it sent the old worker
        # before them is in its inbox by then, and no policy is among it
        await old.send(Resync("test"))
        await old.receive(Weights)
        assert not [m for m in old.inbox if isinstance(m, PolicyChange)]
        assert not await old.closed_by_peer(timeout=0.2)  # and it is still connected
        later = await AsyncRawClient.connect(server.port, "later")
        try:  # a worker joining now is welcomed with the policy in force, old or new
            assert (await later.handshake()).job["staleness"] == "bounded:2"
        finally:
            await later.close()
    finally:
        await old.close()
        await new.close()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_restarted_server_keeps_the_policy_set_at_run_time(lab: Lab) -> None:
    first = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    worker = lab.worker(first, "w0")
    await wait_until(lambda: worker.worker.updates_sent >= 3, 60, "the worker training")
    record = await _control(lab, first, "bounded:2")
    worker.stop("restart")
    assert await worker.wait(30) == 0
    first.stop("restart")  # a final checkpoint, as at SIGTERM
    await first.wait(30)
    again = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)  # same out-dir
    status = await again.status()
    assert status["resumed"] is not None
    assert status["resumed"]["epoch"] == status["epoch"] >= 1  # counted from 1 alike
    assert status["checkpoints"]["last"] == {}  # none written yet by this server
    assert status["staleness"]["policy"] == "bounded:2"
    assert status["staleness"]["changes"] == [record]
    client = await AsyncRawClient.connect(again.port, "after")
    try:
        assert (await client.handshake()).job["staleness"] == "bounded:2"
    finally:
        await client.close()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_restart_with_another_staleness_policy_puts_it_in_force(lab: Lab) -> None:
    """--staleness is changed at run time (POST /control): an operator who then writes the
    new policy into the server's command was refused at the restart, "a checkpoint of
    another job (staleness 'none' there, 'bounded:2' here)", though bounded:2 was the
    policy in force there. A command's policy other than the checkpointed command's is
    put in force as a change; the same command keeps the run-time change."""
    first = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    worker = lab.worker(first, "w0")
    await wait_until(lambda: worker.worker.updates_sent >= 3, 60, "the worker training")
    await _control(lab, first, "bounded:2")
    worker.stop("restart")
    assert await worker.wait(30) == 0
    first.stop("restart")
    await first.wait(30)
    flags = ["--mode", "async", "--epochs", "200", *SMALL_JOB]
    second = await lab.server(*flags, "--staleness", "bounded:2", name="server")
    status = await second.status()
    assert status["resumed"] is not None and status["staleness"]["policy"] == "bounded:2"
    assert len(status["staleness"]["changes"]) == 1  # in force already: no change made
    second.stop("restart")
    await second.wait(30)
    third = await lab.server(*flags, "--staleness", "rate", name="server")
    status = await third.status()
    assert status["resumed"] is not None and status["staleness"]["policy"] == "rate"
    change = status["staleness"]["changes"][-1]
    assert (change["from"], change["to"], change["by"]) == (
        "bounded:2",
        "rate",
        "the restart's command",
    )
    client = await AsyncRawClient.connect(third.port, "after")
    try:
        assert (await client.handshake()).job["staleness"] == "rate"
    finally:
        await client.close()
