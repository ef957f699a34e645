"""Strictly increasing indices as gaps in LEB128 varints: ``topk``'s index part.

An increasing index list i_0 < i_1 < ... travels as the gaps g_0 = i_0 and
g_j = i_j - i_{j-1} - 1 (so every gap is >= 0 and any decoded list is strictly
increasing), each gap as an unsigned LEB128 varint: 7 bits per byte, least significant
group first, the high bit set on every byte but the last. With 1% of the values kept the
gaps are mostly under 128: about 1.3 bytes per index instead of 2 (uint16) or 4.

Decoding checks everything: the bytes end on a varint's last byte, no varint is longer
than ``MAX_BYTES`` or overlong (a multi-byte varint whose last byte is 0), and the count
is the one expected; the caller checks the range (the last index).
"""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

MAX_BYTES = 5  # 35 bits: any index of a frame-sized segment


def encode_gaps(indices: np.ndarray) -> np.ndarray:
    """The varint bytes (``|u1``) of strictly increasing non-negative ``indices``."""
    gaps: np.ndarray = np.diff(indices.astype(np.int64), prepend=-1) - 1
    lengths = np.ones(gaps.size, np.int64)
    for shift in range(7, 7 * MAX_BYTES, 7):
        lengths += gaps >= (1 << shift)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), np.uint8)
    for position in range(MAX_BYTES):
        here = lengths > position
        if not here.any():
            break
        group = (gaps[here] >> (7 * position)) & 0x7F
        more = np.where(lengths[here] > position + 1, 0x80, 0)
        out[starts[here] + position] = group | more
    return out


def decode_gaps(data: np.ndarray, count: int, codec: str) -> np.ndarray:
    """The ``count`` indices (int64, strictly increasing) that ``data`` encodes; raises
    ``CodecError`` naming ``codec`` when the bytes are not exactly that many varints."""
    if data.size == 0:
        if count:
            raise CodecError(f"{codec}: no index bytes for {count} values")
        return np.zeros(0, np.int64)
    last = data < 0x80
    if not last[-1]:
        raise CodecError(f"{codec}: index bytes end inside a varint")
    ends = np.flatnonzero(last)
    if ends.size != count:
        raise CodecError(f"{codec}: {ends.size} indices for {count} values")
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > MAX_BYTES:
        raise CodecError(f"{codec}: an index varint is longer than {MAX_BYTES} bytes")
    if (data[ends[lengths > 1]] == 0).any():
        raise CodecError(f"{codec}: an index varint is overlong (ends in a zero byte)")
    position = np.arange(data.size) - np.repeat(starts, lengths)
    digits = (data & 0x7F).astype(np.int64) << (7 * position)
    gaps = np.add.reduceat(digits, starts)  # every varint has a byte: no empty range
    return np.cumsum(gaps + 1) - 1
