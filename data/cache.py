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
(Kaldi: the ``.scp`` is what is fingerprinted; rewrite it when its archives change.)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from .joined import JoinedSource
from .norms import Norms
from .sources import total_frames

log = logging.getLogger("snet.data")

FORMAT_VERSION = 1  # bump when the file's layout or the normalisation arithmetic changes
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


def fingerprint(source: JoinedSource, norms: Norms) -> str:
    """A name for the normalised frames of ``source`` under ``norms``."""
    digest = hashlib.sha256(f"snet frames v{FORMAT_VERSION}".encode())
    for part in source.parts:
        path = Path(part.description)  # every source's description is its path
        identity = _file_identity(path) if path.exists() else [part.description]
        digest.update("\n".join(identity).encode())
    digest.update(f"{total_frames(source)}x{source.features}".encode())
    digest.update(norms.as_array().tobytes())
    return digest.hexdigest()[:32]


def _write(path: Path, source: JoinedSource, norms: Norms) -> None:
    """The normalised frames as a ``.npy``, written in blocks, then renamed into place."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    count = total_frames(source)
    try:
        out = np.lib.format.open_memmap(
            temporary, mode="w+", dtype=np.float32, shape=(count, source.features)
        )
        block = max(1, BLOCK_BYTES // (8 * source.features))  # normalised in float64
        for start in range(0, count, block):
            rows = np.arange(start, min(start + block, count))
            out[start : start + len(rows)] = norms.apply(source.read(rows))
        out.flush()
        del out
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _prune(directory: Path) -> None:
    """Remove the cached copies of data files that no longer exist (a test's temporary
    files, a corpus deleted), so the directory does not only grow. A process that still
    maps one keeps its pages: the file goes when the last mapping does."""
    for note in directory.glob("frames-*.json"):
        try:
            sources = json.loads(note.read_text())["sources"]
        except (OSError, ValueError, KeyError):
            continue
        if all(Path(source).exists() for source in sources):
            continue
        for stale in (note.with_suffix(".npy"), note.with_suffix(".lock"), note):
            stale.unlink(missing_ok=True)


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
                    sources = [part.description for part in source.parts]
                    path.with_suffix(".json").write_text(json.dumps({"sources": sources}))
        frames: np.ndarray = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        log.warning(
            "cannot use the data cache %s (%s): this process holds its own copy", directory, exc
        )
        return None
    if frames.shape != (total_frames(source), source.features) or frames.dtype != np.float32:
        log.warning("the data cache's %s has shape %s: not used", path, frames.shape)
        return None
    return frames
