"""The worker's view of the training data: normalised frames and context windows.

Frames are stored once (frames x features) and a pattern is cut on demand as the window
of ``2 * context + 1`` frames around a centre frame, clipped at utterance boundaries
(the edge frame is repeated, as Quicknet does), so 13-dimensional frames are read once,
not nine times. Normalisation uses the mean and standard deviation of the training
frames only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec, frames_of, resolve_source, split_utterances


@dataclass
class Corpus:
    """Normalised frames, per-frame labels and utterance bounds, with the train/CV split."""

    frames: np.ndarray  # (n_frames, features) float32, normalised
    labels: np.ndarray  # (n_frames,) int64
    utterance_start: np.ndarray  # (n_frames,) first frame of each frame's utterance
    utterance_end: np.ndarray  # (n_frames,) one past its last frame
    train_frames: np.ndarray  # global indices
    cv_frames: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    context: int

    @property
    def features(self) -> int:
        return int(self.frames.shape[1])

    @property
    def pattern_size(self) -> int:
        return self.features * (2 * self.context + 1)

    def windows(self, indices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Patterns for the centre frames ``indices``: (len, window * features) float32."""
        offsets = np.arange(-self.context, self.context + 1)
        rows = indices[:, None] + offsets[None, :]
        np.clip(
            rows,
            self.utterance_start[indices, None],
            self.utterance_end[indices, None] - 1,
            out=rows,
        )
        if out is None:
            out = np.empty((len(indices), self.pattern_size), dtype=np.float32)
        np.take(self.frames, rows, axis=0, out=out.reshape(len(indices), len(offsets), -1))
        return out


def load_arrays(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X (frames x features), per-frame labels and utterance lengths from an .npz file."""
    try:
        with np.load(path) as data:
            frames, labels, lengths = data["X"], data["y"], data["lengths"]
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"cannot read {path}: needs arrays X, y, lengths ({exc})") from exc
    lengths = np.asarray(lengths, dtype=np.int64)
    if frames.ndim != 2 or lengths.ndim != 1 or (lengths < 1).any():
        raise DataError(f"{path}: X must be 2-D and lengths positive")
    if int(lengths.sum()) != len(frames):
        raise DataError(f"{path}: lengths add up to {lengths.sum()}, X has {len(frames)} frames")
    if len(labels) == len(lengths) and len(labels) != len(frames):
        labels = np.repeat(labels, lengths)  # one label per utterance
    if len(labels) != len(frames):
        raise DataError(f"{path}: {len(labels)} labels for {len(frames)} frames")
    return frames.astype(np.float32), labels.astype(np.int64), lengths


def load_corpus(spec: DataSpec, outputs: int) -> Corpus:
    """Load, split and normalise the job's data; check labels against the output size."""
    frames, labels, lengths = load_arrays(resolve_source(spec.source))
    if labels.min() < 0 or labels.max() >= outputs:
        raise DataError(
            f"labels run from {labels.min()} to {labels.max()}, "
            f"but the network has {outputs} outputs (0..{outputs - 1})"
        )
    train_utts, cv_utts = split_utterances(len(lengths), spec.cv_fraction, spec.split_seed)
    train, cv = frames_of(train_utts, lengths), frames_of(cv_utts, lengths)
    mean = frames[train].mean(axis=0, dtype=np.float64)
    std = frames[train].std(axis=0, dtype=np.float64)
    std[std < 1e-8] = 1.0
    normalised = ((frames - mean) / std).astype(np.float32)
    starts = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return Corpus(
        frames=normalised,
        labels=labels,
        utterance_start=starts,
        utterance_end=starts + np.repeat(lengths, lengths),
        train_frames=train,
        cv_frames=cv,
        mean=mean.astype(np.float32),
        std=std.astype(np.float32),
        context=spec.context,
    )
