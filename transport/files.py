"""Files written whole or not at all, and read no further than they should be.

``write_atomically``, for every part that writes a file others read (the server's
results, checkpoints, ready and pid files; ``snet train``'s weights; ``snet tls
init``'s certificates); ``read_at_most``, for the small files a user names. It lives in
transport/, the I/O layer that server/, client/ and cli/ all may import
(tests/test_import_rules.py).

A file written in place is truncated first and filled after: on a full disk, or killed
between the two, it stays empty or cut short under its own name, and the next reader
takes it for a damaged one (a CA that does not load, a checkpoint that does not decode).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from snet.protocol.errors import ConfigError
from snet.protocol.numbering import amount


def unfinished_writes(directory: Path, name: str) -> list[Path]:
    """The temporaries ``write_atomically`` of files called ``name`` (a glob pattern) in
    ``directory`` left behind when a kill cut the write short: never renamed, never
    read, and for the caller to remove (none while no such write is under way)."""
    return sorted(directory.glob(f".{name}.*")) if directory.is_dir() else []


def write_atomically(path: Path, payload: bytes, mode: int = 0o644, replace: bool = True) -> None:
    """Write atomically: a reader never sees half a file, a crash never leaves one (a
    temporary file of a unique name in the same directory, fsync'd, renamed over ``path``,
    and the directory fsync'd so that the rename survives a power cut). ``mode``: the
    file's permissions (0o600 for a secret), whatever the umask. ``OSError`` (a full
    disk) leaves ``path`` as it was and no temporary behind.

    ``replace=False``: never replace a file, not even one made while this one was being
    written (``FileExistsError``): the temporary is published with a hard link, which
    fails where ``path`` exists, where a rename replaces it (a check before the rename
    leaves a moment in which another process's file is lost). On a file system without
    hard links it checks, then renames."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # (named as unfinished_writes finds it after a kill)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            os.fchmod(stream.fileno(), mode)  # mkstemp makes it 0600: results are for reading
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        if replace or not _linked(temporary, path):
            os.replace(temporary, path)
        else:
            os.unlink(temporary)  # ``path`` is its other name now
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _linked(temporary: str, path: Path) -> bool:
    """Give ``temporary`` the name ``path`` unless that name is taken (FileExistsError);
    False where the file system has no hard links (the caller checks, then renames)."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        # NFS may answer EEXIST to a link it made whose first reply was lost: the name is
        # then this file's (the open(2) manual's test)
        if os.path.exists(path) and os.path.samefile(temporary, path):
            return True
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        return False
    return True


def read_at_most(path: str | Path, limit: int, name: str, kind: str) -> bytes:
    """The whole of a file a user named (``name`` in the refusal): a config file, a token
    file, a calibration. ``ConfigError`` for one over ``limit`` bytes, read no further
    (``/dev/zero`` or a disk image given by mistake was read until memory ran out, not
    ``kind``); ``OSError`` as reading raises it."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{name} is over {amount(limit)}: not {kind}?")
    return data
