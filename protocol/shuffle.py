"""The worker's shuffle within a cache of several bunches, as SNet did.

A worker reads the frames of its lease a cache at a time (``shuffle_cache_bunches`` x
``bunch_size`` frames) and trains on them in a shuffled order. The order is a pure
function of the job's seed, the lease and the cache's position, so the server computes
the very same order and knows exactly which frames each update used: the ledger stays
exact and a requeued remainder holds exactly the frames no update used.
"""

from __future__ import annotations

import numpy as np


def cache_order(indices: np.ndarray, lease_id: int, seed: int, cache_frames: int) -> np.ndarray:
    """The lease's frames in training order: each cache of ``cache_frames`` consecutive
    entries permuted by ``numpy.random.default_rng([seed, lease_id, start])``."""
    indices = np.asarray(indices)
    if cache_frames <= 1:
        return indices.copy()
    out = np.empty_like(indices)
    for start in range(0, len(indices), cache_frames):
        piece = indices[start : start + cache_frames]
        permutation = np.random.default_rng([seed, lease_id, start]).permutation(len(piece))
        out[start : start + len(piece)] = piece[permutation]
    return out
