"""The weights' digest (protocol/digest.py) is CRC-32 whichever library computes it: a
server with zlib-ng (the ``fast`` extra) and a worker without it, or the reverse, must
agree on every element, or each would refuse the other's weights."""

from __future__ import annotations

import importlib
import sys
import zlib

import numpy as np
import pytest

from snet.protocol import digest


@pytest.mark.parametrize("size", [0, 1, 3, 7, 64, 65_546, 524_288 + 5])
def test_the_digest_is_zlibs_crc32_of_the_float32_bytes(size: int) -> None:
    flat = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    assert digest.weights_digest(flat) == f"{zlib.crc32(flat.tobytes()):08x}"
    labels = np.arange(size) % 10
    assert digest.labels_digest(labels) == f"{zlib.crc32(labels.astype('<i8').tobytes()):08x}"


def test_a_strided_element_is_digested_as_its_contiguous_copy() -> None:
    whole = np.arange(20, dtype=np.float32)
    assert digest.weights_digest(whole[::2]) == digest.weights_digest(whole[::2].copy())


def test_without_zlib_ng_the_standard_librarys_crc32_gives_the_same_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flat = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    with_it = digest.weights_digest(flat)
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # import zlib_ng raises ImportError
    try:
        plain = importlib.reload(digest)
        assert plain.crc32 is zlib.crc32
        assert plain.weights_digest(flat) == with_it
    finally:
        monkeypatch.undo()
        importlib.reload(digest)
    assert digest.crc32 is not zlib.crc32  # zlib-ng is installed here (the dev extra)
