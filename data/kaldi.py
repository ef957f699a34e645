"""Kaldi features (feats.scp or .ark) with per-frame labels from alignments, via kaldiio.

Features are read one utterance at a time through the scp index (an .ark given without
its scp is read into memory whole). Labels come from an alignment archive of integer
vectors, one label per frame (``ali-to-pdf`` or ``ali-to-phones --per-frame`` output,
binary or text); utterances are taken in the order of the features, and every one needs
an alignment of exactly its number of frames. kaldiio is an optional dependency
(``pip install 'snet-train[kaldi]'``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from snet.protocol.errors import DataError

CACHED_UTTERANCES = 64
# what kaldiio raises on a file that is not what it expects: its own format checks raise
# RuntimeError ("... is not a digit / File format is wrong?"), short reads EOFError
KALDI_ERRORS = (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError)


def _kaldiio() -> Any:
    try:
        import kaldiio
    except ImportError as exc:
        raise DataError(
            "Kaldi data needs the kaldiio package: pip install 'snet-train[kaldi]'"
        ) from exc
    return kaldiio


def _one_line(exc: Exception) -> str:
    """kaldiio's message on one line (it ends some with "\nFile format is wrong?")."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _load_table(path: str, what: str) -> Any:
    """An scp as kaldiio's lazy mapping; an .ark read through into a dict."""
    kaldiio = _kaldiio()
    try:
        if path.endswith(".scp"):
            return kaldiio.load_scp(path)
        return dict(kaldiio.load_ark(path))
    except KALDI_ERRORS as exc:
        raise DataError(f"cannot read Kaldi {what} {path}: {_one_line(exc)}") from exc


class KaldiSource:
    """Features from feats.scp/.ark and labels from an alignment archive."""

    def __init__(self, features_path: str, labels_path: str, setting: str = "labels") -> None:
        """``setting``: the job's data field the labels come from (labels, cv_labels or
        test_labels), named in a refusal."""
        if not labels_path:
            flag = "--" + setting.replace("_", "-")
            raise DataError(
                f"Kaldi features {features_path} need per-frame labels: give {flag} "
                f"({setting} in [job.data]) an alignment archive (ali.ark or ali.scp)"
            )
        self.description = features_path
        self._table = _load_table(features_path, "features")
        alignments = _load_table(labels_path, "labels")
        self.keys = list(self._table.keys())
        if not self.keys:
            raise DataError(f"{features_path}: no utterances")
        missing = [k for k in self.keys if k not in alignments]
        if missing:
            raise DataError(
                f"{labels_path} has no alignment for {len(missing)} utterance(s) "
                f"of {features_path}, e.g. {missing[0]!r}"
            )
        pieces = [np.asarray(alignments[k]).reshape(-1) for k in self.keys]
        self.lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        if (self.lengths < 1).any():
            raise DataError(f"{labels_path}: an alignment is empty")
        self.labels = np.concatenate(pieces).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.features = int(self._utterance(0).shape[1])

    def _utterance(self, number: int) -> np.ndarray:
        cached = self._cache.get(number)
        if cached is not None:
            self._cache.move_to_end(number)
            return cached
        key = self.keys[number]
        try:
            matrix = np.asarray(self._table[key], dtype=np.float32)
        except KALDI_ERRORS as exc:
            raise DataError(
                f"{self.description}: cannot read utterance {key!r}: {_one_line(exc)}"
            ) from exc
        if matrix.ndim != 2 or len(matrix) != self.lengths[number]:
            raise DataError(
                f"{self.description}: utterance {key!r} has {matrix.shape[0]} frames, "
                f"its alignment {self.lengths[number]} labels"
            )
        if hasattr(self, "features") and matrix.shape[1] != self.features:
            raise DataError(
                f"{self.description}: utterance {key!r} has {matrix.shape[1]} features, "
                f"the first one {self.features}"
            )
        self._cache[number] = matrix
        if len(self._cache) > CACHED_UTTERANCES:
            self._cache.popitem(last=False)
        return matrix

    def read(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.features), dtype=np.float32)
        utterances = np.searchsorted(self.starts, rows, side="right") - 1
        for number in np.unique(utterances):
            where = utterances == number
            out[where] = self._utterance(int(number))[rows[where] - self.starts[number]]
        return out


def write_kaldi(
    ark_path: str,
    scp_path: str,
    alignment_path: str,
    frames: np.ndarray,
    labels: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """Write features as ark+scp and labels as an alignment ark (one entry per utterance)."""
    kaldiio = _kaldiio()
    starts = np.concatenate([[0], np.cumsum(lengths)])
    keys = [f"utt{i:06d}" for i in range(len(lengths))]
    spans = list(zip(keys, starts[:-1], starts[1:], strict=True))
    features = {k: np.asarray(frames[a:b], np.float32) for k, a, b in spans}
    alignments = {k: np.asarray(labels[a:b], np.int32) for k, a, b in spans}
    kaldiio.save_ark(ark_path, features, scp=scp_path)
    kaldiio.save_ark(alignment_path, alignments)
