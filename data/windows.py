"""Context windows: the rows around a centre frame, clipped to its utterance.

The pattern of frame ``i`` is the ``2 * context + 1`` frames around ``i``; rows outside
``i``'s utterance are replaced by its first or last frame (the edge frame is repeated,
as Quicknet does). Only utterance lengths are needed to compute which rows a window
uses, so the server can tell which raw frames a worker needs without the features.
"""

from __future__ import annotations

import numpy as np


class UtteranceBounds:
    """Where each utterance starts and ends, from the lengths alone."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @property
    def total_frames(self) -> int:
        return int(self.starts[-1])

    def utterance_of(self, frames: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, frames, side="right") - 1

    def start_of(self, frames: np.ndarray) -> np.ndarray:
        """First frame of each frame's utterance."""
        starts: np.ndarray = self.starts[self.utterance_of(frames)]
        return starts

    def end_of(self, frames: np.ndarray) -> np.ndarray:
        """One past the last frame of each frame's utterance."""
        ends: np.ndarray = self.starts[self.utterance_of(frames) + 1]
        return ends

    def window_rows(self, frames: np.ndarray, context: int) -> np.ndarray:
        """(len(frames), 2 * context + 1) row numbers, clipped to each utterance."""
        frames = np.asarray(frames, dtype=np.int64)
        utterances = self.utterance_of(frames)
        rows = frames[:, None] + np.arange(-context, context + 1)[None, :]
        # maximum and minimum rather than clip: a third of the time for a small bunch,
        # where a worker's step is short enough for this to show
        np.maximum(rows, self.starts[utterances, None], out=rows)
        np.minimum(rows, self.starts[utterances + 1, None] - 1, out=rows)
        return rows

    def needed_rows(self, frames: np.ndarray, context: int) -> np.ndarray:
        """The distinct rows the windows of ``frames`` read, sorted."""
        return np.unique(self.window_rows(frames, context))
