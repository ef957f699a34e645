"""Peers that hold what others need cannot freeze training: update elements, with payloads
they never finish (server/pool.py, shares: newcomers hold half the pool at most, so a
worker that trains always finds elements for its updates), and a sync run's frames, joining
mid-run and saying nothing (server/policies.py, lateness.py: the rounds do not wait for a
latecomer before its first update, and its frames go to the others when they run dry)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from snet.protocol.codecs.weights import WeightsEncoder
from snet.protocol.framing import FrameLimits, encode
from snet.protocol.messages import ErrorMessage, Lease, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server import pool as pool_module
from snet.server.connection import WorkerConnection
from snet.server.ledger import CompressionLedger
from snet.server.pool import ElementLoan, ElementPool, ElementShare
from snet.server.session import WorkerSession

from async_raw import AsyncRawClient
from helpers import QUICK_JOB
from inprocess import Lab, LabServer, wait_until
from short_data import short_job, tiny_data

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
POOL = 8


def _update_frame(lease: Lease) -> bytes:
    update = Update(0, lease.lease_id, 0, 128, 1.0, 0, 0.01, np.zeros(LAYOUT.size, np.float32))
    return b"".join(bytes(piece) for piece in encode(update))


async def _applied(server: LabServer) -> int:
    return int((await server.status())["updates_applied"])


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the pool's rule, not the loop's
async def test_peers_holding_unfinished_updates_cannot_freeze_training(lab: Lab) -> None:
    """The holders' leases are taken back after 0.5 s (--stall-seconds), not 2 s: the
    epoch they held ends sooner, as it did before."""
    server = await lab.server("--mode", "async", "--epochs", "30", "--pool-size", str(POOL),
                              "--linger-seconds", "30", "--stall-seconds", "0.5",
                              *short_job())  # fmt: skip
    lab.worker(server, "good")
    await wait_until(lambda: _applied(server), 30, "the good worker to train")
    holders, frame = [], b""
    for i in range(POOL + 4):  # more than the pool: each sends all but 1000 bytes of one
        holder = await AsyncRawClient.connect(server.port, f"holder{i}")
        await holder.handshake()
        frame = _update_frame(await holder.receive(Lease))
        await holder.send_bytes(frame[:-1000])
        holders.append(holder)
    queues = (await server.status())["queues"]
    assert queues["pool_newcomers"] == POOL // 2  # the newcomers' half, and no more
    last = holders[-1]  # one beyond the newcomers' half: it got a buffer of its own
    await last.send_bytes(frame[-1000:])  # its update whole, before its lease is late
    refusal = await last.receive(ErrorMessage)
    assert refusal.code == "update_rejected" and not refusal.fatal
    assert "update elements for workers none of whose updates is applied" in refusal.text
    before = await _applied(server)
    # it froze here: every element held, the server reading from nobody until they closed
    await wait_until(lambda: _applied_since(server, before, 20), 30, "training to go on")
    for holder in holders:
        await holder.close()
    await wait_until(lambda: _newcomers_gone(server), 30, "the holders' elements to come back")
    await wait_until(lambda: _epochs_done(server, 1), 60, "an epoch to end")
    server.stop("test over")
    assert await server.wait(30) == "test over"
    status = server.final_status()
    ledgers = [e["ledger"] for e in status["epochs"][: status["epochs_done"]]]
    assert ledgers and all(ledger["used_once"] == ledger["frames"] for ledger in ledgers)


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the pool's rule, not the loop's
async def test_proven_peers_holding_unfinished_updates_are_closed_and_no_worker_dropped(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Peers each made "proven" by one small update applied (every peer counts as one
    here), then holding all but the last bytes of the next, held every element: the
    server read from no one for 55 s, and then dropped an honest worker as silent (its
    messages had waited unread). Now a payload unfinished past its time is closed (1 s
    here, 15 s and a second a MiB by default), and a connection the server did not read
    is not silent."""
    monkeypatch.setattr(pool_module, "UNFINISHED_SECONDS", 1.0)
    monkeypatch.setattr(WorkerConnection, "_proven", lambda self: True)
    server = await lab.server("--mode", "async", "--epochs", "1000", "--pool-size", str(POOL),
                              "--stall-seconds", "0.5", *short_job())  # fmt: skip
    lab.worker(server, "good")
    await wait_until(lambda: _applied(server), 30, "the good worker to train")
    holders = []
    for i in range(POOL + 4):  # more than the pool: each sends all but 1000 bytes of one
        holder = await AsyncRawClient.connect(server.port, f"holder{i}")
        await holder.handshake()
        await holder.send_bytes(_update_frame(await holder.receive(Lease))[:-1000])
        holders.append(holder)
    before = await _applied(server)
    # it froze here: every element held, the server reading from nobody
    await wait_until(lambda: _applied_since(server, before, 20), 30, "training to go on")
    assert all([await holder.closed_by_peer(30) for holder in holders])
    said = [m.text for holder in holders for m in holder.inbox if isinstance(m, ErrorMessage)]
    assert any("update frame unfinished for" in text for text in said), said
    assert "no message for" not in lab.log("server")  # none dropped as silent
    server.stop("test over")
    assert await server.wait(30) == "test over"


async def _newcomers_gone(server: LabServer) -> bool:
    return bool((await server.status())["queues"]["pool_newcomers"] == 0)


async def _epochs_done(server: LabServer, epochs: int) -> bool:
    return bool((await server.status())["epochs_done"] >= epochs)


async def _applied_since(server: LabServer, before: int, more: int) -> bool:
    return await _applied(server) >= before + more


async def _steps(server: LabServer) -> int:
    return int((await server.status())["steps"])


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the rounds' rule, not the loop's
async def test_a_silent_latecomer_does_not_hold_the_sync_rounds(lab: Lab) -> None:
    """It held every round to the round deadline (12 s), was dropped and could join again
    at once (server/policies.py, SyncSteps)."""
    server = await lab.server("--mode", "sync", "--epochs", "30", "--linger-seconds", "30",
                              *short_job())  # fmt: skip
    lab.worker(server, "good")
    await wait_until(lambda: _steps(server), 30, "the good worker to train")
    silent = await AsyncRawClient.connect(server.port, "silent")
    await silent.handshake()
    await silent.receive(Lease)  # it holds frames, and never sends a thing
    before = await _steps(server)
    await wait_until(lambda: _steps_since(server, before, 30), 5, "rounds without it")
    # and at the epoch's end its frames go to the good worker (it held them 12 s a time)
    await wait_until(lambda: _revoked(server, "silent"), 10, "its lease to be taken back")
    assert (await silent.receive(ErrorMessage)).code == "lease_revoked"
    done = (await server.status())["epochs_done"]
    await wait_until(lambda: _epochs_done(server, done + 1), 10, "the epoch to end")
    status = await server.status()
    assert {w["name"]: w["state"] for w in status["workers"]}.get("silent") == "training"
    await silent.close()
    server.stop("test over")
    assert await server.wait(30) == "test over"
    final = server.final_status()
    ledgers = [e["ledger"] for e in final["epochs"][: final["epochs_done"]]]
    assert ledgers and all(ledger["used_once"] == ledger["frames"] for ledger in ledgers)


async def _steps_since(server: LabServer, before: int, more: int) -> bool:
    return await _steps(server) >= before + more


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # the fan-out's rule, not the loop's
async def test_an_idle_peer_is_not_sent_every_steps_weights(lab: Lab) -> None:
    """30 idle connections, each sent every step's weights (262 kB), cut a run to 0.41 of
    its steps a second; an idle one now gets the newest weights with its next lease. The
    least deadline is 0.5 s (not 2 s) and an epoch 6 bunches (a fifteenth of the data):
    its lease is taken back sooner, at the first epoch's end, nothing else changes."""
    # epochs it cannot finish in the test's second: a trained run stopped while it
    # lingers ends "trained" (server/app.py), and 30 of them were trained by the stop
    server = await lab.server("--mode", "async", "--epochs", "1000", "--linger-seconds", "30",
                              "--stall-seconds", "0.5", "--heartbeat-seconds", "0.5",
                              *QUICK_JOB, "--data", tiny_data())  # fmt: skip
    lab.worker(server, "good")
    await wait_until(lambda: _steps(server), 30, "the good worker to train")
    idle = await AsyncRawClient.connect(server.port, "idle")
    await idle.handshake()
    await idle.receive(Lease)  # a newcomer's one chunk: it computes nothing, and loses it
    await wait_until(lambda: _revoked(server, "idle"), 30, "its lease to be taken back")
    await idle.receive(ErrorMessage)  # lease_revoked
    idle.inbox.clear()
    before = await _steps(server)
    await wait_until(lambda: _steps_since(server, before, 30), 30, "30 steps")
    await asyncio.sleep(0.2)
    data = await asyncio.wait_for(idle.reader.read(1 << 24), 5)  # a heartbeat at most
    sent = [m for m in idle.decoder.feed(data) if isinstance(m, Weights)]
    assert sent == [], f"{len(sent)} weights sent to an idle peer over 30 steps"
    await idle.close()
    server.stop("test over")
    assert await server.wait(30) == "test over"


async def _revoked(server: LabServer, name: str) -> bool:
    rows = {w["name"]: w for w in (await server.status())["workers"]}
    return name in rows and rows[name].get("leases_revoked", 0) > 0


def test_a_worker_that_missed_a_publish_on_a_lossy_delta_gets_a_full_copy() -> None:
    """Sent no weights while idle (or while its last update waited for a step), a worker
    on ``delta:topk`` would get one lossy delta over every step it missed (a review: an
    error of 17 against weights of norm 20 after 200 steps): whichever path sends them
    (its next lease, the step that settles its update), the copy goes whole."""
    layout = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
    encoder = WeightsEncoder("delta:topk:0.01", layout)
    session = WorkerSession(1, "w", "", "numpy", (), lambda _: None, lambda _: None,
                            ledger=CompressionLedger("none", encoder))  # fmt: skip
    session.weights_sent(0)
    encoder.prepare(Weights(0, 0, 0.1, 0, np.zeros(layout.size, np.float32)))  # its first
    session.weights_sent(200, published_from=199)  # the others were sent 1-199 meanwhile
    full = encoder.prepare(Weights(200, 0, 0.1, 0, np.ones(layout.size, np.float32)))
    assert full.encoded is None and full.element.size == layout.size  # float32, whole
    session.weights_sent(203, published_from=200)  # it had the last publish: a delta
    assert encoder.prepare(Weights(203, 0, 0.1, 0, np.ones(layout.size, np.float32))).encoded
    sent: list[object] = []  # and its next lease sends the newest only if it lacks them
    coordinator = SimpleNamespace(version=203, pool=ElementPool(layout, 4),
                                  send_weights=sent.append)  # fmt: skip
    connection = WorkerConnection(coordinator, FrameLimits(), None, "s", lambda: 1,
                                  None, set())  # type: ignore[arg-type]  # fmt: skip
    connection.session = session
    connection._refresh_weights()
    coordinator.version = 204
    connection._refresh_weights()
    assert sent == [session]
    # once it left, the mirror of its copy goes (an element a peer: 250 delta peers, come
    # and gone, held 330 MB more, a probe); a copy written after that would go whole
    assert encoder._mirror is not None
    session.left("connection lost")
    assert encoder._mirror is None
    late = encoder.prepare(Weights(205, 0, 0.1, 0, np.ones(layout.size, np.float32)))
    assert late.encoded is None and late.element.size == layout.size


def test_a_peer_refused_for_its_numbers_is_held_to_a_newcomers_share_of_the_pool() -> None:
    """The pool's half-share bound for newcomers: one applied update used to lift it for
    good, so a peer sending NaN ever after (each refused) kept a full share; a stale
    update, whose base version a peer chooses, does not lift it either."""
    layout = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
    coordinator = SimpleNamespace(version=0, pool=ElementPool(layout, 4), send_weights=print)
    connection = WorkerConnection(coordinator, FrameLimits(), None, "s", lambda: 1,
                                  None, set())  # type: ignore[arg-type]  # fmt: skip
    session = WorkerSession(1, "w", "", "numpy", (), lambda _: None, lambda _: None)
    connection.session = session
    session.clock.update_arrived(1.0, 64, 0.01)  # a stale update delivered, refused as such
    assert session.proven  # what the steps go by; not the pool
    assert not connection._proven()
    session.updates_applied = 1
    assert connection._proven()
    session.refused(numeric=True)  # NaN since
    assert not connection._proven()


def test_the_connection_that_takes_the_last_element_is_not_paused_mid_payload() -> None:
    """The pool's last element fired its watch (pause every connection) inside the
    acquire, before the connection taking it was marked as receiving: it was paused with
    its payload half read, then closed as holding it unfinished. And a payload's loan
    released by another way (a frame refused) left it marked receiving for good."""
    from snet.protocol.framing import ArrayInfo

    pool = ElementPool(LAYOUT, 1)
    share = ElementShare(pool, lambda: True)
    seen: list[bool] = []
    pool.watch(lambda: seen.append(share.receiving), lambda: None)
    arrays = (ArrayInfo("<f4", (LAYOUT.size,), "none", 4 * LAYOUT.size),)
    _, loan = share.payload_target("update", arrays, 4 * LAYOUT.size)
    assert seen == [True]  # receiving when the watch asked: not paused
    assert share.receiving and share.unfinished_past(1e12) > 0
    assert isinstance(loan, ElementLoan)
    loan.release()  # refused, or abandoned, before it was whole
    assert not share.receiving and share.unfinished_past(1e12) == 0.0


def test_time_not_read_is_not_silence_and_nothing_more() -> None:
    """A worker's silence is counted less the time the server did not read it (its pool
    dry), and only that time: restarting the count at each resume let a pause of a
    millisecond forgive a dead worker's hour, so it was never timed out."""
    session = WorkerSession(1, "w", "", "numpy", (), lambda _: None, lambda _: None)
    now = session.last_seen + 3600.0  # silent for an hour
    session.not_read_for(0.001)
    assert session.quiet(now) == pytest.approx(3600.0, abs=0.01)
    session.not_read_for(600.0)  # ten minutes of it not read: not its silence
    assert session.quiet(now) == pytest.approx(3000.0, abs=0.01)
    session.touch()  # a message: silence counts from it, afresh
    assert session.unread_seconds == 0.0 and session.quiet(session.last_seen) == 0.0


def test_a_newcomer_past_its_share_holding_its_own_buffer_is_timed_too() -> None:
    """Past the newcomers' half of the pool a payload goes into a buffer of its own: such
    holders were not closed at 15 s as the pooled ones were, and held an element's worth
    of memory each until the silence timeout (a probe: 4 of 20)."""
    from snet.protocol.framing import ArrayInfo
    from snet.server.pool import TURNED_AWAY

    pool = ElementPool(LAYOUT, 2)  # a newcomers' share of 1
    shares = [ElementShare(pool, lambda: False) for _ in range(2)]
    arrays = (ArrayInfo("<f4", (LAYOUT.size,), "none", 4 * LAYOUT.size),)
    first = shares[0].payload_target("update", arrays, 4 * LAYOUT.size)
    second = shares[1].payload_target("update", arrays, 4 * LAYOUT.size)
    assert first is not None and isinstance(first[1], ElementLoan)
    assert second is not None and second[1] is TURNED_AWAY
    for share in shares:
        assert share.receiving and share.unfinished_past(1e12) > 0
