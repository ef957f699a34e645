"""The worker's shuffle within a cache of several bunches, as SNet did.

A worker reads the frames of its lease a cache at a time (``shuffle_cache_bunches`` x
``bunch_size`` frames) and trains on them in a shuffled order. The order is a pure
function of the job's seed, the lease and the cache's position, so the server computes
the very same order and knows exactly which frames each update used: the ledger stays
exact and a requeued remainder holds exactly the frames no update used.
"""

from __future__ import annotations

import numpy as np

WORD = 2**32  # the integers numpy's seeding reads as one 32-bit word each


def cache_order(indices: np.ndarray, lease_id: int, seed: int, cache_frames: int) -> np.ndarray:
    """The lease's frames in training order: each cache of ``cache_frames`` consecutive
    entries permuted by ``numpy.random.default_rng([seed, lease_id, start])``."""
    indices = np.asarray(indices)
    if cache_frames <= 1:
        return indices.copy()
    out = np.empty_like(indices)
    for start in range(0, len(indices), cache_frames):
        piece = indices[start : start + cache_frames]
        permutation = _generator(seed, lease_id, start).permutation(len(piece))
        out[start : start + len(piece)] = piece[permutation]
    return out


def _generator(seed: int, lease_id: int, start: int) -> np.random.Generator:
    """``numpy.random.default_rng([seed, lease_id, start])``, made faster: numpy reads a
    list of integers as each one's 32-bit words, so when each fits in one word an array of
    them is the same entropy, which its seeding takes in 2 us rather than 5 (the seeding is
    most of what a cache's order costs, on the server for every lease it grants)."""
    words = (seed, lease_id, start)
    if all(type(word) is int and 0 <= word < WORD for word in words):
        entropy: np.ndarray | list[int] = np.array(words, dtype=np.uint32)
    else:  # numpy's own reading (and its refusal of a float or a negative number)
        entropy = list(words)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
