"""Fashion-MNIST (Debian ``dataset-fashion-mnist``) as an snet ``.npz``: X, y, lengths.

Each image is one "utterance" of one frame of 784 pixels in [0, 1] (use ``--context 0``
and a network ``784:...:10``); the server normalises the frames as any data. Only the
60000 training images are used (snet holds out its own CV utterances).

    .venv/bin/python -m bench.fashion_npz /tmp/fmnist.npz [--images N]
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np

SOURCE = Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format): a big-endian header of dimensions, then uint8."""
    with gzip.open(path, "rb") as stream:
        raw = stream.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def convert(out: Path, images: int = 0, source: Path = SOURCE) -> Path:
    pixels = read_idx(source / "train-images-idx3-ubyte.gz")
    labels = read_idx(source / "train-labels-idx1-ubyte.gz")
    if images:
        pixels, labels = pixels[:images], labels[:images]
    X = pixels.reshape(len(pixels), -1).astype(np.float32) / 255.0
    np.savez(out, X=X, y=labels.astype(np.int64), lengths=np.ones(len(X), dtype=np.int64))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=0, help="the first N only (0: all)")
    args = parser.parse_args()
    print(convert(args.out, args.images))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
