"""``weights_digest``: a short fingerprint of an element, to tell weight versions apart;
``labels_digest``: one of a data set's labels, to tell a worker's copy of the data from
another file of the same shape.

CRC-32 of the element's float32 bytes, as eight hex digits. It is a check against silent
divergence (a worker holding other weights than the server announced, a resumed server
that is not where it says, a weights message corrupted on its way), not a defence against
forgery. The server computes it at every step and every worker checks it on every whole
copy of the weights it receives, so its speed is part of each update's cost: zlib-ng's
CRC-32 (the ``fast`` extra; the same polynomial and values as zlib's, so peers with and
without it agree) took 4.6 us for the default job's 262 kB element where the standard
library's zlib 1.2.13 took 62 us here, 0.1 of the server's 0.48 ms per update; without
it, zlib's (which releases the GIL: still 4x blake2b's speed).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

try:
    from zlib_ng import zlib_ng
except ImportError:  # the fast extra is not installed: the standard library's, same values
    crc32: Callable[[memoryview], int] = zlib.crc32
else:
    crc32 = zlib_ng.crc32


def weights_digest(flat: np.ndarray) -> str:
    """The digest of a float32 element (C-contiguous)."""
    return f"{crc32(np.ascontiguousarray(flat).data.cast('B')):08x}"


def labels_digest(labels: np.ndarray) -> str:
    """The digest of a data set's frame labels (as little-endian int64), CRC-32 as above."""
    data = np.ascontiguousarray(labels, dtype="<i8")
    return f"{crc32(data.data.cast('B')):08x}"
