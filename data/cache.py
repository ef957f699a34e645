"""Normalised frames shared read-only by every process on one machine.

Four workers on one machine used to hold four copies of the same normalised data set
(Fashion-MNIST: 220 MB of float32 each, and over a GB at the peak of normalising it).
Instead the first process to need them writes the normalised frames once to a ``.npy``
file in a cache directory and every process memory-maps it read-only, so the operating
system keeps one copy in its page cache, shared by all of them.

The file's name is a fingerprint of what determines its contents: each data file's path,
size, modification time and inode (a changed file gets a new cache file; stale ones are
never read), the frame and feature counts and the normalisation. It is written in blocks
(the writer never holds the whole data set), to a temporary name, fsynced and renamed
into place, under an exclusive lock, so a process that finds the file finds it whole and
only one process of those starting together writes it. Beside each file a note names its
data files; a copy whose data files are gone is removed when the next one is written.
Copies of data files that still exist stay: delete ``frames-*`` to reclaim the space.
The data check of a server that reads a norm file leaves an empty ``checked-*`` marker
(``checked_values``), pruned in the same way.
(Kaldi: the ``.scp`` is what is fingerprinted; rewrite it when its archives change.)

The server keeps the training frames' normalisation there too (``cached_norms``): the
mean and standard deviation it computes at every start take a pass over all training
frames (for the bundled digits, decompressing 2.6 MB: 30 ms; for a corpus, its whole
size), which a restart on the same files and split skips. That file's name covers the
same identity of the data files and the training frames themselves, and holds the exact
float64 values and their checksum (one changed since, by a hand or the disk, is computed
again, not taken), so a server that reads it sends its workers the very normalisation it
would have computed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from snet.protocol.errors import DataError

from .joined import JoinedSource
from .kaldi import KaldiSource
from .norms import STD_FLOOR, Norms, check_finite, compute_norms
from .sources import total_frames

log = logging.getLogger("snet.data")
ABANDONED_SECONDS = 3600.0  # a temporary unchanged this long, its writer gone: removed

FORMAT_VERSION = 1  # bump when the file's layout or the normalisation arithmetic changes
# a kind's own layout version beside FORMAT_VERSION (a bump of that would throw away every
# frames cache too): the kept normalisation's rows became means, deviations, checksum
LAYOUTS = {"norms": 2}
KINDS = ("frames", "norms", "checked")  # what the cache keeps, each file named KIND-DIGEST
BLOCK_BYTES = 32 << 20  # the writer's working memory, not the data set's size


def default_cache_directory() -> Path:
    """``$XDG_CACHE_HOME/snet``, else ``~/.cache/snet``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "snet"


def _file_identity(path: Path) -> list[str]:
    """What tells one version of a data file (or of every file in a directory) from
    another without reading it."""
    paths = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    identity = []
    for item in paths:
        info = item.stat()
        identity.append(f"{item.resolve()}:{info.st_size}:{info.st_mtime_ns}:{info.st_ino}")
    return identity


# Said with a cache that cannot be used: otherwise the same warning comes at every start.
# (The flag is the server's and the worker's; their variables differ: SNET_DATA_CACHE,
# SNET_WORKER_DATA_CACHE.)
ELSEWHERE = "; --data-cache DIR names another directory, none keeps nothing"


def cache_directory(setting: str) -> Path | None:
    """The directory a ``data_cache`` setting names: empty, the default; ``none``, none."""
    if setting == "none":
        return None
    return Path(setting) if setting else default_cache_directory()


def _source_digest(kind: str, source: JoinedSource) -> hashlib._Hash:
    """A digest of ``kind`` (``frames``, ``norms``) begun with what identifies the data."""
    layout = f".{LAYOUTS[kind]}" if kind in LAYOUTS else ""
    digest = hashlib.sha256(f"snet {kind} v{FORMAT_VERSION}{layout}".encode())
    for part in source.parts:
        path = Path(part.description)  # every source's description is its path
        identity = _file_identity(path) if path.exists() else [part.description]
        digest.update("\n".join(identity).encode())
    digest.update(f"{total_frames(source)}x{source.features}".encode())
    return digest


def fingerprint(source: JoinedSource, norms: Norms) -> str:
    """A name for the normalised frames of ``source`` under ``norms``."""
    digest = _source_digest("frames", source)
    digest.update(norms.as_array().tobytes())
    return digest.hexdigest()[:32]


def _write_atomically(path: Path, fill: Callable[[Path], None]) -> None:
    """``fill`` writes a temporary file beside ``path``; it is synced, then renamed into
    place, so a reader finds it whole or not at all (one that is bad is made again). The
    temporary's name is its writer's own: processes, or servers of one process (the test
    suite's), may write at once. Its mode follows the umask."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fill(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _write(path: Path, source: JoinedSource, norms: Norms) -> None:
    """The normalised frames as a ``.npy``, written in blocks, then renamed into place."""
    count = total_frames(source)

    def fill(temporary: Path) -> None:
        out = np.lib.format.open_memmap(
            temporary, mode="w+", dtype=np.float32, shape=(count, source.features)
        )
        reserve(temporary)
        block = max(1, BLOCK_BYTES // (8 * source.features))  # normalised in float64
        for start in range(0, count, block):
            rows = np.arange(start, min(start + block, count))
            out[start : start + len(rows)] = norms.apply(source.read(rows))
        out.flush()
        del out

    _write_atomically(path, fill)


def reserve(path: Path) -> None:
    """Allocate the disk blocks of the (sparse) file ``path`` now: a full disk is then an
    ``OSError`` here, where writing the pages of its memory map killed the process with
    SIGBUS (a worker whose cache was on a full file system died, exit 135, saying
    nothing). File systems that cannot reserve are written as before."""
    if not hasattr(os, "posix_fallocate"):  # macOS
        return
    with open(path, "rb+") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise


def _prune(directory: Path) -> None:
    """Remove what the cache holds of data files that no longer exist (frames and
    normalisations of a test's temporary files, of a corpus deleted), and the temporaries
    of writers that were killed, so the directory does not only grow. A process that still
    maps a file keeps its pages: the file goes when the last mapping does."""
    notes = [note for kind in KINDS for note in directory.glob(f"{kind}-*.json")]
    for note in notes:
        try:
            sources = json.loads(note.read_text())["sources"]
        except (OSError, ValueError, KeyError):
            continue
        # A relative path (a note written before they were resolved) names a file in the
        # directory its writer ran in, unknown here: kept, as a file that still exists.
        if all(not Path(source).is_absolute() or Path(source).exists() for source in sources):
            continue
        for suffix in (".npy", ".lock", ".ok"):
            note.with_suffix(suffix).unlink(missing_ok=True)
        note.unlink(missing_ok=True)
    for temporary in [t for kind in KINDS for t in directory.glob(f"{kind}-*.tmp")]:
        if _abandoned(temporary):
            temporary.unlink(missing_ok=True)


def _abandoned(temporary: Path) -> bool:
    """A temporary (``_write_atomically``'s NAME.PID.TOKEN.tmp) whose writer was killed: as
    big as what it was making (a corpus's frames), and nobody else removes it. Its pid is
    not alive here, and it has not changed for ``ABANDONED_SECONDS``: the directory may be
    shared with other hosts, whose pids mean nothing here, and their live writers change
    their files."""
    try:
        pid = int(temporary.name.split(".")[-3])
        age = time.time() - temporary.stat().st_mtime
    except (ValueError, IndexError, OSError):
        return False  # not one of ours, or gone already
    if age < ABANDONED_SECONDS:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return False


def _note(path: Path, source: JoinedSource) -> None:
    """Beside ``path``: the data files it was made from (for ``_prune``), as absolute
    paths: a relative one would be looked for from the directory of whichever process
    prunes, and a job run from another directory removed copies still in use."""
    sources = [str(Path(part.description).resolve()) for part in source.parts]
    path.with_suffix(".json").write_text(json.dumps({"sources": sources}))


def shared_frames(source: JoinedSource, norms: Norms, directory: Path) -> np.ndarray | None:
    """The normalised frames of ``source``, memory-mapped read-only from the cache (made
    by whichever process gets here first); None when the cache cannot be used."""
    path = directory / f"frames-{fingerprint(source, norms)}.npy"
    try:
        if not path.exists():
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / f"{path.stem}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait, then map its file
                if not path.exists():
                    log.info("normalising %s into the shared cache %s", source.description, path)
                    _prune(directory)
                    _write(path, source, norms)
                    _note(path, source)
        frames: np.ndarray = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        log.warning("cannot use the data cache %s (%s): this process holds its own copy%s",
                    directory, exc, ELSEWHERE)  # fmt: skip
        return None
    if frames.shape != (total_frames(source), source.features) or frames.dtype != np.float32:
        log.warning("the data cache's %s has shape %s: not used", path, frames.shape)
        return None
    return frames


def cached_norms(
    source: JoinedSource,
    train: np.ndarray,
    directory: Path | None,
    checked: np.ndarray | None = None,
) -> Norms:
    """``compute_norms`` of ``source``'s frames ``train``, read from ``directory`` when it
    was computed there before for the same data files and frames (None: no cache), else
    computed and kept there. A cache that cannot be read or written is logged and the
    normalisation computed as without one. ``checked``: other frames of the same files
    (the CV frames) whose values are checked when the data is read for the norms, as
    the training frames are (``compute_norms``). Kaldi data is not cached: its key would be the
    ``.scp`` alone, and the pass over every frame is also what finds an archive that
    cannot be read (a DataError at start, not a failure in every worker)."""
    if directory is None or not _cacheable(source):
        return compute_norms(source, train, checked)
    path = _kept_path(directory, "norms", source, train, ".npy")
    try:
        return _read_norms(path, source.features)
    except (FileNotFoundError, NotADirectoryError):
        pass  # nothing kept yet (a directory that is a file is said once, when writing)
    except Exception as exc:  # whatever the file holds (or fails to), it is computed again
        log.warning("the data cache's %s cannot be read (%s): computed again", path, exc)
    norms = compute_norms(source, train, checked)
    _keep(path, source, lambda temporary: _save(temporary, _with_checksum(norms.as_array())),
          "the normalisation")  # fmt: skip
    return norms


def checked_values(source: JoinedSource, frames: np.ndarray, directory: Path | None) -> None:
    """``check_finite`` of ``source``'s ``frames``, once for the same data files and frames
    when ``directory`` is given: a marker kept there says they were checked, so a server
    that reads a norm file (and so no pass for the norms) does not read the data again at
    every start to check it. Kaldi data is checked every time (as ``cached_norms``)."""
    if directory is None or not _cacheable(source):
        check_finite(source, frames)
        return
    path = _kept_path(directory, "checked", source, frames, ".ok")
    with contextlib.suppress(OSError):
        if path.stat().st_uid == os.getuid():  # another user's marker is not trusted
            return
    check_finite(source, frames)
    _keep(path, source, lambda temporary: temporary.touch(), "the data check's result")


def _cacheable(source: JoinedSource) -> bool:
    """Whether what is derived from ``source`` can be kept: not Kaldi data, whose key would
    be the ``.scp`` alone (and whose pass over every frame also finds an archive that
    cannot be read: a DataError at start, not a failure in every worker)."""
    return not any(isinstance(part, KaldiSource) for part in source.parts)


def _kept_path(
    directory: Path, kind: str, source: JoinedSource, frames: np.ndarray, suffix: str
) -> Path:
    """Where ``kind`` (one of ``KINDS``) of ``source``'s ``frames`` is kept: named by the
    data files' identity and the frames themselves."""
    digest = _source_digest(kind, source)
    digest.update(np.ascontiguousarray(frames, dtype=np.int64).data)  # in place, no copy
    return directory / f"{kind}-{digest.hexdigest()[:32]}{suffix}"


def _keep(path: Path, source: JoinedSource, fill: Callable[[Path], None], what: str) -> None:
    """Write ``path`` whole (``fill`` writes a temporary) with its note, pruning the
    directory first; a cache that cannot be written is logged, and the run goes on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune(path.parent)
        _write_atomically(path, fill)
        _note(path, source)
    except OSError as exc:
        log.warning("cannot keep %s in the data cache %s (%s)%s",
                    what, path.parent, exc, ELSEWHERE)  # fmt: skip


def _save(path: Path, array: np.ndarray) -> None:
    """``array`` as a ``.npy`` at ``path`` exactly (``np.save`` given a name would add
    ``.npy`` to one that lacks it)."""
    with open(path, "xb") as out:
        np.save(out, array)


def _checksum(values: np.ndarray) -> float:
    """48 bits of the SHA-256 of ``values``' bytes, exact as a float64."""
    return float(int.from_bytes(hashlib.sha256(values.tobytes()).digest()[:6], "little"))


def _with_checksum(values: np.ndarray) -> np.ndarray:
    """The normalisation's 2 rows and a third: their checksum, then zeros."""
    row = np.zeros((1, values.shape[1]), np.float64)
    row[0, 0] = _checksum(values)
    return np.concatenate([values, row])


def _read_norms(path: Path, features: int) -> Norms:
    """The kept normalisation, only as ``cached_norms`` writes it: this user's file,
    3 x ``features`` little-endian float64 whose third row holds the checksum of the
    first two (a value changed since, by a hand or the disk, was taken without a word,
    and a checkpoint of the run then said to be of other data: a probe), finite,
    standard deviations of at least the floor ``compute_norms`` applies. Its header is
    read before its values (mapped), so a header claiming a huge array allocates
    nothing."""
    if path.stat().st_uid != os.getuid():
        raise DataError("written by another user")  # another user's file is not trusted
    kept = np.load(path, mmap_mode="r", allow_pickle=False)
    if kept.dtype != np.dtype("<f8") or kept.shape != (3, features):
        raise DataError(f"holds {kept.dtype} {kept.shape}, not <f8 (3, {features})")
    values, check = np.array(kept[:2]), np.array(kept[2])
    if check[0] != _checksum(values) or check[1:].any():
        raise DataError("its values do not match their checksum: changed since written")
    norms = Norms.from_array(values, features)
    if (norms.std < STD_FLOOR).any():
        raise DataError(f"a standard deviation is below {STD_FLOOR}")
    return norms
