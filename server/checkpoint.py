"""Checkpoint files: the training state on disk, written so that a crash never loses one.

A checkpoint is one file, ``ckpt-NNNNNNNN.snet`` (a sequence number that only grows, also
across restarts), laid out as::

    b"SNETCKPT" | format u32 | header length u64 | payload length u64     (28 bytes)
    header: JSON, the state with every array replaced by {"__array__": i}
    payload: the arrays' raw bytes (little-endian, C order), one after another
    blake2b-256 of everything above                                     (32 bytes)

The state is plain data (dicts, lists, numbers, strings, arrays), as the server's parts
give it (``checkpoint_state()``). A file is written crash-consistently: to a uniquely
named temporary file in the same directory, flushed and fsync'd, renamed over its final
name, and then the directory is fsync'd so the rename itself survives a power cut. A file
that was torn (a kill during its write that left it half there) or changed since fails
the checksum when read, and the previous checkpoint is used; the last ``keep`` files are
kept for that.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from snet.protocol.errors import ConfigError
from snet.transport.files import unfinished_writes, write_atomically

log = logging.getLogger("snet.server")

CHECKPOINTS_DIR = "checkpoints"  # in the out-dir: where a run keeps what it resumes from
MAGIC = b"SNETCKPT"
FORMAT = 1
PREFIX = struct.Struct("<8sIQQ")
CHECKSUM_BYTES = 32
# as path() writes them (8 digits, more past 10**8), ASCII digits only
NAME = re.compile(r"^ckpt-([0-9]{8}|[1-9][0-9]{8,})\.snet$")
DAMAGED = ".damaged"  # a checkpoint that did not read back, set aside (out of NAME)


class CheckpointDamaged(ConfigError):
    """A checkpoint file that is torn, corrupt or not a checkpoint at all."""


def _checksum(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=CHECKSUM_BYTES).digest()


def _flatten(value: Any, arrays: list[np.ndarray]) -> Any:
    """``value`` with each array replaced by a reference into ``arrays``."""
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {"__array__": len(arrays) - 1}
    if isinstance(value, dict):
        return {str(key): _flatten(item, arrays) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_flatten(item, arrays) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _unflatten(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return arrays[value["__array__"]]
        return {key: _unflatten(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_unflatten(item, arrays) for item in value]
    return value


def encode_checkpoint(state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file holding ``state``."""
    arrays: list[np.ndarray] = []
    tree = _flatten(state, arrays)
    little = [np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")) for a in arrays]
    described = [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in little]
    header = json.dumps({"state": tree, "arrays": described}).encode()
    payload_length = sum(a.nbytes for a in little)
    parts: list[bytes | memoryview] = [PREFIX.pack(MAGIC, FORMAT, len(header), payload_length)]
    parts.append(header)
    parts.extend(a.data.cast("B") for a in little if a.nbytes)
    checksum = hashlib.blake2b(digest_size=CHECKSUM_BYTES)  # as _checksum, over the parts:
    for part in parts:  # the state is copied into the file's bytes once, not twice
        checksum.update(part)
    parts.append(checksum.digest())
    return b"".join(parts)


def decode_checkpoint(data: bytes, name: str = "checkpoint") -> dict[str, Any]:
    """The state in a checkpoint file's bytes (``CheckpointDamaged`` if it is not whole)."""
    if len(data) < PREFIX.size + CHECKSUM_BYTES:
        raise CheckpointDamaged(f"{name}: truncated ({len(data)} bytes)")
    magic, form, header_length, payload_length = PREFIX.unpack_from(data)
    if magic != MAGIC or form != FORMAT:
        raise CheckpointDamaged(f"{name}: not an snet checkpoint of format {FORMAT}")
    end = PREFIX.size + header_length + payload_length
    if len(data) != end + CHECKSUM_BYTES:
        raise CheckpointDamaged(
            f"{name}: truncated or extended ({len(data)} bytes, the header says "
            f"{end + CHECKSUM_BYTES})"
        )
    body = memoryview(data)[:end]
    if _checksum(body) != data[end:]:
        raise CheckpointDamaged(f"{name}: checksum mismatch (torn or changed)")
    try:
        header = json.loads(bytes(body[PREFIX.size : PREFIX.size + header_length]))
        arrays: list[np.ndarray] = []
        offset = PREFIX.size + header_length
        for described in header["arrays"]:
            dtype, shape = np.dtype(described["dtype"]), tuple(described["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            array = np.frombuffer(data, dtype, count, offset).reshape(shape).copy()
            arrays.append(array)
            offset += array.nbytes
        state: dict[str, Any] = _unflatten(header["state"], arrays)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{name}: unreadable header ({exc})") from exc
    return state


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back, and the damaged newer ones passed over to find it."""

    path: Path
    state: dict[str, Any]
    skipped: tuple[str, ...] = ()
    damaged: tuple[int, ...] = ()  # the numbers of those that did not read back whole


class CheckpointStore:
    """The checkpoint files of one out-dir: write the next, read the newest whole one."""

    def __init__(
        self, directory: Path, keep: int = 2, lost: Callable[[], bool] = lambda: False
    ) -> None:
        """``lost``: whether another process has taken the out-dir (server/service.py's
        lock); then nothing is written there (its next restart resumed our run, and our
        pruning ate its checkpoints)."""
        if keep < 1:
            raise ConfigError(f"keep must be at least 1 checkpoint, got {keep}")
        self.directory = directory
        self.keep = keep
        self.lost = lost
        self._unreadable: set[int] = set()  # numbers newest() could not read
        self._next = max(self.sequence_numbers(), default=0) + 1

    def sequence_numbers(self) -> list[int]:
        """The numbers of the checkpoint files present, oldest first."""
        if not self.directory.is_dir():
            return []
        found = (NAME.match(p.name) for p in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in found if match)

    def path(self, number: int) -> Path:
        return self.directory / f"ckpt-{number:08d}.snet"

    def write(self, state: dict[str, Any]) -> Path:
        """Write ``state`` as the next checkpoint, crash-consistently; drop all but the
        newest ``keep``. Runs in the checkpoint writer thread, never on the event loop."""
        if self.lost():  # (OutDirLock.keep, every second)
            raise OSError("the out-dir was taken by another process: nothing is written there")
        payload = encode_checkpoint(state)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(self._next)
        write_atomically(path, payload)
        self._next += 1
        # one this server could not read (a mode, an I/O error) stays, out of the count
        readable = [n for n in self.sequence_numbers() if n not in self._unreadable]
        for number in readable[: -self.keep]:
            self.path(number).unlink(missing_ok=True)
        return path

    def newest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that reads back whole (None when there is none at all).

        Damaged files are passed over with a warning; if every file is damaged that is a
        ``CheckpointDamaged`` error, since starting over silently would lose the run."""
        skipped: list[str] = []
        damaged: list[int] = []
        for number in reversed(self.sequence_numbers()):
            path = self.path(number)
            try:
                state = decode_checkpoint(path.read_bytes(), path.name)
            except CheckpointDamaged as exc:
                log.warning("%s; trying the previous checkpoint", exc)
                skipped.append(str(exc))
                damaged.append(number)
                continue
            except OSError as exc:
                log.warning("cannot read %s (%s); trying the previous checkpoint", path, exc)
                skipped.append(f"{path.name}: {exc.strerror}")
                self._unreadable.add(number)
                continue
            return LoadedCheckpoint(path, state, tuple(skipped), tuple(damaged))
        if skipped:
            raise CheckpointDamaged(
                f"no usable checkpoint in {self.directory} ({'; '.join(skipped)}); "
                "use --fresh to start over"
            )
        return None

    def set_aside_newer(self, resumed: LoadedCheckpoint) -> None:
        """The damaged checkpoints newer than the one ``resumed`` from (``newest()`` passed
        over them), renamed out of the count once the server resumes: they counted among
        the ``keep`` newest, so the next write deleted the last good one and left one
        checkpoint a reader could use, not ``keep``."""
        for number in resumed.damaged:  # not one it could not read (a mode, an I/O error)
            path = self.path(number)
            with contextlib.suppress(OSError):  # gone meanwhile, or a read-only directory
                path.rename(path.with_name(path.name + DAMAGED))
                log.warning("%s set aside as %s%s: it does not read back", path.name,
                            path.name, DAMAGED)  # fmt: skip

    def clear(self) -> None:
        """Remove every checkpoint and leftover temporary file (``--fresh``)."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            if (
                NAME.match(path.name)
                or path.name.startswith(".ckpt-")
                or (path.name.endswith(DAMAGED) and path.name.startswith("ckpt-"))
            ):
                path.unlink(missing_ok=True)
        self._next = 1

    def remove_leftovers(self) -> None:
        """Temporary files of writes a crash interrupted: never renamed, never read."""
        for path in unfinished_writes(self.directory, "ckpt-*"):
            log.info("removing %s: a checkpoint whose write was cut short", path.name)
            path.unlink(missing_ok=True)
