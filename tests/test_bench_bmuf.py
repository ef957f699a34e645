"""The bmuf benchmarks' pure parts: the Fashion-MNIST converter, the grid, the epoch lines.

Nothing here is timed; the benchmarks themselves run for minutes (docs/bmuf.md).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from bench.bmuf_convergence import grid, markdown
from bench.bmuf_speed import EPOCH_LINE, first_at, wire_bytes
from bench.fashion_mnist import convert, read_idx


def _idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_becomes_one_frame_utterances(tmp_path: Path) -> None:
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    _idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([9, 0, 4]))
    assert convert("train", tmp_path / "f.npz", tmp_path) == 3
    data = np.load(tmp_path / "f.npz")
    assert data["X"].shape == (3, 784) and data["X"].dtype == np.float32
    np.testing.assert_allclose(data["X"][1], images[1].ravel() / 255.0, rtol=1e-6)
    assert data["y"].tolist() == [9, 0, 4] and data["lengths"].tolist() == [1, 1, 1]


def test_a_truncated_or_foreign_idx_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as stream:
        stream.write(struct.pack(">HBB", 0, 0x08, 1) + struct.pack(">I", 5) + b"abc")
    with pytest.raises(ValueError, match="3 values, the header says"):
        read_idx(path)
    with gzip.open(path, "wb") as stream:
        stream.write(struct.pack(">HBB", 0, 0x0D, 1) + struct.pack(">I", 1) + b"abcd")
    with pytest.raises(ValueError, match="not an IDX file of unsigned bytes"):
        read_idx(path)


def test_the_grid_and_its_table() -> None:
    names = [name for name, _ in grid([2, 4], [4, 16], ["cbm", "average"])]
    assert names[:5] == ["sequential", "sync 2", "sync 4", "async 2", "async 4"]
    assert len(names) == 5 + 2 * 2 * 2 and "average 4 16" in names
    ahead = [name for name, _ in grid([2], [16], ["cbm"], overlap=True)]
    assert ahead[-2:] == ["cbm 2 16", "cbm+overlap 2 16"]
    results = {
        "runs": {
            "sequential": {"cv": [0.5, 0.9], "seconds": 10.0},
            "cbm 2 16": {"cv": [0.6, 0.8945], "seconds": 12.4},
        }
    }
    table = markdown(results).splitlines()
    assert table[3] == "| cbm 2 16 | 60.00 89.45 | 89.45 | -0.55 | 12 |"


def test_epoch_lines_of_train_and_demo_and_the_first_at_a_target() -> None:
    train = "epoch  3  lr 0.2      train  91.00%  CV  90.52%"
    demo = "epoch  3/10  lr 0.2     train  91.00%  CV  90.52%  ( 12.3 s)"
    for line in (train, demo):
        match = EPOCH_LINE.match(line)
        assert match is not None and float(match.group(2)) == 90.52
    assert first_at([(1.0, 0.8), (2.0, 0.9219), (3.0, 0.95)], 0.9219) == 2.0
    assert first_at([(1.0, 0.8)], 0.9) is None
    status = {
        "compression": {"received_bytes": 1000, "sent_bytes": 3000, "updates": 10},
        "epochs": [{}, {}],
    }
    assert wire_bytes(status) == {
        "received_bytes_per_epoch": 500,
        "sent_bytes_per_epoch": 1500,
        "updates_per_epoch": 5.0,
    }
