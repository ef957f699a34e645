"""The worker's view of the training data: a ``Corpus`` over local or inline frames.

A worker that can read the job's data opens it itself (``snet.data``) and normalises
with the statistics the server sends in ``DataInfo``, so every worker uses the same ones
and none has to read the whole corpus; a worker that cannot read it asks the server for
the raw frames (``FramesWanted``) and keeps them in an ``InlineStore``. Either way the
context windows are cut here, from raw frames held once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from snet.data.corpus import (
    Corpus,
    DenseStore,
    InlineStore,
    corpus_from_source,
    load_corpus,
    split_frames,
)
from snet.data.norms import Norms
from snet.data.sources import open_source
from snet.data.windows import UtteranceBounds
from snet.protocol.errors import DataError
from snet.protocol.job import JobSpec
from snet.protocol.messages import DataInfo, Lease

__all__ = [
    "Corpus",
    "DenseStore",
    "HeldLease",
    "InlineStore",
    "inline_corpus",
    "load_corpus",
    "local_corpus",
]


def local_corpus(job: JobSpec, info: DataInfo) -> Corpus:
    """The job's data read from this machine; DataError when it cannot be read or is not
    the data the server has."""
    source = open_source(job.data)
    lengths = np.asarray(info.lengths, dtype=np.int64)
    if source.features != info.features or not np.array_equal(source.lengths, lengths):
        raise DataError(
            f"this machine's {source.description} ({len(source.lengths)} utterances, "
            f"{source.features} features) differs from the server's "
            f"({len(lengths)} utterances, {info.features} features)"
        )
    return corpus_from_source(job.data, source, Norms.from_array(info.norms))


def inline_corpus(job: JobSpec, info: DataInfo) -> Corpus:
    """An empty corpus that the server's ``Frames`` messages fill."""
    lengths = np.asarray(info.lengths, dtype=np.int64)
    train, cv = split_frames(job.data, lengths)
    return Corpus(
        InlineStore(info.total_frames, info.features),
        UtteranceBounds(lengths),
        train,
        cv,
        info.features,
        job.data.context,
        Norms.from_array(info.norms),
    )


@dataclass
class HeldLease:
    """A lease and its frames in training order (shuffled within the cache)."""

    lease: Lease
    order: np.ndarray
    ready: bool = False  # every frame its windows read is at hand
