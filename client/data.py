"""The worker's view of the training data: a ``Corpus`` over local or inline frames.

A worker that can read the job's data opens it itself (``snet.data``) and normalises
with the statistics the server sends in ``DataInfo``, so every worker uses the same ones
and none has to read the whole corpus; a worker that cannot read it asks the server for
the raw frames (``FramesWanted``) and keeps them in an ``InlineStore``. Either way the
context windows are cut here, from raw frames held once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snet.data.corpus import (
    Corpus,
    DenseStore,
    InlineStore,
    corpus_from_source,
    load_corpus,
)
from snet.data.joined import open_job_source, split_frames
from snet.data.norms import Norms
from snet.data.windows import UtteranceBounds
from snet.protocol.digest import labels_digest
from snet.protocol.errors import DataError
from snet.protocol.job import JobSpec
from snet.protocol.messages import DataInfo, Frames, Lease
from snet.protocol.shuffle import cache_order

__all__ = [
    "Corpus",
    "DenseStore",
    "HeldLease",
    "InlineStore",
    "add_frames",
    "inline_corpus",
    "load_corpus",
    "local_corpus",
    "open_corpus",
]


def checked_lengths(info: DataInfo) -> np.ndarray:
    """The utterance lengths ``info`` names, as int64; ``DataError`` unless they are
    whole numbers of frames, none negative, that add up to its ``total_frames`` (a
    negative one ended a worker in a traceback of numpy's)."""
    lengths = np.asarray(info.lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise DataError(f"the server's utterance lengths are of shape {lengths.shape} and "
                        f"type {lengths.dtype}, not a list of frame counts")  # fmt: skip
    lengths = lengths.astype(np.int64)
    if (len(lengths) and int(lengths.min()) < 0) or int(lengths.sum()) != info.total_frames:
        raise DataError(f"the server's utterance lengths (from {int(lengths.min(initial=0))}, "
                        f"{int(lengths.sum())} frames in all) are not of its "
                        f"{info.total_frames} frames")  # fmt: skip
    return lengths


def local_corpus(job: JobSpec, info: DataInfo, cache: Path | None = None) -> Corpus:
    """The job's data read from this machine (shared with its other workers through the
    ``cache`` directory); DataError when it cannot be read or is not the server's."""
    lengths = checked_lengths(info)
    source = open_job_source(job.data)
    if (
        source.features != info.features
        or source.cv_utterances != info.cv_utterances
        or not np.array_equal(source.lengths, lengths)
    ):
        raise DataError(
            f"this machine's {source.description} ({len(source.lengths)} utterances, "
            f"{source.features} features) differs from the server's "
            f"({len(lengths)} utterances, {info.features} features)"
        )
    if info.labels and labels_digest(source.labels) != info.labels:
        raise DataError(
            f"this machine's {source.description} has the server's shape but other labels "
            "(another file of the same name?)"
        )
    return corpus_from_source(job.data, source, Norms.from_array(info.norms, info.features), cache)


def inline_corpus(job: JobSpec, info: DataInfo) -> Corpus:
    """An empty corpus that the server's ``Frames`` messages fill."""
    lengths = checked_lengths(info)
    train, cv = split_frames(job.data, lengths, info.cv_utterances)
    return Corpus(
        InlineStore(info.total_frames, info.features),
        UtteranceBounds(lengths),
        train,
        cv,
        info.features,
        job.data.context,
        Norms.from_array(info.norms, info.features),
    )


@dataclass
class HeldLease:
    """A lease and its frames in training order (shuffled within the cache)."""

    lease: Lease
    order: np.ndarray
    ready: bool = False  # every frame its windows read is at hand
    revoked: bool = False  # taken back, kept as the last work: one bunch of it, no more

    @classmethod
    def of(cls, lease: Lease, job: JobSpec) -> HeldLease:
        cache = job.bunch_size * job.shuffle_cache_bunches
        return cls(lease, cache_order(lease.indices, lease.lease_id, job.seed, cache))


def open_corpus(
    job: JobSpec, info: DataInfo, access: str, cache: Path | None = None
) -> tuple[Corpus, str]:
    """The worker's corpus and, when its frames must come inline, why ("" when local).

    ``access``: "local" (this machine's copy or a DataError), "inline" (always from the
    server), "auto" (this machine's copy when it can be read and is the server's).
    ``cache``: the directory where this machine's workers share the normalised frames.
    """
    reason = "this worker runs with --data-access inline"
    corpus: Corpus | None = None
    if access != "inline":
        try:
            corpus, reason = local_corpus(job, info, cache), ""
        except DataError as exc:
            if access == "local":
                raise
            reason = str(exc)
    if corpus is None:
        corpus = inline_corpus(job, info)
    if corpus.pattern_size != job.network.input_size:
        raise DataError(
            f"the data gives {corpus.pattern_size} inputs per pattern, "
            f"the network has {job.network.input_size}"
        )
    return corpus, reason


def add_frames(corpus: Corpus, message: Frames) -> bool:
    """Keep frames the server sent; False when this corpus does not take any."""
    if not isinstance(corpus.store, InlineStore):
        return False
    corpus.store.add(message.indices, message.features, message.labels)
    return True
