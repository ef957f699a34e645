"""What a sloppy or hostile third-party worker gets from the server (protocol/README.md).

Found by writing a worker from the specification alone and then sending what such a
worker might: each test is one thing the server did other than the specification says (or
without bound: a peer that reads nothing), and checks what the specification promises.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from test_transport import LOOPS, Pair, join, run_pair, streams

from snet.protocol.job import NetworkSpec
from snet.protocol.messages import (
    TRAINING_COMPLETE,
    ErrorMessage,
    EvalResult,
    Evaluate,
    Frames,
    FramesWanted,
    Goodbye,
    Lease,
    Message,
    Resync,
    Update,
    Weights,
    WorkerReport,
)
from snet.protocol.network import ElementLayout
from snet.server.connection import PEER_WARNINGS
from snet.transport.stream import LINGER_SECONDS, MAX_BACKLOG

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab, LabServer, wait_until
from short_data import short_job

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))  # SMALL_JOB's network


async def _negative_update(lab: Lab, name: str) -> tuple[LabServer, AsyncRawClient, Update]:
    """An async server, a raw worker ``name`` joined to it, and an update of its first
    lease at offset -1 (before the lease's start: it covers no frames)."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, name)
    await client.handshake()
    start: Weights = await client.receive(Weights)
    lease: Lease = await client.receive(Lease)
    gradient = np.full(LAYOUT.size, 0.01, np.float32)
    return server, client, Update(start.version, lease.lease_id, -1, 1, 0.5, 0, 0.001, gradient)


async def test_an_update_at_a_negative_offset_is_refused_and_settled(lab: Lab) -> None:
    """An offset before the lease's start covers no frames: the update is refused (and so
    settled), not taken for a second delivery and ignored, which left it unsettled and a
    worker waiting on its flow control for ever."""
    server, client, update = await _negative_update(lab, "negative")
    await client.send(update)
    error: ErrorMessage = await client.receive(ErrorMessage, timeout=5)
    assert error.code == "update_rejected" and not error.fatal, error
    assert (error.lease_id, error.offset) == (update.lease_id, -1)
    settled: Weights = await client.receive(Weights)
    assert settled.settled == 1
    status = await server.status()
    assert status["updates_rejected"] == 1 and status["updates_applied"] == 0
    await client.close()


async def test_a_fatal_error_from_a_worker_ends_its_connection(lab: Lab) -> None:
    """``fatal = true`` means the sender is done; the server ends the worker's session at
    once (its frames back in the queue) rather than holding its leases until it times
    out, even when the worker does not close its end."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, "fatal")
    await client.handshake()
    await client.receive(Lease)
    await client.send(ErrorMessage("out_of_memory", "the worker cannot go on", True))
    assert await client.closed_by_peer(timeout=5), "the server kept the connection open"

    async def gone() -> dict[str, object] | None:
        status = await server.status()
        rows = [w for w in status["workers"] if w["name"] == "fatal"]
        return rows[0] if status["connections_open"] == 0 and rows[0]["left_reason"] else None

    row = await wait_until(gone, 5, "the worker to be gone from /status")
    assert "fatal error from the worker: out_of_memory" in str(row["left_reason"])
    assert "4096 frames back in the queue" in lab.log("server")


async def test_frames_wanted_again_sends_nothing_more(lab: Lab) -> None:
    """A second ``frames_wanted`` on a connection is ignored. It used to start the
    connection's inline record afresh and send every held lease's frames again: a few
    dozen bytes in, hundreds of kilobytes queued out, without bound for a peer that sent
    it in a loop and read nothing (3,000 of them took the server from 70 to 770 MB)."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    client = await AsyncRawClient.connect(server.port, "inline")
    await client.handshake()
    await client.receive(Weights)
    await client.receive(Lease)
    await client.send(FramesWanted("reads no data"))
    await client.send(Resync("marker"))  # answered with weights after what came before it
    await client.receive(Weights)
    assert any(isinstance(m, Frames) for m in client.inbox)
    sent = (await server.status())["inline_frames"]["frames_sent"]
    assert sent > 0
    client.inbox.clear()
    for _ in range(20):
        await client.send(FramesWanted("again"))
    # a marker answered after what came before it (a second resync of a version is not):
    # a report nested too deep, refused and nothing else
    await client.send(WorkerReport(0.0, {"x": _nested(20)}))
    await client.receive(ErrorMessage)
    assert not any(isinstance(m, Frames) for m in client.inbox)
    assert (await server.status())["inline_frames"]["frames_sent"] == sent
    await client.close()


def _nested(depth: int) -> object:
    nested: object = 1
    for _ in range(depth):
        nested = [nested]
    return nested


async def next_message(client: AsyncRawClient) -> Message:
    """The next message from the server, whatever it is (fails on EOF or 10 s of silence)."""
    while not client.inbox:
        data = await asyncio.wait_for(client.reader.read(1 << 20), 10)
        if not data:
            raise ConnectionError("closed by the server")
        client.inbox.extend(client.decoder.feed(data))
    return client.inbox.pop(0)


async def train_until_asked_to_score(client: AsyncRawClient, patterns: int) -> Evaluate:
    """Deliver an update on every leased frame, in order, until the server sends
    ``evaluate`` (gradients of plausible size: what is checked here is not the net)."""
    rng = np.random.default_rng(3)
    version = 0
    while not isinstance(message := await next_message(client), Evaluate):
        if isinstance(message, Weights):
            version = max(version, message.version)
        elif isinstance(message, Lease):
            for offset in range(0, len(message.indices), patterns):
                count = min(patterns, len(message.indices) - offset)
                gradient = rng.standard_normal(LAYOUT.size).astype(np.float32)
                update = Update(version, message.lease_id, offset, count, count, 0, 0.01, gradient)
                await client.send(update)
    return message


async def test_a_worker_whose_cv_score_is_refused_is_not_asked_again_for_it(lab: Lab) -> None:
    """A CV result with implausible figures (here one frame too many: a worker that cut
    the CV set otherwise) is refused. The job used to go straight back to the same worker
    when no other was there, ten times a second for as long as it answered so: the epoch
    never ended. Now a job goes to a worker that has not had its result for it refused,
    and when every connected worker has, the server scores the CV set itself."""
    server = await lab.server("--mode", "async", "--epochs", "1", *short_job())
    client = await AsyncRawClient.connect(server.port, "miscounts")
    await client.handshake()
    asked = await train_until_asked_to_score(client, 512)
    await client.send(EvalResult(asked.version, asked.epoch, 10**6, 0, 1.0))
    error: ErrorMessage = await client.receive(ErrorMessage)
    assert error.code == "update_rejected" and "frames" in error.text
    while not isinstance(message := await next_message(client), Goodbye):
        assert not isinstance(message, Evaluate), "asked again after refusing its result"
    assert message.reason == TRAINING_COMPLETE
    assert await server.wait(10) == "trained"
    status = server.final_status()
    assert status["cv_checks"]["refereed"] == 1
    assert status["epochs"][0]["cv_accuracy"] is not None
    log = lab.log("server")  # named as what it was (it said "refused update from")
    assert "refused eval_result from miscounts" in log and "refused update" not in log


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_peer_that_reads_nothing_is_dropped_before_its_backlog_grows_without_bound(
    loop_name: str,
) -> None:
    """While the peer reads nothing, frames wait in the channel's backlog (weights only
    coalesce). A hostile worker that sent requests and read no answers made the server's
    backlog grow for as long as it kept sending (20 MB in 16 s of refused reports): the
    connection is now dropped once ``MAX_BACKLOG`` frames wait, far above what a worker
    that reads is ever sent unread (a lease or two, their frames, an evaluate)."""

    async def body(pair: Pair) -> None:
        await join(pair)
        server, worker = streams(pair)
        assert worker.transport is not None and server.channel is not None
        worker.transport.pause_reading()  # the peer reads nothing more
        rows = 4096  # a megabyte a frame: the socket's buffers fill after a few
        frames = Frames(np.arange(rows), np.zeros((rows, 64), np.float32), np.zeros(rows, np.int32))
        sent = 0
        while server.open and sent < MAX_BACKLOG + 100:
            server.send(frames)  # the same arrays every time: the backlog holds references
            sent += 1
            await asyncio.sleep(0)
        assert not server.open, f"still open with {server.channel.backlog} frames queued"
        assert sent <= MAX_BACKLOG + 10
        await asyncio.wait_for(pair[0].lost, 5)

    run_pair(loop_name, body)


async def test_a_peer_repeating_a_refused_message_does_not_flood_the_log(lab: Lab) -> None:
    """Each refusal was a warning line: a peer repeating one wrote 47,000 lines (13.7 MB)
    in 7 s. The first PEER_WARNINGS of a connection are logged, the rest counted and
    summed up in one line when it leaves; /status counts every refusal."""
    server, client, update = await _negative_update(lab, "repeater")
    sent = PEER_WARNINGS + 30
    for _ in range(sent):
        await client.send(update)

    async def all_refused() -> bool:
        return bool((await server.status())["updates_rejected"] == sent)

    await wait_until(all_refused, 10, "every update to be refused")
    await client.close()
    summary = "repeater: 30 more warnings about what it sent were not logged"
    await wait_until(lambda: summary in lab.log("server"), 10, "the summary line")
    assert lab.log("server").count("refused update from repeater") == PEER_WARNINGS


async def test_a_flood_of_resyncs_is_sent_one_copy_a_version_and_logged_once(lab: Lab) -> None:
    """Each 30-byte ``resync`` was answered with a whole copy of the weights and an INFO
    line: one peer had the server send 9 GB and log 49,030 lines in 8 s."""
    server, client, update = await _negative_update(lab, "flooder")
    for _ in range(50):
        await client.send(Resync("again"))
    await client.send(update)  # refused, and settled by weights: after the resyncs (TCP)
    await client.receive(ErrorMessage, timeout=10)
    await client.receive(Weights)  # the settling copy, at least
    copies = 1 + sum(isinstance(message, Weights) for message in client.inbox)
    assert copies == 2, copies  # one for the resyncs (the version did not change), one settling
    assert lab.log("server").count("flooder asks for a full copy of the weights") == 1
    assert (await server.status())["weight_version"] == update.base_version
    await client.close()


async def test_refusals_at_step_time_and_repeats_share_the_log_budget(lab: Lab) -> None:
    """An update refused when its step is applied (NaN, an implausible norm, over the
    staleness bound) and an update delivered again were warnings outside the budget: a
    worker whose training diverged, sending NaN at its full rate, wrote a line for each.
    Every warning about what one connection's peer sent counts against PEER_WARNINGS."""
    server, client, update = await _negative_update(lab, "diverged")
    nan = np.full(LAYOUT.size, np.nan, np.float32)
    refused = 25
    for offset in range(refused):
        await client.send(
            Update(update.base_version, update.lease_id, offset, 1, 0.5, 0, 0.001, nan)
        )

    async def all_refused() -> bool:
        return bool((await server.status())["updates_rejected"] == refused)

    await wait_until(all_refused, 10, "every NaN update to be refused")
    repeated = 25  # offset 0 again: a second delivery, ignored
    for _ in range(repeated):
        await client.send(Update(update.base_version, update.lease_id, 0, 1, 0.5, 0, 0.001, nan))
    await client.send(Resync("marker"))  # a warning too (one a version: below)
    await client.send(WorkerReport(0.0, {"x": _nested(20)}))  # refused, once all else is read
    while "nested" not in (await client.receive(ErrorMessage)).text:
        pass  # the NaN updates' refusals
    await client.close()
    unlogged = refused + repeated + 2 - PEER_WARNINGS
    summary = f"diverged: {unlogged} more warnings about what it sent were not logged"
    await wait_until(lambda: summary in lab.log("server"), 10, "the summary line")
    log = lab.log("server")
    logged = log.count("refused update from diverged") + log.count("came again; ignored")
    assert logged == PEER_WARNINGS, log


async def test_a_stopping_server_waits_until_a_worker_behind_has_read_its_goodbye(
    lab: Lab,
) -> None:
    """A server's shutdown returned (and its process exited) with a worker's goodbye still
    unread: the exit reset the connection, and a worker behind in reading (a SIGSTOP, a
    backlog) lost the goodbye, retried its whole window and exited 3 (a probe). It waits
    for the lingering close now: until the worker has read it, LINGER_SECONDS at most."""
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    behind = await AsyncRawClient.connect(server.port, "behind")
    await behind.handshake()
    await behind.receive(Lease)  # joined, and reads no more for now
    server.stop("test over")
    stopping = asyncio.ensure_future(server.wait(10))
    await asyncio.sleep(0.5)
    assert not stopping.done()  # its goodbye is still unread
    assert await behind.closed_by_peer(5)  # read: the goodbye, then the server's close
    assert any(isinstance(message, Goodbye) for message in behind.inbox)
    assert await stopping == "test over"


async def test_a_stopping_server_waits_for_a_worker_that_never_reads_no_longer_than_its_linger(
    lab: Lab,
) -> None:
    server = await lab.server("--mode", "async", "--epochs", "1", *SMALL_JOB)
    stuck = await AsyncRawClient.connect(server.port, "stuck")
    await stuck.handshake()
    await stuck.receive(Lease)
    server.stop("test over")
    assert await server.wait(LINGER_SECONDS + 5) == "test over"  # it closed it itself
    assert await stuck.closed_by_peer(5)
