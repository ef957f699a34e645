"""A third of the default data, for lab tests whose subject is not how well the net learns.

Every third utterance of the bundled digits (1,000 of 3,000, a hundred of each of the ten
classes: 18,115 of 53,999 frames), so an epoch trains a third of the frames: 32 updates
in bunches of 512 where QUICK_JOB's epoch is 95, and the net still learns (60% of the CV
frames after one sequential epoch in bunches of 512, 65% in bunches of 128; np's 117:32:10
and 117:256:10 in bunches of 256: 63%). A test's time goes mostly into its updates, so a
test whose subject is what the server and workers do, or that an np or sync run equals
its sequential replay, trains on this and takes a third of the time. Written once per
test process, when first asked for, to a directory of its own removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from snet.data.sources import resolve_source
from snet.protocol.job import DataSpec

from helpers import QUICK_JOB

EVERY = 3  # utterances: keep the first of every EVERY
FRAMES = 18_115  # in the utterances kept
TINY_EVERY = 15
TINY_FRAMES = 3_551


def _remove_if_mine(directory: Path, owner: int) -> None:
    """At exit: a process forked from the one that wrote it must not remove it."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


@functools.cache
def short_data() -> str:
    """The path of the third of the default data (an ``.npz`` with X, y and lengths)."""
    path = _every_nth(EVERY)
    with np.load(path) as data:
        assert int(np.sum(data["lengths"])) == FRAMES
    return path


def tiny_data() -> str:
    """A fifteenth of the default data (200 utterances, 3,551 frames: an epoch of its
    training frames in about 6 bunches of 512), for a test that waits for epochs to end and
    whose subject is not learning."""
    path = _every_nth(TINY_EVERY)
    with np.load(path) as data:
        assert int(np.sum(data["lengths"])) == TINY_FRAMES
    return path


@functools.cache
def _every_nth(every: int) -> str:
    directory = Path(tempfile.mkdtemp(prefix="snet-short-data-"))
    atexit.register(_remove_if_mine, directory, os.getpid())
    with np.load(resolve_source(DataSpec().source)) as data:
        features, labels, lengths = data["X"], data["y"], data["lengths"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    kept = np.arange(0, len(lengths), every)
    rows = np.concatenate([np.arange(starts[u], starts[u + 1]) for u in kept])
    path = directory / f"digits-every-{every}-utterances.npz"
    np.savez(path, X=features[rows], y=labels[kept], lengths=lengths[kept])
    return str(path)


def short_job() -> list[str]:
    """QUICK_JOB on ``short_data()``."""
    return [*QUICK_JOB, "--data", short_data()]
