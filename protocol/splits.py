"""How a job's utterances divide into training and cross-validation sets, and the frames
each set holds. Server and workers call these with the job's values and get the same
division, so no frame list crosses the wire."""

from __future__ import annotations

import numpy as np

from .errors import ConfigError


def split_utterances(
    utterances: int, cv_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministically split utterance numbers into (training, cross-validation).

    Both server and workers call this with the job's values and get the same split.
    """
    if utterances < 2:
        raise ConfigError(f"need at least 2 utterances to split into training and CV sets, "
                          f"got {utterances} (--cv-data names a CV file)")  # fmt: skip
    order = np.random.default_rng(seed).permutation(utterances)
    n_cv = min(max(1, round(utterances * cv_fraction)), utterances - 1)
    return np.sort(order[n_cv:]), np.sort(order[:n_cv])


def frames_of(utterances: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Global frame indices (into the concatenated frames) of the given utterances."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    utterances = np.asarray(utterances, dtype=np.int64)
    if len(utterances) == 0:
        return np.zeros(0, dtype=np.int64)
    # Without a Python loop: data without sequences has an "utterance" per frame (70,000
    # for Fashion-MNIST). Each frame is its utterance's start plus its place within it.
    counts = lengths[utterances]
    first = np.repeat(starts[utterances], counts)
    place = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )
    frames: np.ndarray = first + place
    return frames
