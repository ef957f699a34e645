"""The job's data as one row space: the training file, then its separate CV file.

With ``[job.data] cv_source`` the CV set is a file of its own. Rather than teach leases,
windows, inline frames and the ledger about two files, the two are joined into one
``FrameSource``: the training file's utterances first, the CV file's after them, so a
global row number still names one frame and context windows never cross from one file
into the other (a window is clipped to its utterance). ``cv_utterances`` says how many of
the last utterances are the CV file's; ``split_frames`` turns that, or the job's
``cv_fraction`` and ``split_seed`` when there is no CV file, into the two frame sets.
"""

from __future__ import annotations

import numpy as np

from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec
from snet.protocol.splits import frames_of, split_utterances

from .sources import FrameSource, open_source, total_frames


class JoinedSource:
    """A training source and, optionally, a CV source read as one (a ``FrameSource``)."""

    def __init__(self, train: FrameSource, cv: FrameSource | None = None) -> None:
        self.parts = [train] if cv is None else [train, cv]
        if cv is not None and total_frames(cv) == 0:  # it fell back to the split, unsaid
            raise DataError(f"the CV file {cv.description} has no frames")
        if cv is not None and cv.features != train.features:
            raise DataError(
                f"the CV file {cv.description} has {cv.features} features per frame, "
                f"the training data {train.description} has {train.features}"
            )
        self.description = train.description
        self.features = train.features
        self.lengths = np.concatenate([part.lengths for part in self.parts]).astype(np.int64)
        self.labels = np.concatenate([part.labels for part in self.parts]).astype(np.int64)
        self.cv_utterances = 0 if cv is None else len(cv.lengths)
        self._first_rows = np.cumsum([0] + [total_frames(part) for part in self.parts])

    def locate(self, row: int) -> tuple[str, int]:
        """The file a global row is in, and its frame number there (messages name the
        CV file's own frame, not the training file with the joined row's number)."""
        number = int(np.searchsorted(self._first_rows, row, side="right")) - 1
        return self.parts[number].description, int(row - self._first_rows[number])

    def read(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.parts) == 1:
            return self.parts[0].read(rows)
        out = np.empty((len(rows), self.features), dtype=np.float32)
        part_of = np.searchsorted(self._first_rows, rows, side="right") - 1
        for number, part in enumerate(self.parts):
            mine = part_of == number
            if mine.any():
                out[mine] = part.read(rows[mine] - self._first_rows[number])
        return out


def open_job_source(spec: DataSpec) -> JoinedSource:
    """The job's training data joined with its CV file, if it names one (else DataError)."""
    train = open_source(spec)
    cv = open_source(spec.part("cv"), "cv") if spec.cv_source else None
    return JoinedSource(train, cv)


def split_frames(
    spec: DataSpec, lengths: np.ndarray, cv_utterances: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(training frames, cross-validation frames) as global row numbers.

    ``cv_utterances > 0``: the last ``cv_utterances`` utterances are the CV file's and all
    the others train. Otherwise the utterances are split by the job's ``cv_fraction`` and
    ``split_seed`` (the same split on the server and every worker).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if cv_utterances > 0:
        cut = len(lengths) - cv_utterances
        utterances = np.arange(len(lengths), dtype=np.int64)
        return frames_of(utterances[:cut], lengths), frames_of(utterances[cut:], lengths)
    train_utts, cv_utts = split_utterances(len(lengths), spec.cv_fraction, spec.split_seed)
    return frames_of(train_utts, lengths), frames_of(cv_utts, lengths)
