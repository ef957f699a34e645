"""ICSI Quicknet pfiles: reading (memory-mapped, nothing loaded up front) and writing.

A pfile is a 32768-byte ASCII header padded with NUL bytes, then the data section, then
(optionally) the sentence table. The header, one parameter per line::

    -pfile_header version 0 size 32768
    -num_sentences S
    -num_frames N
    -first_feature_column 2
    -num_features F
    -first_label_column 2+F
    -num_labels L
    -format ddff...fdd...d          (or with repeat counts: 2d13f1d)
    -data size N*(2+F+L) offset 0 ndim 2 nrow N ncol 2+F+L
    -sent_table_data size S+1 offset N*(2+F+L) ndim 1
    -end

The data section is N big-endian records of 4-byte columns: sentence number (int32),
frame number within the sentence (int32), F float32 features, L int32 labels. The
sentence table holds S+1 big-endian int32: the first row of each sentence, then N.
Offsets in the header count 4-byte values from the end of the header.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from snet.protocol.errors import DataError

HEADER_BYTES = 32768
VERSION_LINE = "-pfile_header version 0 size 32768"


def _number(header: str, name: str, path: str, default: int | None = None) -> int:
    match = re.search(rf"(?m)^{re.escape(name)} (\d+)", header)
    if match is None:
        if default is not None:
            return default
        raise DataError(f"{path}: pfile header has no {name}")
    return int(match.group(1))


def _unpack_format(text: str, path: str) -> str:
    """``2d13f1d`` -> ``ddfffffffffffffd``."""
    out = []
    for count, kind in re.findall(r"(\d*)([fd])", text):
        out.append(kind * (int(count) if count else 1))
    if "".join(re.findall(r"\d*[fd]", text)) != text:
        raise DataError(f"{path}: bad pfile -format {text!r}")
    return "".join(out)


class PFile:
    """An opened pfile: its header fields and memory-mapped columns (read on access)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(HEADER_BYTES)
        except OSError as exc:
            raise DataError(f"cannot read pfile {self.path}: {exc.strerror or exc}") from exc
        if len(raw) < HEADER_BYTES:
            raise DataError(f"{self.path}: too short for a pfile header ({len(raw)} bytes)")
        header = raw.split(b"\0", 1)[0].decode("ascii", errors="replace")
        if VERSION_LINE not in header:
            raise DataError(f"{self.path}: not a pfile (no '{VERSION_LINE}' line)")
        p = self.path
        self.sentences = _number(header, "-num_sentences", p)
        self.frames = _number(header, "-num_frames", p)
        self.features = _number(header, "-num_features", p)
        self.first_feature = _number(header, "-first_feature_column", p)
        self.labels_per_frame = _number(header, "-num_labels", p, default=0)
        self.first_label = _number(header, "-first_label_column", p) if self.labels_per_frame else 0
        data = re.search(r"-data size (\d+) offset (\d+) ndim 2 nrow (\d+) ncol (\d+)", header)
        if data is None:
            raise DataError(f"{p}: pfile header has no usable -data line")
        size, offset, rows, self.columns = (int(g) for g in data.groups())
        if offset != 0 or rows != self.frames or rows * self.columns != size:
            raise DataError(f"{p}: inconsistent -data line ({data.group(0)})")
        fmt = re.search(r"(?m)^-format (\S+)", header)
        if fmt is None:
            raise DataError(f"{p}: pfile header has no -format")
        kinds = _unpack_format(fmt.group(1), p)
        features = slice(self.first_feature, self.first_feature + self.features)
        labels = slice(self.first_label, self.first_label + self.labels_per_frame)
        if (
            len(kinds) != self.columns
            or kinds[:2] != "dd"
            or set(kinds[features]) - {"f"}
            or set(kinds[labels]) - {"d"}
            or features.stop > self.columns
            or labels.stop > self.columns
        ):
            raise DataError(f"{p}: -format {fmt.group(1)} does not match the columns")
        expected = HEADER_BYTES + 4 * size
        table = re.search(r"-sent_table_data size (\d+) offset (\d+) ndim 1", header)
        if table is not None:
            expected = max(expected, HEADER_BYTES + 4 * (int(table.group(2)) + int(table.group(1))))
        actual = Path(p).stat().st_size
        if actual < expected:
            raise DataError(f"{p}: file has {actual} bytes, its header promises {expected}")
        self._table_offset = int(table.group(2)) if table else None
        self._words = (
            np.memmap(p, dtype=">i4", mode="r", offset=HEADER_BYTES, shape=(rows, self.columns))
            if rows
            else np.zeros((0, self.columns), ">i4")
        )

    def feature_rows(self, rows: np.ndarray | slice) -> np.ndarray:
        """Features of the given rows as native float32 (reads only those rows)."""
        words = self._words[rows, self.first_feature : self.first_feature + self.features]
        return np.ascontiguousarray(words).view(">f4").astype(np.float32)

    def label_column(self) -> np.ndarray:
        """The first label of every frame (int64), read in one pass."""
        if not self.labels_per_frame:
            raise DataError(f"{self.path}: the pfile has no label column")
        return np.asarray(self._words[:, self.first_label], dtype=np.int64)

    def lengths(self) -> np.ndarray:
        """Frames per sentence: from the sentence table, else from the sentence column."""
        if self._table_offset is not None:
            table = np.fromfile(
                self.path,
                dtype=">i4",
                count=self.sentences + 1,
                offset=HEADER_BYTES + 4 * self._table_offset,
            ).astype(np.int64)
            if table[0] != 0 or table[-1] != self.frames or (np.diff(table) < 1).any():
                raise DataError(f"{self.path}: the sentence table is corrupt")
            return np.diff(table)
        sentence = np.asarray(self._words[:, 0], dtype=np.int64)
        if len(sentence) and (sentence[0] != 0 or (np.diff(sentence) < 0).any()):
            raise DataError(f"{self.path}: sentence numbers are not in order")
        counts = np.bincount(sentence, minlength=self.sentences)
        if len(counts) != self.sentences or (counts < 1).any():
            raise DataError(f"{self.path}: sentence numbers do not match -num_sentences")
        return counts.astype(np.int64)


def header_text(sentences: int, frames: int, features: int, labels: int) -> bytes:
    """The 32 KiB header of a pfile with a sentence table, as Quicknet writes it."""
    columns = 2 + features + labels
    size = columns * frames
    lines = [
        VERSION_LINE,
        f"-num_sentences {sentences}",
        f"-num_frames {frames}",
        "-first_feature_column 2",
        f"-num_features {features}",
        f"-first_label_column {2 + features}",
        f"-num_labels {labels}",
        "-format dd" + "f" * features + "d" * labels,
        f"-data size {size} offset 0 ndim 2 nrow {frames} ncol {columns}",
        f"-sent_table_data size {sentences + 1} offset {size} ndim 1",
        "-end",
    ]
    text = ("\n".join(lines) + "\n").encode("ascii")
    if len(text) > HEADER_BYTES:
        raise DataError("pfile header does not fit in 32768 bytes")
    return text.ljust(HEADER_BYTES, b"\0")


def write_pfile(
    path: str | Path, frames: np.ndarray, labels: np.ndarray, lengths: np.ndarray
) -> None:
    """Write frames (N x F float), one label per frame and utterance lengths as a pfile."""
    frames = np.asarray(frames, dtype=np.float32)
    labels = np.asarray(labels).reshape(len(labels), -1)
    lengths = np.asarray(lengths, dtype=np.int64)
    if frames.ndim != 2 or len(labels) != len(frames) or int(lengths.sum()) != len(frames):
        raise DataError("pfile: frames, labels and lengths do not agree")
    n, features = frames.shape
    starts = np.concatenate([[0], np.cumsum(lengths)])
    records = np.empty((n, 2 + features + labels.shape[1]), dtype=">i4")
    records[:, 0] = np.repeat(np.arange(len(lengths)), lengths)
    records[:, 1] = np.arange(n) - np.repeat(starts[:-1], lengths)
    records[:, 2 : 2 + features] = frames.astype(">f4").view(">i4")
    records[:, 2 + features :] = labels
    with open(path, "wb") as handle:
        handle.write(header_text(len(lengths), n, features, labels.shape[1]))
        handle.write(records.tobytes())
        handle.write(starts.astype(">i4").tobytes())
