"""Feature normalisation: mean and standard deviation over the training frames.

Computed in one streaming pass (a few thousand frames at a time, sums in float64), so a
corpus need not fit in memory. Saved and read in Quicknet's norm-file format (as
``qnnorm`` writes and ``qnstrn norm_file=`` reads): ``vec F`` then F means one per
line, then ``vec F`` and F *reciprocal* standard deviations. A standard deviation below
1e-8 is taken as 1, so a constant feature passes through centred but unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snet.protocol.errors import DataError

from .sources import FrameSource, located

CHUNK_FRAMES = 65536
STD_FLOOR = 1e-8  # a standard deviation below this is taken as 1 (a constant feature)


@dataclass(frozen=True)
class Norms:
    """Per-feature mean and standard deviation (float64)."""

    mean: np.ndarray
    std: np.ndarray

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """``(raw - mean) / std`` as float32."""
        normalised: np.ndarray = ((raw - self.mean) / self.std).astype(np.float32)
        return normalised

    def as_array(self) -> np.ndarray:
        """(2, features) float64: row 0 the means, row 1 the standard deviations."""
        return np.stack([self.mean, self.std]).astype("<f8")

    @classmethod
    def from_array(cls, array: np.ndarray, features: int | None = None) -> Norms:
        """From ``as_array``'s form: DataError unless it is 2 x ``features`` (when given)
        finite real values with positive standard deviations. A width that differs would
        broadcast (one mean for every feature) or fail later, far from its cause."""
        given = np.asarray(array)
        if given.dtype.kind not in "fiu":  # complex would lose its imaginary part silently
            raise DataError(f"normalisation must be real numbers, got dtype {given.dtype}")
        array = given.astype(np.float64)
        width = array.shape[1] if array.ndim == 2 else -1
        if array.shape[0:1] != (2,) or width < 1 or not np.isfinite(array).all():
            raise DataError(f"normalisation must be 2 x features finite values, got {array.shape}")
        if features is not None and width != features:
            raise DataError(f"normalisation is for {width} features, the data has {features}")
        if (array[1] <= 0).any():
            raise DataError("normalisation standard deviations must be positive")
        return cls(array[0].copy(), array[1].copy())


def _refuse_not_finite(source: FrameSource, rows: np.ndarray, chunk: np.ndarray) -> None:
    """DataError naming the first frame of ``chunk`` (the features of ``rows``) that has
    a NaN or an infinity: normalised, it trained nothing (0 % on train and CV) or made
    every worker refuse the job's NaN normalisation."""
    finite = np.isfinite(chunk)
    if finite.all():
        return
    at, feature = (int(i) for i in np.argwhere(~finite)[0])
    where, frame = located(source, int(rows[at]))
    value = chunk[at, feature]
    # an infinity read from a wider float was a finite number beyond float32's range
    what = f"{value} (or a number beyond float32's range)" if np.isinf(value) else value
    raise DataError(
        f"{where}: frame {frame} has {what} in feature {feature}: features must be finite numbers"
    )


def check_finite(source: FrameSource, frames: np.ndarray) -> None:
    """Refuse (DataError) NaN or infinite features in ``frames``, read in chunks."""
    rows = np.sort(np.asarray(frames, dtype=np.int64))
    for start in range(0, len(rows), CHUNK_FRAMES):
        part = rows[start : start + CHUNK_FRAMES]
        _refuse_not_finite(source, part, source.read(part))


def compute_norms(
    source: FrameSource, frames: np.ndarray, checked: np.ndarray | None = None
) -> Norms:
    """Mean and (population) standard deviation of ``frames``, read in chunks (DataError
    for a NaN or infinite feature among them, or among the ``checked`` frames: the CV
    frames of the same file, read now rather than in a pass of their own)."""
    if checked is not None:
        check_finite(source, checked)
    total = np.zeros(source.features, dtype=np.float64)
    squares = np.zeros(source.features, dtype=np.float64)
    rows = np.sort(np.asarray(frames, dtype=np.int64))
    if len(rows) == 0:
        raise DataError(f"{source.description}: no training frames to normalise on")
    for start in range(0, len(rows), CHUNK_FRAMES):
        part = rows[start : start + CHUNK_FRAMES]
        read = source.read(part)
        _refuse_not_finite(source, part, read)
        chunk = read.astype(np.float64)
        total += chunk.sum(axis=0)
        squares += np.square(chunk).sum(axis=0)
    mean = total / len(rows)
    variance = np.maximum(squares / len(rows) - mean * mean, 0.0)
    std = np.sqrt(variance)
    std[std < STD_FLOOR] = 1.0
    return Norms(mean, std)


def write_norm_file(path: str | Path, norms: Norms) -> None:
    """Quicknet norm file: means, then reciprocal standard deviations."""
    lines = [f"vec {len(norms.mean)}"] + [f"{v:.9g}" for v in norms.mean]
    lines += [f"vec {len(norms.std)}"] + [f"{1.0 / v:.9g}" for v in norms.std]
    Path(path).write_text("\n".join(lines) + "\n", encoding="ascii")


def read_norm_file(path: str | Path, features: int) -> Norms:
    """Read a Quicknet norm file of ``features`` values per vector."""
    try:
        words = Path(path).read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read norm file {path}: {exc}") from exc
    vectors: list[np.ndarray] = []
    position = 0
    try:
        for _ in range(2):
            if words[position] != "vec":
                raise ValueError(f"expected 'vec', found {words[position]!r}")
            count = int(words[position + 1])
            values = np.array([float(w) for w in words[position + 2 : position + 2 + count]])
            if len(values) != count:
                raise ValueError("file ends inside a vector")
            vectors.append(values)
            position += 2 + count
    except (IndexError, ValueError) as exc:
        raise DataError(f"{path} is not a Quicknet norm file: {exc}") from exc
    mean, scale = vectors
    if len(mean) != features or len(scale) != features:
        raise DataError(f"{path} normalises {len(mean)} features, the data has {features}")
    if not (np.isfinite(mean).all() and np.isfinite(scale).all()):
        raise DataError(f"{path}: means and scales must be finite numbers (nan or inf found)")
    if (scale <= 0).any():
        raise DataError(f"{path}: scales (1 / standard deviation) must be positive")
    return Norms(mean, 1.0 / scale)
