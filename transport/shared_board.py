"""The weights board: a server's newest weights in shared memory for workers on its machine.

A worker on the server's own machine is sent each new copy of the weights as any other
(a 262 kB frame for the default job, after every step): the server copies it into the
socket, the kernel through loopback TCP, the worker out of it, about 70 us of CPU a copy
on both sides together. A worker that asks for ``--weights-codec shared`` and connects
from the server's machine (a loopback address) is told instead where the server keeps a
board of a few slots in shared memory: the server writes each version there once, for
all such workers, and sends each a ``Weights`` that names the slot and carries no
element; the worker copies the slot out and checks the copy against the message's
digest (protocol/README.md, section 8.8, "The weights board").

The board is an anonymous file (``memfd_create``) that only the server holds open: it
goes when the server does, leaves nothing behind on a crash, and is reached as
``/proc/PID/fd/N``, which the kernel opens only for the server's own user (or root); its
size is sealed, and a worker maps only a sealed board (one that could shrink under its
mapping would end it with SIGBUS). Its
header names it (``MAGIC``), carries a random nonce the worker must find there (the one
the Welcome told it: a path that resolves to another file, in a container with another
/proc, is not taken for it) and its shape. Each slot starts with the version it holds:
the server writes -1 there before it overwrites the values and the version after, and a
worker reads the version before and after copying, so a slot overwritten meanwhile (a
worker that fell ``slots`` steps behind) is a ``CodecError``, not a mixed copy; the
worker then asks for a full copy (``Resync``), as after any weights it cannot use.

The server only writes the weights board and never reads what is in it, so nothing
written there by anyone else reaches its state; a worker maps it read-only.

**Update boards** go the other way (``UpdateBoard``): the server makes one for each such
worker whose updates are float32 (all of them together within
``MAX_UPDATE_BOARDS_BYTES``); the worker maps it read-write, writes an update into a slot
and sends a frame naming it; the server copies the slot into an element of its own as
the frame arrives, once the checks that need no values have passed (server/intake.py),
and checks that copy as any update (what the worker writes there later is never read);
the board is closed when its connection ends.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import secrets
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from snet.protocol.errors import CodecError, SlotOverwritten
from snet.protocol.network import ELEMENT_DTYPE

MAGIC = b"SNETBRD1"
UPDATE_MAGIC = b"SNETUPD1"  # a worker's update board
# All of a server's update boards together (a local worker's: 4-16 slots of its element).
MAX_UPDATE_BOARDS_BYTES = 64 << 20
UPDATE_SLOTS_OVER_FLIGHT = 2  # an update board's slots beyond its worker's max in flight
HEADER = struct.Struct("<8s16sqq")  # magic, nonce, slots, values per slot
HEADER_BYTES = 64  # the header, padded: slots start on a cache line
SLOT_HEADER_BYTES = 64  # each slot's version (int64), padded likewise
MAX_BOARD_BYTES = 128 << 20  # what one board may take of the machine's memory
MAX_SLOTS = 16
MIN_SLOTS = 4  # fewer: a worker a few steps behind would ask for full copies
PATH = re.compile(r"/proc/[0-9]{1,10}/fd/[0-9]{1,10}")
# A board's size is sealed (memfd seals): a mapping of a file that shrank would end its
# reader with SIGBUS, whoever of the server's user truncated it.
# (Linux's: elsewhere 0, and no board is made: no memfd_create either.)
SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)


def board_slots(values: int) -> int:
    """Slots of a board for elements of ``values`` float32 values: as many as fit in
    ``MAX_BOARD_BYTES`` up to ``MAX_SLOTS``, or 0 when not even ``MIN_SLOTS`` do (no
    board: such a worker gets its weights over the socket)."""
    slot = SLOT_HEADER_BYTES + values * ELEMENT_DTYPE.itemsize
    slots = min(MAX_SLOTS, (MAX_BOARD_BYTES - HEADER_BYTES) // slot)
    return slots if slots >= MIN_SLOTS else 0


def _size(slots: int, values: int) -> int:
    return HEADER_BYTES + slots * (SLOT_HEADER_BYTES + values * ELEMENT_DTYPE.itemsize)


def _slot_views(buffer: Any, slots: int, values: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(version, values) views of each slot of a mapped board."""
    views = []
    stride = SLOT_HEADER_BYTES + values * ELEMENT_DTYPE.itemsize
    for slot in range(slots):
        start = HEADER_BYTES + slot * stride
        version = np.frombuffer(buffer, dtype="<i8", count=1, offset=start)
        data = np.frombuffer(buffer, ELEMENT_DTYPE, values, start + SLOT_HEADER_BYTES)
        views.append((version, data))
    return views


@dataclass(frozen=True)
class BoardInfo:
    """Where a worker finds a board, as ``Welcome.codecs["board"]`` carries it."""

    path: str
    nonce: str  # hex
    slots: int
    values: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "nonce": self.nonce, "slots": self.slots, "values": self.values}

    @classmethod
    def from_dict(cls, data: object, values: int) -> BoardInfo:
        """Checked: a board of the job's element (``values``), a /proc path, a nonce.
        ``CodecError`` naming what is wrong."""
        if not isinstance(data, dict):
            raise CodecError("the weights board is described by no table")
        path, nonce, slots = data.get("path"), data.get("nonce"), data.get("slots")
        if not (isinstance(path, str) and PATH.fullmatch(path)):
            raise CodecError(f"weights board path {path!r:.60} is not /proc/PID/fd/N")
        if not (isinstance(nonce, str) and re.fullmatch(r"[0-9a-f]{32}", nonce)):
            raise CodecError("the weights board's nonce is not 32 hex digits")
        if not (isinstance(slots, int) and MIN_SLOTS <= slots <= MAX_SLOTS):
            raise CodecError(f"a weights board of {slots!r:.20} slots")
        if data.get("values") != values:
            raise CodecError(f"a weights board of {data.get('values')!r:.20} values, not {values}")
        return cls(path, nonce, slots, values)


class SlotFile:
    """A server's board: a sealed anonymous file of ``slots`` slots of ``values`` values,
    named by its header's ``magic``, reached by its peers as /proc/PID/fd/N."""

    def __init__(self, values: int, slots: int, magic: bytes, name: str) -> None:
        """``name``: the file's, as /proc/PID/maps shows it. ``OSError`` where the system
        has no sealed anonymous files (``memfd_create``: Linux)."""
        if not SEALS:
            raise OSError("no sealed anonymous files here (memfd_create: Linux)")
        self.values, self.slots = values, slots
        self.nonce = secrets.token_bytes(16)
        self._fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self._fd, _size(slots, values))
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)  # none later
            self._map = mmap.mmap(self._fd, _size(slots, values))
        except BaseException:
            os.close(self._fd)
            raise
        HEADER.pack_into(self._map, 0, magic, self.nonce, slots, values)
        self._slots = _slot_views(self._map, slots, values)
        for version, _ in self._slots:
            version[0] = -1
        self.closed = False

    @property
    def info(self) -> BoardInfo:
        return BoardInfo(f"/proc/{os.getpid()}/fd/{self._fd}", self.nonce.hex(), self.slots,
                         self.values)  # fmt: skip

    def described(self) -> dict[str, Any]:
        """``Welcome.codecs``' entry: where a worker finds this board."""
        return self.info.to_dict()

    def close(self) -> None:
        """Free it (the workers' mappings keep their pages until they unmap them)."""
        if self.closed:
            return
        self.closed = True
        self._slots = []
        self._map.close()
        os.close(self._fd)


class WeightsBoard(SlotFile):
    """The server's side: the board it writes each version of the weights into once."""

    def __init__(self, values: int, slots: int) -> None:
        super().__init__(values, slots, MAGIC, "snet-weights-board")
        # what each slot holds, kept here: the server never reads the board (anyone of its
        # user could write a version there and have it never written)
        self._held = [-1] * slots
        self.written = 0  # versions written

    def publish(self, version: int, element: np.ndarray) -> int:
        """The slot holding ``version`` of the weights, written there unless it already
        is (each version once, however many workers read it); -1 once closed (the
        server stopping: a copy still queued goes in its frame)."""
        if self.closed:
            return -1
        slot = version % self.slots
        if self._held[slot] != version:
            stored, data = self._slots[slot]
            stored[0] = -1  # a reader that started on the old version sees it change
            np.copyto(data, element)
            stored[0] = version
            self._held[slot] = version
            self.written += 1
        return slot


class BoardReader:
    """A worker's side: the server's board, mapped read-only (``writable``: its update
    board, which it writes and the server reads)."""

    def __init__(self, info: BoardInfo, magic: bytes = MAGIC, writable: bool = False) -> None:
        """Open and check the board ``info`` names; ``CodecError`` when it cannot be
        opened or is not that board (another file, another server, another shape)."""
        size = _size(info.slots, info.values)
        flags = os.O_RDWR if writable else os.O_RDONLY
        prot = mmap.PROT_READ | mmap.PROT_WRITE if writable else mmap.PROT_READ
        try:
            # not blocking: behind a port forward, /proc/PID/fd/N of another PID namespace
            # may name anything of this side's, a pipe with no writer among them
            fd = os.open(info.path, flags | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                status = os.fstat(fd)
                if not stat.S_ISREG(status.st_mode) or status.st_size != size:
                    raise CodecError(f"{info.path} is not a board of this job")
                if not SEALS or fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
                    raise CodecError(f"{info.path} is not sealed: it could shrink under a reader")
                self._map = mmap.mmap(fd, size, prot=prot)
            finally:
                os.close(fd)
        except OSError as exc:
            raise CodecError(f"cannot open the board {info.path}: {exc.strerror}") from exc
        found, nonce, slots, values = HEADER.unpack_from(self._map, 0)
        if (found, nonce.hex(), slots, values) != (magic, info.nonce, info.slots, info.values):
            self._map.close()
            raise CodecError(f"{info.path} is not the board the server named")
        self.info = info
        self._slots = _slot_views(self._map, slots, values)

    def read_into(self, slot: int, version: int, out: np.ndarray) -> None:
        """Copy ``version`` of the weights from ``slot`` into ``out``; ``CodecError`` when
        the slot does not hold it, before or after the copy."""
        if not 0 <= slot < len(self._slots):
            raise CodecError(f"weights board slot {slot} of {len(self._slots)}")
        stored, data = self._slots[slot]
        held = int(stored[0])
        if held == version:
            np.copyto(out, data)
        overwritten = int(stored[0]) != version  # while copying: a mixed copy
        # no view of the board in the frame a raise keeps: a log record holding the error
        # (a test's captured log) kept the mapping from closing ("exported pointers exist")
        del stored, data
        if held != version:
            raise SlotOverwritten(f"weights board slot {slot} holds version {held}, not {version}")
        if overwritten:
            raise SlotOverwritten(f"weights board slot {slot} was overwritten while read")

    def write(self, slot: int, gradient: np.ndarray) -> None:
        """An update board's: put ``gradient`` in ``slot`` for the server to copy out."""
        np.copyto(self._slots[slot][1], gradient)

    def close(self) -> None:
        self._slots = []
        self._map.close()


class UpdateBoard(SlotFile):
    """The server's side of one local worker's update board: the worker writes an update
    into a slot and sends a frame naming it; the server copies it out, into an element of
    its own, in the turn the frame arrives, before anything reads the values (whatever
    the worker writes there later is not read); the worker reuses a slot only once the
    server has settled the update that used it last (``UPDATE_SLOTS_OVER_FLIGHT`` more
    slots than updates in flight), and sends an update in its frame when none is free."""

    def __init__(self, values: int, slots: int) -> None:
        super().__init__(values, slots, UPDATE_MAGIC, "snet-update-board")

    def copy_out(self, slot: int, out: np.ndarray) -> None:
        """``out`` = what ``slot`` holds now; ``CodecError`` for a slot it does not have."""
        if self.closed or not 0 <= slot < self.slots:
            raise CodecError(f"update board slot {slot} of {self.slots}")
        np.copyto(out, self._slots[slot][1])


class UpdateBoards:
    """A server's update boards, one per local worker that asked, all together within
    ``MAX_UPDATE_BOARDS_BYTES`` (beyond it a worker sends its updates in frames)."""

    def __init__(self, values: int) -> None:
        self.values = values
        self.used = 0  # bytes of the boards open
        self._open: set[UpdateBoard] = set()
        self.closed = False  # the server stops: none made any more

    def make(self, max_in_flight: int) -> UpdateBoard | None:
        """A board for a worker with ``max_in_flight`` updates in flight, or None (no
        room left, no shared memory here)."""
        slots = min(MAX_SLOTS, max(MIN_SLOTS, max_in_flight + UPDATE_SLOTS_OVER_FLIGHT))
        size = _size(slots, self.values)
        if self.closed or self.used + size > MAX_UPDATE_BOARDS_BYTES:
            return None
        try:
            board = UpdateBoard(self.values, slots)
        except (OSError, AttributeError):
            return None
        self.used += size
        self._open.add(board)
        return board

    def release(self, board: UpdateBoard) -> None:
        """Its worker has gone: the board is closed, its bytes free for another."""
        if board in self._open:
            self._open.discard(board)
            self.used -= _size(board.slots, board.values)
            board.close()

    def close(self) -> None:
        """The server stops: none is made any more. Those open stay open until their
        connections end (``release``): their workers may still be sending until told to
        leave, and a board closed under one would lose its update."""
        self.closed = True


class ServerBoards:
    """A server's boards: its weights board, made when the first worker asks for it (a
    server whose workers all get their weights in frames has none; None where it cannot
    be made), and its workers' update boards."""

    def __init__(self, values: int) -> None:
        self.values = values
        self.slots = board_slots(values)
        self._board: WeightsBoard | None = None
        self.unavailable = "" if self.slots else "the element is too large for a board"
        self.updates = UpdateBoards(values)  # the local workers' update boards

    def weights(self) -> WeightsBoard | None:
        if self._board is None and not self.unavailable:
            try:
                self._board = WeightsBoard(self.values, self.slots)
            except (OSError, AttributeError) as exc:  # no memfd_create (not Linux)
                self.unavailable = f"no shared memory here ({exc})"
        return self._board

    def close(self) -> None:
        """Close the boards (the server stops): none is made again."""
        self.unavailable = "the server is stopping"
        self.updates.close()
        if self._board is not None:
            self._board.close()
            self._board = None
