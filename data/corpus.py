"""``Corpus``: the normalised frames a process trains on, their labels and the split.

Where the frames come from is a ``FrameStore``:

- ``DenseStore``: every frame normalised in memory (data sets up to ``DENSE_LIMIT_BYTES``);
- ``SourceStore``: rows read from the source on demand and normalised (larger corpora);
- ``InlineStore``: rows received from the server, for a worker that cannot read the data.

A pattern is cut on demand as the window of ``2 * context + 1`` frames around a centre
frame (``windows.UtteranceBounds``), so raw frames are stored once, not once per window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec

from .cache import cached_norms, checked_values, shared_frames
from .joined import JoinedSource, open_job_source, split_frames
from .norms import Norms, read_norm_file
from .sources import FrameSource, check_against_network, total_frames
from .windows import UtteranceBounds

DENSE_LIMIT_BYTES = 512 * 1024 * 1024


class FrameStore(Protocol):
    """Normalised frames and labels by global row number."""

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Normalised float32 features of ``rows``, shape ``rows.shape + (features,)``."""
        ...

    def labels_of(self, frames: np.ndarray) -> np.ndarray: ...

    def has(self, rows: np.ndarray) -> bool:
        """Whether every row is at hand (always, except for frames still to arrive)."""
        ...

    @property
    def complete(self) -> bool:
        """Whether every row of the data set is at hand, so ``has`` need not be asked."""
        ...


class _AllRowsStore:
    """A store that has every row at hand, and every label in memory."""

    labels: np.ndarray

    def labels_of(self, frames: np.ndarray) -> np.ndarray:
        labels: np.ndarray = self.labels[frames]
        return labels

    def has(self, rows: np.ndarray) -> bool:
        return True

    @property
    def complete(self) -> bool:
        return True


class DenseStore(_AllRowsStore):
    """All frames normalised in memory."""

    def __init__(self, frames: np.ndarray, labels: np.ndarray) -> None:
        self.frames = frames
        self.labels = labels

    def take(self, rows: np.ndarray) -> np.ndarray:
        return np.take(self.frames, rows, axis=0)


class SourceStore(_AllRowsStore):
    """Rows read from the source when asked for, then normalised."""

    def __init__(self, source: FrameSource, norms: Norms) -> None:
        self.source = source
        self.norms = norms
        self.labels = source.labels

    def take(self, rows: np.ndarray) -> np.ndarray:
        flat = np.asarray(rows).reshape(-1)
        unique, inverse = np.unique(flat, return_inverse=True)
        frames = self.norms.apply(self.source.read(unique))[inverse]
        return frames.reshape(*np.shape(rows), -1)


class InlineStore:
    """Normalised rows and their labels as the server sent them (``Frames`` messages)."""

    def __init__(self, total: int, features: int) -> None:
        self.features = features
        self._where = np.full(total, -1, dtype=np.int64)  # global row -> local row
        self._frames = np.zeros((0, features), dtype=np.float32)
        self._labels = np.zeros(0, dtype=np.int64)

    @property
    def rows_held(self) -> int:
        return len(self._labels)

    def add(self, indices: np.ndarray, frames: np.ndarray, labels: np.ndarray) -> None:
        """Keep rows received from the server (rows already held are overwritten)."""
        indices = np.asarray(indices, dtype=np.int64)
        if frames.shape != (len(indices), self.features) or len(labels) != len(indices):
            raise DataError(
                f"frames message of shape {frames.shape} for {len(indices)} rows "
                f"of {self.features} features"
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self._where)):
            raise DataError("frames message names rows outside the data set")
        # unique: a row named twice must be held once, or ``complete`` would count it twice
        new = np.unique(indices[self._where[indices] < 0])
        self._where[new] = np.arange(self.rows_held, self.rows_held + len(new))
        self._frames = np.concatenate([self._frames, np.zeros((len(new), self.features), "f4")])
        self._labels = np.concatenate([self._labels, np.zeros(len(new), np.int64)])
        self._frames[self._where[indices]] = frames
        self._labels[self._where[indices]] = labels

    def take(self, rows: np.ndarray) -> np.ndarray:
        local: np.ndarray = self._where[rows]
        return np.take(self._frames, local, axis=0)

    def labels_of(self, frames: np.ndarray) -> np.ndarray:
        labels: np.ndarray = self._labels[self._where[frames]]
        return labels

    def has(self, rows: np.ndarray) -> bool:
        return bool((self._where[rows] >= 0).all())

    @property
    def complete(self) -> bool:
        return self.rows_held == len(self._where)


@dataclass
class Corpus:
    """Frames (through a store), utterance bounds, the train/CV split and the context."""

    store: FrameStore
    bounds: UtteranceBounds
    train_frames: np.ndarray  # global indices
    cv_frames: np.ndarray
    features: int
    context: int
    norms: Norms | None = None

    @property
    def pattern_size(self) -> int:
        return self.features * (2 * self.context + 1)

    @property
    def frames(self) -> np.ndarray:
        """All normalised frames (only for a corpus held in memory)."""
        if not isinstance(self.store, DenseStore):
            raise DataError("this corpus is not held in memory")
        return self.store.frames

    @property
    def labels(self) -> np.ndarray:
        if not isinstance(self.store, _AllRowsStore):
            raise DataError("a worker fed inline frames has only the labels it was sent")
        labels: np.ndarray = self.store.labels
        return labels

    @property
    def mean(self) -> np.ndarray:
        assert self.norms is not None
        return self.norms.mean

    @property
    def std(self) -> np.ndarray:
        assert self.norms is not None
        return self.norms.std

    @property
    def utterance_start(self) -> np.ndarray:
        return self.bounds.start_of(np.arange(self.bounds.total_frames))

    @property
    def utterance_end(self) -> np.ndarray:
        return self.bounds.end_of(np.arange(self.bounds.total_frames))

    def labels_of(self, frames: np.ndarray) -> np.ndarray:
        return self.store.labels_of(frames)

    def needed_rows(self, frames: np.ndarray) -> np.ndarray:
        return self.bounds.needed_rows(frames, self.context)

    def ready_for(self, frames: np.ndarray) -> bool:
        """Whether every row the windows of ``frames`` read is at hand.

        Asked on the worker's event loop for every lease: a store holding all rows answers
        at once (sorting a lease's window rows took 2 ms per bunch of 1,000 frames on
        351:1262:45), and otherwise the windows' rows, repeats and all, are looked up
        without sorting them.
        """
        return self.store.complete or self.store.has(self.bounds.window_rows(frames, self.context))

    def windows(self, indices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Patterns for the centre frames ``indices``: (len, window * features) float32."""
        rows = self.bounds.window_rows(indices, self.context)
        patterns = self.store.take(rows).reshape(len(indices), self.pattern_size)
        if out is None:
            return patterns
        out[...] = patterns
        return out


def job_norms(
    spec: DataSpec,
    source: JoinedSource,
    train: np.ndarray,
    cache: Path | None = None,
    checked: np.ndarray | None = None,
) -> Norms:
    """The job's norm file when it names one, else computed over the training frames (kept
    in the ``cache`` directory, when given, for the next start: ``cache.cached_norms``;
    ``checked``: frames whose values are checked then too). With a norm file the training
    (and ``checked``) frames are checked for NaN and infinity in a pass of their own,
    remembered in the ``cache`` directory (``cache.checked_values``)."""
    if spec.norm_file:
        norms = read_norm_file(spec.norm_file, source.features)
        # No pass computes the norms to check the values in: one of its own, once.
        frames = train if checked is None else np.concatenate([train, checked])
        checked_values(source, frames, cache)
        return norms
    return cached_norms(source, train, cache, checked)


def corpus_from_source(
    spec: DataSpec, source: JoinedSource, norms: Norms, cache: Path | None = None
) -> Corpus:
    """Held in memory when it fits under ``DENSE_LIMIT_BYTES``, else read on demand.

    With a ``cache`` directory the frames held in memory are a read-only memory map of
    a normalised copy shared by every process on this machine (``data/cache.py``)."""
    train, cv = split_frames(spec, source.lengths, source.cv_utterances)
    count = total_frames(source)
    store: FrameStore
    if count * source.features * 4 <= DENSE_LIMIT_BYTES:
        frames = shared_frames(source, norms, cache) if cache is not None else None
        if frames is None:
            frames = norms.apply(source.read(np.arange(count)))
        store = DenseStore(frames, source.labels)
    else:
        store = SourceStore(source, norms)
    bounds = UtteranceBounds(source.lengths)
    return Corpus(store, bounds, train, cv, source.features, spec.context, norms)


def load_corpus(spec: DataSpec, outputs: int, inputs: int | None = None) -> Corpus:
    """Open, check, normalise and split the job's data (in one process, without a server)."""
    source = open_job_source(spec)
    check_against_network(source, spec.window, inputs or source.features * spec.window, outputs)
    train, _ = split_frames(spec, source.lengths, source.cv_utterances)
    return corpus_from_source(spec, source, job_norms(spec, source, train))
