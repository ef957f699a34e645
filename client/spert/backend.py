"""``SpertBackend``: the host side of an emulated Spert-II board, as a worker backend.

As on MultiSpert, the host selects the data (the context windows of the frames the
server leased), quantises it to the board's 16-bit words and drives the board; the board
does all the network arithmetic in fixed point. The server cannot tell this worker from
a numpy one except by the backend name "spert" in its Hello and by the figures it
reports (modelled busy, link and compute time, modelled MCUPS beside the real ones).

How a summed gradient comes out of the board. The board trains as Quicknet did: the
weights it receives are 32-bit words (16+16), the forward and backward passes use their
high halves, and the bunch's update, ``-(sum of gradients) * 2**-k`` with the learning
rate as a power-of-two shift ``k``, is added into all 32 bits (rounded, saturating) in a
second copy of the weights. The host reads that copy back and sends what the board
changed, divided by the board's rate: ``gradient sum = -(W32 after - W32 before) * 2**k``
in real units. The server then applies its own update rule (momentum, the scheduled rate
divided by the patterns in the step) to that sum exactly as to a numpy worker's, so the
rounding, truncation and saturation of the board's update are really in what is applied.
``k`` is ``round(log2(bunch_size / first learning rate))``: with the job's first rate the
server's step on this sum is the board's own step, within the power-of-two rounding.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD16, WORD32, WorkerMemory
from snet.protocol.network import ElementLayout, NetworkSpec

from ..data import Corpus, DenseStore
from .board import SpertBoard
from .config import BoardConfig
from .fixedpoint import (
    ACTIVATION_FRACTION,
    MAX_WEIGHT_FRACTION,
    fraction_bits_for,
    quantise,
)
from .kernels import Block, BoardMatrix


def weight_matrix(values: np.ndarray) -> BoardMatrix:
    """A float matrix as the board's 32-bit words, with a spare bit above its largest
    magnitude so that a bunch's update has room to grow it."""
    largest = float(np.abs(values).max(initial=0.0))
    fraction = min(fraction_bits_for(largest, 16, headroom=1), MAX_WEIGHT_FRACTION)
    return BoardMatrix(quantise(values, fraction + 16, 32), fraction)


def rate_shift_for(job: JobSpec) -> int:
    """The board's learning-rate shift: 2**-k is nearest the first rate per pattern."""
    return min(max(round(math.log2(job.bunch_size / job.learning_rates[0])), 0), 24)


class SpertBackend:
    """Worker arithmetic on an emulated Spert-II board (``snet worker --backend spert``)."""

    name = "spert"
    models_device_time = True  # sleeps the board's modelled time (client/spert/timing.py)

    def __init__(self, config: BoardConfig | None = None) -> None:
        self.config = config or BoardConfig()
        self.board = SpertBoard(self.config)
        self._corpus: Corpus | None = None
        self._layout: ElementLayout | None = None
        self._input_fraction = 0
        self._rate_shift = 0
        self._connections = 0
        self._loaded_float = np.zeros(0, dtype=np.float32)
        self._loaded: list[BoardMatrix] = []
        self._x = np.zeros((0, 0), dtype=np.float32)
        self._started = time.monotonic()

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        self.board.configure(job.network, job.bunch_size)  # refuses what does not fit
        self._corpus = corpus
        self._layout = ElementLayout.for_network(job.network)
        self._connections = job.network.connections
        largest = _largest_input(corpus)
        self._input_fraction = fraction_bits_for(largest, 16, limit=15)
        self._rate_shift = rate_shift_for(job)
        self._x = np.empty(
            (max(job.bunch_size, self.config.chunk_patterns), corpus.pattern_size), dtype=np.float32
        )
        self._loaded_float = np.zeros(0, dtype=np.float32)
        self._started = time.monotonic()

    def _ready(self) -> tuple[Corpus, ElementLayout]:
        if self._corpus is None or self._layout is None:
            raise ConfigError("the spert backend was used before prepare()")
        return self._corpus, self._layout

    def _ensure_weights(self, weights: np.ndarray) -> None:
        """Load ``weights`` unless the board already holds them (no link time then)."""
        if np.array_equal(weights, self._loaded_float):
            return
        _, layout = self._ready()
        self._loaded = [weight_matrix(view) for view in layout.views(weights)]
        self.board.load_weights(self._loaded)
        self._loaded_float = weights.copy()

    def _load(self, frames: np.ndarray, labels: np.ndarray | None) -> None:
        corpus, _ = self._ready()
        x = corpus.windows(frames, out=self._x[: len(frames)])
        words = quantise(x, self._input_fraction, 16)
        self.board.load_patterns(Block(words, self._input_fraction), labels)

    @staticmethod
    def _score(outputs: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """(summed cross-entropy, correct) from the board's Q0.15 probabilities."""
        picked = outputs[np.arange(len(labels)), labels].astype(np.float64)
        floor = 0.5  # half a unit in the last place: log(0) would be infinite
        probability = np.maximum(picked, floor) * 2.0**-ACTIVATION_FRACTION
        loss = float(-np.log(probability).sum())
        return loss, int((outputs.argmax(axis=1) == labels).sum())

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        corpus, layout = self._ready()
        labels = corpus.labels_of(frames)
        self._ensure_weights(weights)
        self._load(frames, labels)
        self.board.train_bunch(self._rate_shift)
        results = self.board.read_results(weights=True)
        assert results.updated is not None
        for view, before, after in zip(
            layout.views(out), self._loaded, results.updated, strict=True
        ):
            change = after.astype(np.int64) - before.words
            scale = 2.0 ** (self._rate_shift - before.fraction - 16)
            np.multiply(change, -scale, out=view, casting="unsafe")
        return self._score(results.outputs, labels)

    def evaluate(self, weights: np.ndarray) -> tuple[int, int, float]:
        corpus, _ = self._ready()
        self._ensure_weights(weights)
        frames = corpus.cv_frames
        loss, correct = 0.0, 0
        for start in range(0, len(frames), self.config.chunk_patterns):
            chunk = frames[start : start + self.config.chunk_patterns]
            self._load(chunk, None)
            self.board.forward()
            outputs = self.board.read_results().outputs
            chunk_loss, chunk_correct = self._score(outputs, corpus.labels_of(chunk))
            loss += chunk_loss
            correct += chunk_correct
        return len(frames), correct, loss

    # ------------------------------------------------------------ np mode (slice_work.py)

    def take_slice(self, spec: NetworkSpec, bunch: int) -> None:
        """Hold a slice of hidden units (``spec``: inputs, the slice's units, outputs);
        ``BoardMemoryError`` when its weights, buffers and tables do not fit the board."""
        self.board.configure(spec, bunch)
        self._connections = spec.connections

    def stated_memory(self) -> WorkerMemory:
        """The board's memory, stated when joining: the server cuts slices to fit it."""
        return self.board.memory

    def begin(self) -> tuple[float, float]:
        """Mark the start of a pass whose arithmetic the host is about to do: the pass's
        board time is charged from here, so it covers that arithmetic as it would the
        board's own (``slice_forward``, ``slice_backward``)."""
        return self.board.clock.start()

    def slice_forward(self, patterns: int, started: tuple[float, float] | None = None) -> None:
        """Model a slice's forward pass: the 16-bit patterns in, the partial outputs
        (32-bit accumulators) back, from ``started`` (``begin``); returns when the board
        would have finished."""
        cost = self.board.cost
        inputs, outputs = self._slice_sizes()
        parts = [
            (cost.to_board(patterns * inputs * WORD16), "link"),
            (cost.forward(patterns), "compute"),
            (cost.to_host(patterns * outputs * WORD32), "link"),
        ]
        self.board.charge(parts, started)
        self.board.patterns_forward += patterns
        self.board.wait()

    def slice_backward(self, patterns: int, started: tuple[float, float] | None = None) -> None:
        """Model a slice's update from the output error (16-bit, in): the rest of a
        training pass, its forward part done already, from ``started`` (``begin``); the
        board goes on meanwhile."""
        cost = self.board.cost
        outputs = self._slice_sizes()[1]
        parts = [
            (cost.to_board(patterns * outputs * WORD16), "link"),
            (max(cost.train(patterns) - cost.forward(patterns), 0.0), "compute"),
        ]
        self.board.charge(parts, started)
        self.board.patterns_trained += patterns

    def _slice_sizes(self) -> tuple[int, int]:
        _, layout = self._ready()
        return layout.shapes[0][0], layout.shapes[-1][0]

    def report(self) -> dict[str, Any] | None:
        """Modelled figures beside real ones, for /status (a WorkerReport)."""
        totals = self.board.clock.totals
        busy = totals.busy_seconds
        updates = self._connections * self.board.patterns_trained
        wall = time.monotonic() - self._started
        return {
            "board": "spert-ii (emulated)",
            "time_scale": self.config.time_scale,
            "modelled_busy_s": round(busy, 4),
            "modelled_link_s": round(totals.link_seconds, 4),
            "modelled_compute_s": round(totals.compute_seconds, 4),
            "modelled_mcups": round(updates / busy / 1e6, 2) if busy > 0 else 0.0,
            "real_compute_s": round(totals.real_seconds, 4),
            "real_mcups": round(updates / totals.real_seconds / 1e6, 2)
            if totals.real_seconds > 0
            else 0.0,
            "wall_s": round(wall, 3),
            "behind_model": totals.behind_count,
            "behind_s": round(totals.behind_seconds, 4),
            "patterns_trained": self.board.patterns_trained,
            "patterns_forward": self.board.patterns_forward,
            "saturations": self.board.saturations,
            "memory_mb": round(self.board.plan.total / (1 << 20), 3) if self.board.plan else 0.0,
        }


def _largest_input(corpus: Corpus) -> float:
    """The largest |normalised feature| of the training frames, for the fixed-point scale.

    Exact when the corpus is in memory; from a sample when it is read on demand; for a
    worker whose frames come inline (none at hand yet) 8 standard deviations, beyond
    which the board's inputs saturate.
    """
    if isinstance(corpus.store, DenseStore):
        return float(np.abs(corpus.frames[corpus.train_frames]).max(initial=0.0))
    sample = corpus.train_frames[:: max(1, len(corpus.train_frames) // 65536)]
    if corpus.store.has(sample):
        return float(np.abs(corpus.store.take(sample)).max(initial=0.0))
    return 8.0
