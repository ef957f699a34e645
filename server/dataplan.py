"""Which frames the server leases: the training split of the job's data.

The server needs only the utterance lengths, never the features: the workers read those.
The split is the same pure function the workers use, so both agree on every index.
"""

from __future__ import annotations

import numpy as np

from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec, frames_of, resolve_source, split_utterances


def training_frames(spec: DataSpec) -> tuple[np.ndarray, int]:
    """(global indices of the training frames, total frames in the data set)."""
    path = resolve_source(spec.source)
    try:
        with np.load(path) as data:
            lengths = np.asarray(data["lengths"], dtype=np.int64)
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"cannot read utterance lengths from {path}: {exc}") from exc
    train_utts, _ = split_utterances(len(lengths), spec.cv_fraction, spec.split_seed)
    return frames_of(train_utts, lengths), int(lengths.sum())
