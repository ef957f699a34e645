"""Fashion-MNIST as an snet ``.npz`` (X, y, lengths): one image a one-frame utterance.

Reads the IDX files of Debian's ``dataset-fashion-mnist`` (``apt-get install
dataset-fashion-mnist``: /usr/share/datasets/fashion-mnist/) and writes the 60,000
training images, 784 pixels scaled to [0, 1], as frames of length-1 utterances, so a job
with ``--context 0`` and network 784:H:10 trains on them and holds out its own CV share
(``cv_fraction``) of the training images. The 10,000 test images go to a second file,
never used by the benchmarks (the CV accuracy is their measure)::

    .venv/bin/python -m bench.fashion_mnist /tmp/fmnist.npz [--test /tmp/fmnist-test.npz]
"""

from __future__ import annotations

import argparse
import gzip
import struct
from pathlib import Path

import numpy as np

SOURCE = Path("/usr/share/datasets/fashion-mnist")
IDX_TYPES = {0x08: np.uint8}


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST file format: magic 0 0 type ndim, big-endian int32 dims)."""
    with gzip.open(path, "rb") as stream:
        raw = stream.read()
    zero, kind, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or kind not in IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=IDX_TYPES[kind], offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} values, the header says {dims}")
    return data.reshape(dims)


def convert(part: str, out: Path, source: Path = SOURCE) -> int:
    """Write ``part`` ("train" or "t10k") as an snet .npz; returns the image count."""
    images = read_idx(source / f"{part}-images-idx3-ubyte.gz")
    labels = read_idx(source / f"{part}-labels-idx1-ubyte.gz")
    if len(images) != len(labels):
        raise ValueError(f"{part}: {len(images)} images but {len(labels)} labels")
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0)
    y = labels.astype(np.int64)
    np.savez(out, X=x, y=y, lengths=np.ones(len(x), dtype=np.int64))
    return len(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fashion_mnist", description=__doc__)
    parser.add_argument("out", help="the training images' .npz")
    parser.add_argument("--test", help="also write the test images here")
    parser.add_argument("--source", default=str(SOURCE), help="the IDX files' directory")
    args = parser.parse_args(argv)
    source = Path(args.source)
    if not (source / "train-images-idx3-ubyte.gz").is_file():
        parser.error(f"no Fashion-MNIST in {source}: apt-get install dataset-fashion-mnist")
    print(f"{args.out}: {convert('train', Path(args.out), source)} images")
    if args.test:
        print(f"{args.test}: {convert('t10k', Path(args.test), source)} images")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
