"""A staleness policy changed while training reaches the workers (in process): every
worker that follows changes is sent ``policy`` and its in-flight bound follows it; a
worker joining later is welcomed with the policy in force; an older peer, which did not
ask, is sent nothing it could not read and keeps training; a server restarted from its
checkpoint keeps the policy set at run time; a change is answered once a checkpoint taken
between two steps holds it, and one whose checkpoint cannot be written is taken back
(a kill before the first step: tests/test_staleness_server.py)."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

import pytest

from snet.client.policies import ComputePolicy, ComputeState
from snet.protocol.messages import FOLLOWS_POLICY, PolicyChange, Resync, Weights
from snet.server.checkpoint import CHECKPOINTS_DIR, CheckpointStore
from snet.server.control import TAKEN_BACK_BY
from snet.server.stepping import StepRunner

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, LabWorker, wait_until
from short_data import short_job

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
async def test_a_change_once_the_run_has_ended_is_refused(lab: Lab) -> None:
    """It was accepted (200), logged and checkpointed, and changed nothing."""
    server = await lab.server("--mode", "async", "--epochs", "1", "--linger-seconds", "30",
                              *short_job())  # fmt: skip
    lab.worker(server, "w0")
    await wait_until(lambda: server.server.coordinator.finished.is_set(), 60, "the run's end")
    session = await lab.http()
    async with session.post(server.url + "/control", json={"staleness": "bounded:2"}) as answer:
        assert answer.status == 409 and "the run has ended" in await answer.text()
    assert (await server.status())["staleness"]["changes"] == []
    server.stop("test over")
    await server.wait(30)


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


def _on_disk(server: LabServer) -> dict[str, Any]:
    """The coordinator's part of the newest checkpoint in the server's out-dir."""
    loaded = CheckpointStore(Path(server.out_dir) / CHECKPOINTS_DIR).newest()
    assert loaded is not None
    state: dict[str, Any] = loaded.state["coordinator"]
    return state


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_change_is_answered_once_a_checkpoint_between_steps_holds_it(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that comes while a step runs is checkpointed at that step's end (a
    checkpoint is never taken during one), and answered only when that is on disk."""
    release, held = asyncio.Event(), asyncio.Event()
    run = StepRunner.run

    async def held_step(self: StepRunner, *args: Any) -> Any:
        if not release.is_set():
            held.set()
            await release.wait()
        return await run(self, *args)

    monkeypatch.setattr(StepRunner, "run", held_step)
    server = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    worker = lab.worker(server, "w0")
    try:
        await asyncio.wait_for(held.wait(), 60)  # the first step runs, and waits
        answer = asyncio.ensure_future(_control(lab, server, "bounded:2"))
        await wait_until(lambda: server.server.coordinator.staleness.name == "bounded:2", 10,
                         "the change in force")  # fmt: skip
        await asyncio.sleep(0.2)
        assert not answer.done()  # no checkpoint yet: the step still runs
    finally:
        release.set()  # (a failed test's server can still stop)
    record = await asyncio.wait_for(answer, 30)
    on_disk = _on_disk(server)
    assert on_disk["staleness"]["policy"] == "bounded:2"
    assert on_disk["staleness"]["changes"] == [record]
    assert on_disk["version"] >= 1  # taken after the step that was running
    worker.stop("done")
    assert await worker.wait(30) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_change_that_cannot_be_checkpointed_is_taken_back(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: a change a crash would undo is never answered 200. It is taken back
    at once (a change of its own, told to the workers), and the answer says why."""
    write = CheckpointStore.write

    def full_disk(self: CheckpointStore, state: dict[str, Any]) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CheckpointStore, "write", full_disk)
    server = await lab.server("--mode", "async", "--epochs", "200", *SMALL_JOB)
    worker = lab.worker(server, "w0")
    await wait_until(lambda: worker.worker.updates_sent >= 3, 60, "the worker training")
    session = await lab.http()
    async with session.post(server.url + "/control", json={"staleness": "bounded:1"}) as response:
        assert response.status == 503
        assert await response.text() == (
            "staleness policy not changed: cannot write a checkpoint: [Errno 28] No space "
            "left on device; none stays in force\n"
        )
    status = await server.status()
    assert status["staleness"]["policy"] == "none"
    assert [(c["from"], c["to"], c["by"]) for c in status["staleness"]["changes"]] == [
        ("none", "bounded:1", "127.0.0.1"),
        ("bounded:1", "none", TAKEN_BACK_BY),
    ]
    await wait_until(lambda: "staleness policy is now none" in lab.log("w0"), 30,
                     "the worker told it was taken back")  # fmt: skip
    assert "staleness policy bounded:1 taken back" in lab.log("server")

    monkeypatch.setattr(CheckpointStore, "write", write)  # space again
    record = await _control(lab, server, "bounded:1")
    assert _on_disk(server)["staleness"]["policy"] == record["to"] == "bounded:1"
    worker.stop("done")
    assert await worker.wait(30) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_asking_for_the_policy_in_force_changes_nothing(lab: Lab) -> None:
    """`POST /control {"staleness": "none"}` with none in force was recorded as a change
    from none to none (a probe), checkpointed and told to the workers."""
    server = await lab.server("--mode", "async", "--min-workers", "9", *SMALL_JOB)
    same = await _control(lab, server, "none")
    assert same["unchanged"] is True and same["from"] == same["to"] == "none"
    assert json.loads(await server.get("/control"))["changes"] == []
    changed = await _control(lab, server, "bounded:2")
    assert "unchanged" not in changed and changed["to"] == "bounded:2"
    again = await _control(lab, server, " BOUNDED:2 ")  # the same policy as typed otherwise
    assert again["unchanged"] is True
    assert len(json.loads(await server.get("/control"))["changes"]) == 1
    server.stop("test over")
    assert await server.wait(30) == "test over"
