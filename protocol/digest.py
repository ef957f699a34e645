"""``weights_digest``: a short fingerprint of an element, to tell weight versions apart;
``labels_digest``: one of a data set's labels, to tell a worker's copy of the data from
another file of the same shape.

CRC-32 of the element's float32 bytes (zlib, which releases the GIL and runs at several
GB/s: 0.3 ms for a 2 MB element, against 1.4 ms for blake2b), as eight hex digits. It is
a check against silent divergence (a worker holding other weights than the server
announced, a resumed server that is not where it says), not a defence against forgery.
"""

from __future__ import annotations

import zlib

import numpy as np


def weights_digest(flat: np.ndarray) -> str:
    """The digest of a float32 element (C-contiguous)."""
    return f"{zlib.crc32(np.ascontiguousarray(flat).data.cast('B')):08x}"


def labels_digest(labels: np.ndarray) -> str:
    """The digest of a data set's frame labels (as little-endian int64), CRC-32 as above."""
    data = np.ascontiguousarray(labels, dtype="<i8")
    return f"{zlib.crc32(data.data.cast('B')):08x}"
