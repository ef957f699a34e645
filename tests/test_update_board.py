"""Update boards (transport/shared_board.py): a worker on the server's machine writes each
float32 update into a slot of a board the server made for it and sends a frame naming the
slot; the server copies it out at once and checks it as any other update. A slot the
worker has not got, or no board, is refused; what it writes there later is never read;
all the boards together stay within their bound, and each goes with its worker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from snet.protocol.codecs.handshake import BOARD, UPDATE_BOARD, worker_capabilities
from snet.protocol.codecs.weights import SHARED
from snet.protocol.errors import CodecError
from snet.protocol.messages import ErrorMessage, Heartbeat, Lease, Resync, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.transport.shared_board import (
    MAX_UPDATE_BOARDS_BYTES,
    UPDATE_MAGIC,
    BoardInfo,
    BoardReader,
    UpdateBoard,
    UpdateBoards,
)

from async_raw import AsyncRawClient
from helpers import SMALL_JOB, memfd_mappings
from inprocess import Lab
from inprocess import wait_until as wait_in_lab

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


@pytest.fixture
def board() -> Any:
    made = UpdateBoard(10, 4)
    yield made
    made.close()


def test_an_update_is_copied_out_of_its_slot_as_written(board: UpdateBoard) -> None:
    writer = BoardReader(BoardInfo.from_dict(board.described(), 10), UPDATE_MAGIC, writable=True)
    gradient, out = np.arange(10, dtype=np.float32), np.empty(10, np.float32)
    writer.write(3, gradient)
    board.copy_out(3, out)
    assert np.array_equal(out, gradient)
    writer.write(3, -gradient)  # written again after the copy: the copy is the server's own
    assert np.array_equal(out, gradient)
    for slot in (-1, 4):
        with pytest.raises(CodecError, match=f"update board slot {slot} of 4"):
            board.copy_out(slot, out)
    with pytest.raises(CodecError, match="is not the board the server named"):
        BoardReader(BoardInfo.from_dict(board.described(), 10))  # a weights board's magic
    writer.close()
    board.close()
    with pytest.raises(CodecError, match="slot 0 of 4"):  # closed: nothing read
        board.copy_out(0, out)


def test_the_boards_together_stay_within_their_bound() -> None:
    values = 1 << 20  # 4 MiB elements: 4 slots each, 16 MiB a board
    boards = UpdateBoards(values)
    made = []
    while (made_one := boards.make(max_in_flight=2)) is not None:
        made.append(made_one)
    # a board: its 64-byte header, and per slot a 64-byte version line and its values
    assert len(made) == MAX_UPDATE_BOARDS_BYTES // (64 + made[0].slots * (64 + values * 4))
    assert boards.used <= MAX_UPDATE_BOARDS_BYTES
    boards.release(made.pop())  # a worker gone: room for the next
    extra = boards.make(max_in_flight=2)
    assert extra is not None
    boards.close()  # the server stops: none made; those open stay until their workers go
    assert boards.make(max_in_flight=2) is None and not any(b.closed for b in made)
    for board in made:
        boards.release(board)
        boards.release(board)  # twice: counted once
    assert boards.used > 0 and not extra.closed  # its worker still there
    boards.release(extra)
    assert boards.used == 0 and all(b.closed for b in [*made, extra])


def test_a_worker_on_this_machine_asks_for_both_boards() -> None:
    asked = worker_capabilities("", SHARED)
    assert BOARD in asked and UPDATE_BOARD in asked
    assert UPDATE_BOARD not in worker_capabilities("", "none")


async def _update_in(client: AsyncRawClient, lease: Lease, offset: int, slot: int) -> None:
    empty = np.zeros(0, np.float32)
    await client.send(Update(0, lease.lease_id, offset, 128, 1.0, 0, 0.01, empty, slot=slot))


async def test_a_raw_peer_s_board_updates_are_checked_as_any(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[int] = []  # the slots the server copied out
    copy_out = UpdateBoard.copy_out

    def counted(board: UpdateBoard, slot: int, out: np.ndarray) -> None:
        copies.append(slot)
        copy_out(board, slot, out)

    monkeypatch.setattr(UpdateBoard, "copy_out", counted)
    server = await lab.server("--mode", "async", "--epochs", "1", "--linger-seconds", "30",
                              "--max-in-flight", "4", *SMALL_JOB)  # fmt: skip
    client = await AsyncRawClient.connect(server.port, "with-board")
    welcome = await client.handshake((BOARD, UPDATE_BOARD))
    info = BoardInfo.from_dict(welcome.codecs["update_board"], LAYOUT.size)
    assert info.slots == 6  # --max-in-flight 4, and 2 more
    writer = BoardReader(info, UPDATE_MAGIC, writable=True)
    await client.receive(Weights)
    lease = await client.receive(Lease)
    await _update_in(client, lease, 0, 6)  # a slot it has not got
    refusal = await client.receive(ErrorMessage)
    assert "slot 6 of an update board this worker has not got" in refusal.text
    nan = np.ones(LAYOUT.size, np.float32)
    nan[7] = np.nan
    writer.write(1, nan)  # garbage in its own slot: checked as any update, refused
    await _update_in(client, lease, 128, 1)
    refusal = await client.receive(ErrorMessage)
    assert refusal.code == "update_rejected", refusal
    writer.write(2, np.ones(LAYOUT.size, np.float32))
    await _update_in(client, lease, 256, 2)

    async def stepped() -> bool:
        return bool((await server.status())["weight_version"] >= 1)

    await wait_in_lab(stepped, 10, "the good update applied")
    weights = await server.get("/weights")
    writer.write(2, np.full(LAYOUT.size, np.nan, np.float32))  # settled: the slot is its again
    assert await server.get("/weights") == weights  # the server's copy was its own
    assert copies == [1, 2]  # the NaN one and the good one: none for the slot it had not
    await _update_in(client, lease, 256, 2)  # the same update again: ignored, not copied
    await client.send(Heartbeat(0.0))

    async def ignored() -> bool:
        return "came again" in lab.log("server")

    await wait_in_lab(ignored, 10, "the repeat ignored")
    assert copies == [1, 2]
    status = await server.status()
    row = next(r for r in status["workers"] if r["name"] == "with-board")
    assert row["compression"]["updates_shared"] == 2  # copied out: the NaN one and the good
    assert status["updates_applied"] == 1 and status["updates_rejected"] == 2
    # a slot named by a frame that carries an element too: refused, its element given back
    await client.send(
        Update(1, lease.lease_id, 384, 128, 1.0, 0, 0.01, np.ones(LAYOUT.size, "f4"), slot=0)
    )
    refusal = await client.receive(ErrorMessage)
    assert "names slot 0 of its update board and carries an element" in refusal.text
    pool = server.server.coordinator.pool
    await wait_in_lab(lambda: pool.in_use == 0, 10, "every element given back")
    writer.close()
    await client.close()

    async def released() -> bool:
        return server.server.coordinator.boards.updates.used == 0

    await wait_in_lab(released, 10, "the board released with its worker")

    # a peer that asked for no update board names a slot: refused, nothing applied
    plain = await AsyncRawClient.connect(server.port, "no-board")
    welcome = await plain.handshake(())
    assert "update_board" not in welcome.codecs
    await _slot_refused(plain)
    await plain.close()

    # one that cannot read the weights board (another /proc) cannot open its update board
    # either: the server gives it back at once, and a slot it names is refused
    blind = await AsyncRawClient.connect(server.port, "no-proc")
    welcome = await blind.handshake((BOARD, UPDATE_BOARD))
    assert "update_board" in welcome.codecs
    assert server.server.coordinator.boards.updates.used > 0
    await blind.send(Resync("no such file", no_board=True))
    await wait_in_lab(released, 10, "the board given back on no_board")
    await _slot_refused(blind)
    await blind.close()


async def _slot_refused(client: AsyncRawClient) -> None:
    """An update in slot 0 of an update board the peer has not got: refused, not fatal."""
    await client.receive(Weights)
    lease = await client.receive(Lease)
    await _update_in(client, lease, 0, 0)
    refusal = await client.receive(ErrorMessage)
    assert not refusal.fatal and "slot 0 of an update board this worker has not got" in refusal.text


async def test_workers_train_with_their_updates_through_boards(lab: Lab) -> None:
    before = memfd_mappings("snet-update-board")
    server = await lab.server("--mode", "async", "--epochs", "1", "--min-workers", "2",
                              *SMALL_JOB)  # fmt: skip
    workers = [lab.worker(server, name) for name in ("w1", "w2")]  # shared: the default
    assert await server.wait(120) == "trained"
    assert all([await w.wait(30) == 0 for w in workers])
    status = server.final_status()
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]  # every frame applied once
    for row in status["workers"]:
        shared, updates = row["compression"]["updates_shared"], row["compression"]["updates"]
        # each from its board but when the slot's last update was not settled yet
        assert updates > 40 and shared >= updates - 4, row["compression"]
    assert status["compression"]["updates_shared"] >= status["updates_applied"] - 8
    assert server.server.coordinator.boards.updates.used == 0  # both released
    # and unmapped on the workers' side too, though their backends live on (a worker that
    # reconnects keeps its backend: a mapping held by a view in it stayed for good)
    assert memfd_mappings("snet-update-board") == before


async def test_no_update_board_where_a_fault_switch_may_drop_updates(lab: Lab) -> None:
    """Updates a fault switch drops are settled by an estimate that could run ahead of the
    updates received, and a worker would reuse a slot the server has not copied yet."""
    server = await lab.server("--mode", "async", "--epochs", "1", "--faults", "drop:update:5",
                              *SMALL_JOB)  # fmt: skip
    client = await AsyncRawClient.connect(server.port, "faulty")
    welcome = await client.handshake((BOARD, UPDATE_BOARD))
    assert welcome.codecs["weights"] == SHARED and "update_board" not in welcome.codecs
    await client.close()
