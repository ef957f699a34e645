"""``weights_digest``: a short fingerprint of an element, to tell weight versions apart.

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
