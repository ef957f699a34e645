"""The weights board (transport/shared_board.py): a worker on the server's machine that asks
for ``--weights-codec shared`` reads each version of the weights from shared memory the
server wrote it to once, and anything short of the very copy the server announced (a slot
holding another version, one overwritten while read, a board it cannot open) is refused
and answered with a full copy in the frame, never used."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from snet.client.buffers import WeightsBox
from snet.protocol.codecs.weights import SHARED, WeightsEncoder
from snet.protocol.digest import weights_digest
from snet.protocol.errors import CodecError, SlotOverwritten
from snet.protocol.messages import Lease, Resync, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.security import is_loopback
from snet.transport import shared_board
from snet.transport.shared_board import (
    MAX_SLOTS,
    BoardInfo,
    BoardReader,
    ServerBoards,
    WeightsBoard,
    board_slots,
)

from async_raw import AsyncRawClient
from helpers import SMALL_JOB, memfd_mappings
from inprocess import Lab
from inprocess import wait_until as wait_in_lab

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


def _element(seed: int, values: int = LAYOUT.size) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(values).astype(np.float32)


def _weights(version: int, element: np.ndarray) -> Weights:
    return Weights(version, 0, 0.1, 0, element, digest=weights_digest(element))


@pytest.fixture
def board() -> Any:
    made = WeightsBoard(10, 4)
    yield made
    made.close()


def test_a_version_is_written_once_and_read_back_exactly(board: WeightsBoard) -> None:
    reader = BoardReader(BoardInfo.from_dict(board.described(), 10))
    first, out = _element(1, 10), np.empty(10, np.float32)
    assert board.publish(5, first) == 1 and board.publish(5, first) == 1  # 5 % 4 slots
    assert board.written == 1  # the second worker's copy of version 5 cost nothing
    reader.read_into(1, 5, out)
    assert np.array_equal(out, first)
    board.publish(9, _element(2, 10))  # 9 % 4: the same slot, overwritten
    with pytest.raises(SlotOverwritten, match="slot 1 holds version 9, not 5") as kept:
        reader.read_into(1, 5, out)  # expected of a worker behind: its own kind (info)
    with pytest.raises(CodecError, match="slot 4 of 4") as raised:
        reader.read_into(4, 5, out)
    assert not isinstance(raised.value, SlotOverwritten)  # a fault: a warning
    # the errors kept (as a captured log record keeps them): the mapping still closes
    # ("cannot close exported pointers exist": a view of the board in their frames)
    assert kept.value.__traceback__ is not None and raised.value.__traceback__ is not None
    reader.close()


def test_the_server_writes_what_it_holds_not_what_the_board_says(board: WeightsBoard) -> None:
    """Anyone of the server's user may write the board: a version set there in advance
    must not keep the server from writing that version."""
    import os

    path = board.described()["path"]
    fd = os.open(path, os.O_RDWR)
    try:  # slot 1's version field, just past the 64-byte header: "version 5 is here"
        os.pwrite(fd, (5).to_bytes(8, "little"), 64 + 1 * (64 + 40))
    finally:
        os.close(fd)
    element, out = _element(9, 10), np.empty(10, np.float32)
    assert board.publish(5, element) == 1 and board.written == 1
    reader = BoardReader(BoardInfo.from_dict(board.described(), 10))
    reader.read_into(1, 5, out)
    assert np.array_equal(out, element)
    reader.close()


def test_a_closed_board_takes_nothing_and_its_copies_go_in_frames(board: WeightsBoard) -> None:
    layout = ElementLayout(((10,),))
    encoder = WeightsEncoder(SHARED, layout, board)
    encoder.prepare(_weights(0, _element(1, 10)))  # the first, whole
    board.close()
    board.close()  # twice: harmless
    assert board.publish(1, _element(2, 10)) == -1
    late = encoder.prepare(_weights(1, _element(2, 10)))  # queued when the server stopped
    assert isinstance(late, Weights) and late.slot == -1 and late.element.size == 10
    lazy = ServerBoards(10)
    lazy.close()
    assert lazy.weights() is None and lazy.unavailable == "the server is stopping"


def test_a_path_that_is_no_file_is_refused_at_once(board: WeightsBoard) -> None:
    """Behind a port forward /proc/PID/fd/N may name a pipe of this side's: never waited on."""
    import os

    read, write = os.pipe()
    os.close(write)
    try:
        described = {**board.described(), "path": f"/proc/{os.getpid()}/fd/{read}"}
        with pytest.raises(CodecError, match="is not a board of this job"):
            BoardReader(BoardInfo.from_dict(described, 10))
    finally:
        os.close(read)


def test_the_board_is_asked_for_in_a_capability_an_older_server_ignores() -> None:
    from snet.protocol.codecs.handshake import BOARD, agree_codecs, worker_capabilities

    asked = worker_capabilities("", SHARED)
    assert BOARD in asked and not any(c.startswith("weights:") for c in asked)
    assert agree_codecs(asked, "none")["weights"] == SHARED
    assert agree_codecs(worker_capabilities("", "none"), "none")["weights"] == "none"
    assert agree_codecs((BOARD, "weights:fp16"), "none")["weights"] == "fp16"  # as asked


def test_a_slot_overwritten_while_it_is_read_is_refused(
    board: WeightsBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = BoardReader(BoardInfo.from_dict(board.described(), 10))
    board.publish(2, _element(3, 10))
    copy = np.copyto

    def racing(out: np.ndarray, source: np.ndarray) -> None:
        copy(out, source)
        monkeypatch.setattr(shared_board.np, "copyto", copy)  # the server's own copy
        board.publish(6, _element(4, 10))  # the server, 4 steps on, in the same slot

    monkeypatch.setattr(shared_board.np, "copyto", racing)
    with pytest.raises(CodecError, match="overwritten while read"):
        reader.read_into(2, 2, np.empty(10, np.float32))
    reader.close()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"nonce": "0" * 32}, "is not the board the server named"),
        ({"values": 11}, "a weights board of 11 values, not 10"),
        ({"path": "/etc/passwd"}, "is not /proc/PID/fd/N"),
        ({"path": "/proc/1/fd/999999"}, "cannot open the board"),
        ({"slots": 1000}, "a weights board of 1000 slots"),
        ({"nonce": "zz"}, "nonce is not 32 hex digits"),
    ],
)
def test_a_board_is_opened_only_if_it_is_the_one_named(
    board: WeightsBoard, change: dict[str, Any], why: str
) -> None:
    described = {**board.described(), **change}
    with pytest.raises(CodecError, match=why):
        BoardReader(BoardInfo.from_dict(described, 10))
    with pytest.raises(CodecError, match="described by no table"):
        BoardInfo.from_dict(None, 10)


def test_an_unsealed_file_is_not_taken_for_a_board(board: WeightsBoard) -> None:
    """A file that could shrink under the mapping would end its reader with SIGBUS."""
    import os

    described = board.described()
    size = os.fstat(int(described["path"].rsplit("/", 1)[1])).st_size
    fd = os.memfd_create("not-a-board")  # the same bytes, and no seals
    try:
        with open(described["path"], "rb") as original:
            os.write(fd, original.read(size))
        unsealed = {**described, "path": f"/proc/{os.getpid()}/fd/{fd}"}
        with pytest.raises(CodecError, match="is not sealed: it could shrink"):
            BoardReader(BoardInfo.from_dict(unsealed, 10))
    finally:
        os.close(fd)


def test_a_board_is_bounded_and_made_only_when_asked_for() -> None:
    assert board_slots(LAYOUT.size) == MAX_SLOTS  # the default job's: 16 slots of 262 kB
    assert board_slots(50_000_000) == 0  # 200 MB elements: none, their copies go in frames
    lazy = ServerBoards(50_000_000)
    assert lazy.weights() is None and "too large" in lazy.unavailable
    lazy = ServerBoards(10)
    made = lazy.weights()
    assert made is not None and lazy.weights() is made  # one board for every worker
    lazy.close()
    lazy.close()  # and closing twice is harmless


def test_only_a_loopback_peer_is_local() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.10") and is_loopback("::1")
    assert not any(is_loopback(a) for a in ("10.0.0.7", "192.168.1.2", "?", "/tmp/sock", "fe80::1"))


def test_the_encoder_sends_slots_after_a_first_full_copy(board: WeightsBoard) -> None:
    layout = ElementLayout(((10,),))
    encoder = WeightsEncoder(SHARED, layout, board)
    assert encoder.form == SHARED and WeightsEncoder(SHARED, layout).form == "none"
    first = encoder.prepare(_weights(0, _element(5, 10)))
    assert isinstance(first, Weights) and first.slot == -1 and first.element.size == 10
    second = encoder.prepare(_weights(1, _element(6, 10)))
    assert isinstance(second, Weights) and second.slot == 1 and second.element.size == 0
    assert second.digest  # the worker checks its copy against it
    encoder.missed_versions()  # a slot is a whole copy: nothing changes
    assert isinstance(third := encoder.prepare(_weights(2, _element(7, 10))), Weights)
    assert third.slot == 2
    encoder.request_full()  # a Resync: one copy in the frame, then slots again
    assert [m.slot for m in (encoder.prepare(_weights(v, _element(v, 10))) for v in (3, 4))
            if isinstance(m, Weights)] == [-1, 0]  # fmt: skip
    assert (encoder.copies, encoder.full_copies, encoder.shared_copies) == (5, 2, 3)
    assert encoder.raw_bytes == encoder.payload_bytes == 2 * 40  # slots cross no wire
    assert encoder.board_unreadable() and encoder.form == "none"
    assert not encoder.board_unreadable()  # once
    assert all(m.slot == -1 for m in (encoder.prepare(_weights(v, _element(v, 10))) for v in (5, 6))
               if isinstance(m, Weights))  # fmt: skip


def test_the_box_uses_a_slot_only_as_announced(board: WeightsBoard) -> None:
    layout = ElementLayout(((10,),))
    reader = BoardReader(BoardInfo.from_dict(board.described(), 10))
    box = WeightsBox(layout, asyncio.Event(), board=reader)
    element = _element(8, 10)
    slot = board.publish(3, element)
    box.receive(Weights(3, 0, 0.1, 0, np.zeros(0, "<f4"), digest=weights_digest(element),
                        slot=slot))  # fmt: skip
    newest = box.take_newest()
    assert newest is not None and np.array_equal(newest.flat, element)
    lied = Weights(3, 0, 0.1, 0, np.zeros(0, "<f4"), digest="00000000", slot=slot)
    with pytest.raises(CodecError, match="have digest"):
        box.receive(lied)
    with pytest.raises(CodecError, match="holds version 3, not 7"):
        box.receive(Weights(7, 0, 0.1, 0, np.zeros(0, "<f4"), slot=slot))
    assert box.undecodable == 2 and box.newest_version == 3  # neither was filed
    without = WeightsBox(layout, asyncio.Event())
    with pytest.raises(CodecError, match="no board was opened"):
        without.receive(Weights(3, 0, 0.1, 0, np.zeros(0, "<f4"), slot=slot))
    reader.close()


async def test_a_raw_peer_on_this_machine_is_sent_slots_until_it_says_it_cannot_read(
    lab: Lab,
) -> None:
    server = await lab.server("--mode", "async", "--epochs", "1", "--linger-seconds", "30",
                              *SMALL_JOB)  # fmt: skip
    client = await AsyncRawClient.connect(server.port, "raw-shared")
    welcome = await client.handshake(("board:weights",))
    assert welcome.codecs["weights"] == SHARED
    info = BoardInfo.from_dict(welcome.codecs["board"], LAYOUT.size)
    first = await client.receive(Weights)
    assert first.slot == -1 and first.element.size == LAYOUT.size  # whole, in the frame
    lease = await client.receive(Lease)
    gradient = np.ones(LAYOUT.size, np.float32)
    await client.send(Update(0, lease.lease_id, 0, 128, 1.0, 0, 0.01, gradient))
    shared = await client.receive(Weights)
    while shared.version < 1:
        shared = await client.receive(Weights)
    assert shared.slot >= 0 and shared.element.size == 0 and shared.digest
    out = np.empty(LAYOUT.size, np.float32)
    reader = BoardReader(info)
    reader.read_into(shared.slot, shared.version, out)
    assert weights_digest(out) == shared.digest  # exactly the server's weights
    reader.close()
    unreadable = Resync("no such file", no_board=True)  # as a worker in another /proc says
    await client.send(unreadable)
    await client.send(unreadable)  # twice: nothing more comes of it
    await client.send(Update(1, lease.lease_id, 128, 128, 1.0, 0, 0.01, gradient))
    later = await client.receive(Weights)
    while later.version < 2:
        later = await client.receive(Weights)
    assert later.slot == -1 and later.element.size == LAYOUT.size  # frames from now on
    row = next(r for r in (await server.status())["workers"] if r["name"] == "raw-shared")
    assert row["compression"]["weights_codec"] == "none"
    assert row["compression"]["weights_shared"] == 1
    await client.close()


async def test_workers_train_on_the_board_and_one_that_cannot_read_it_on_frames(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = memfd_mappings("snet-weights-board")
    server = await lab.server("--mode", "async", "--epochs", "1", "--min-workers", "2",
                              *SMALL_JOB)  # fmt: skip
    opened = BoardReader.__init__

    def refused_for_one(self: BoardReader, info: BoardInfo, *args: Any, **kwargs: Any) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_name() == "blind":  # (its update board: not tried)
            raise CodecError("cannot open the weights board: as in another container")
        opened(self, info, *args, **kwargs)

    monkeypatch.setattr(BoardReader, "__init__", refused_for_one)
    blind = lab.worker(server, "blind", "--weights-codec", "shared")

    async def told() -> bool:  # nothing trains before the second worker joins
        rows = (await server.status())["workers"]
        return any(r["compression"]["weights_codec"] == "none" for r in rows)

    await wait_in_lab(told, 30, "the server told that the board cannot be read")
    seeing = lab.worker(server, "seeing", "--weights-codec", "shared")
    assert await server.wait(120) == "trained"
    assert await seeing.wait(30) == 0 and await blind.wait(30) == 0
    # the server's board closed, each worker's mapping of it too
    assert memfd_mappings("snet-weights-board") == before
    status = server.final_status()
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]  # every frame applied once
    rows = {r["name"]: r["compression"] for r in status["workers"]}
    assert rows["seeing"]["weights_codec"] == SHARED and rows["seeing"]["weights_shared"] > 10
    # its first copy, in the frame, and one for each slot it found overwritten (a worker
    # 16 steps behind: none in a run like this, but the loop is shared with the others)
    asked = lab.log("server").count("worker seeing asks for a full copy")
    assert rows["seeing"]["weights_full_copies"] == 1 + asked
    assert rows["blind"]["weights_codec"] == "none" and rows["blind"]["weights_shared"] == 0
    assert status["compression"]["weights_shared"] == rows["seeing"]["weights_shared"]
    assert "cannot read the server's weights board" in lab.log("blind")
    assert "weights none)" in lab.log("blind")  # it joined on frames, and says so


def test_status_says_how_many_copies_went_through_the_board() -> None:
    from snet.cli.status import _compression_line

    total = {"updates": 10, "update_codecs": {"none": 2}, "bytes_per_update": 262361,
             "received_ratio": 1.0, "sent_ratio": 1.0, "weights_shared": 9}  # fmt: skip
    (line,) = _compression_line(total)
    # uncompressed: no "1.0x fewer bytes" (a board's update frame is its own float32 count)
    assert line == ("compression: none, 262361 B an update on the wire; 9 weights copies "
                    "through the board")  # fmt: skip
    assert "board" not in _compression_line({**total, "weights_shared": 0})[0]
    (both,) = _compression_line({**total, "updates_shared": 8})
    assert both.endswith("through the board; 8 updates through update boards")
    squeezed = {**total, "update_codecs": {"int8": 2}, "received_ratio": 3.9}
    (line,) = _compression_line(squeezed)
    assert line.startswith("compression: updates int8 x2, 262361 B each, 3.9x fewer bytes")


@pytest.mark.parametrize("on_board", [True, False])
def test_a_full_copy_asked_from_the_board_is_an_info_line_elsewhere_a_warning(
    on_board: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker behind on a loaded machine finds its slot gone round and asks for a full
    copy: its own line is info (client/connection.py), and the server's said WARNING, one
    per worker and version, as many as the worker's had been in a loaded demo. A worker
    on frames that cannot use its copy (a delta it cannot apply) is still a warning."""
    from snet.server.ledger import CompressionLedger
    from snet.server.session import WorkerSession

    layout = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
    board = WeightsBoard(layout.size, 4) if on_board else None
    try:
        encoder = WeightsEncoder(SHARED if on_board else "none", layout, board)
        session = WorkerSession(1, "w", "", "numpy", (), lambda _: None, lambda _: None,
                                ledger=CompressionLedger("none", encoder))  # fmt: skip
        with caplog.at_level("INFO", logger="snet.server"):
            assert session.full_copy_asked(7, "weights board slot 3 holds version 11, not 7")
            assert not session.full_copy_asked(7, "again")  # once a version
        (record,) = [r for r in caplog.records if "asks for a full copy" in r.getMessage()]
        assert record.levelname == ("INFO" if on_board else "WARNING")
    finally:
        if board is not None:
            board.close()
