"""The chunks of an epoch in leasing order, a function of the job's seed and the epoch.

Shuffled frame order (the default): the training frames permuted by
``numpy.random.default_rng([seed, epoch])`` and cut into chunks of ``chunk_frames``.
Sequential: chunks of consecutive frames, leased in an order permuted by the same
generator. ``LeaseBook`` takes its chunks from here, and through it the sequential
trainer (cli/offline.py), so `snet train` trains in the order a lone worker is leased,
and a restored server rebuilds the epoch it was in.

The permutation is the one cost here that grows with the data: 0.2 s for 1.8 million
frames and 1.3 s for 10 million on the development machine, which the server's event
loop spent at each epoch's start, answering nobody. From ``SHUFFLE_AHEAD_FROM`` frames the
next epoch's permutation is computed ahead, while this one trains, in a thread of its
own (numpy's permutation lets go of the interpreter); it is the same permutation, so
runs do not change. Its price is memory: a second permutation (8 bytes a frame, 80 MB for
10 million) is held while an epoch trains (not during the job's last epoch, which has no
next).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np

# Below this many frames a permutation takes under about 30 ms: not worth a thread.
SHUFFLE_AHEAD_FROM = 250_000


class EpochChunks:
    """Each epoch's chunks, the next epoch's shuffle computed ahead for large data."""

    def __init__(
        self,
        frames: np.ndarray,
        seed: int,
        chunk_frames: int,
        sequential: bool = False,
        epochs: int = 0,
    ) -> None:
        """``epochs``: the job's, numbered from 0 (0: not known, every epoch has a next)."""
        self.frames = frames
        self.seed = seed
        self.chunk_frames = chunk_frames
        self.sequential = sequential
        self.epochs = epochs
        self._ahead: tuple[int, Future[np.ndarray]] | None = None
        self._sorted: np.ndarray | None = None  # sequential order's frames, sorted once

    def of_epoch(self, epoch: int) -> list[np.ndarray]:
        """The chunks of ``epoch``, in the order they are leased."""
        step = self.chunk_frames
        if self.sequential:
            if self._sorted is None:
                self._sorted = np.sort(self.frames)
            frames = self._sorted
            chunks = [frames[start : start + step] for start in range(0, len(frames), step)]
            order = np.random.default_rng([self.seed, epoch]).permutation(len(chunks))
            return [chunks[i] for i in order]
        shuffled = self._shuffled(epoch)
        return [shuffled[start : start + step] for start in range(0, len(shuffled), step)]

    def _shuffled(self, epoch: int) -> np.ndarray:
        """``epoch``'s permutation of the frames (waiting for it if it is being computed
        ahead), and the next one's started ahead if the data is large."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == epoch:
            shuffled = ahead[1].result()
        else:
            shuffled = self._permutation(epoch)
        if len(self.frames) >= SHUFFLE_AHEAD_FROM and not 0 < self.epochs <= epoch + 1:
            future = self._in_thread(epoch + 1)
            self._ahead = None if future is None else (epoch + 1, future)
        return shuffled

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.frames)

    def _in_thread(self, epoch: int) -> Future[np.ndarray] | None:
        future: Future[np.ndarray] = Future()

        def compute() -> None:
            try:
                future.set_result(self._permutation(epoch))
            except BaseException as exc:  # raised where the chunks are taken
                future.set_exception(exc)

        # a daemon: a server that stops meanwhile does not wait for an order it won't use
        try:
            threading.Thread(target=compute, name="snet-epoch-order", daemon=True).start()
        except RuntimeError:  # no thread to be had (a limit, an interpreter shutting down):
            return None  # the epoch's order is computed when it starts, as without one
        return future
