"""``SpertBoard``: the emulated device, with the calls MultiSpert's host made to it.

The host configures the board for a network, then drives it with ``load_weights``,
``load_patterns`` (a chunk of patterns and their targets), ``train_bunch`` or
``forward``, ``read_results`` and ``wait``. Data crosses the emulated SBus link as the
board's words (a 32-bit weight is 4 bytes, a 16-bit input 2), and every call is charged
its modelled time (see ``timing``). Board memory is 8 MB: the 32-bit weights (the loaded
copy and the updated one), the pattern chunk, a bunch's activations, deltas and
accumulators, and the lookup tables must all fit, or the network is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from snet.protocol.errors import ConfigError
from snet.protocol.memory import WORD16, WORD32, MemoryPlan, WorkerMemory
from snet.protocol.network import NetworkSpec

from .config import BoardConfig
from .fixedpoint import EXP_TABLE, SIGMOID_TABLE, TANH_TABLE
from .kernels import Block, BoardMatrix, FixedPointNetwork
from .timing import BoardClock, CostModel

# The memory plan is protocol/memory.py's: the server sizes np slices with it too.
TABLE_BYTES = SIGMOID_TABLE.nbytes + TANH_TABLE.nbytes + EXP_TABLE.nbytes


class BoardMemoryError(ConfigError):
    """The network (with its bunch and pattern chunk) does not fit the board's memory."""


class BoardUsageError(ConfigError):
    """A call out of order (training before weights or patterns were loaded, ...)."""


@dataclass
class BoardResults:
    """What ``read_results`` brings back to the host."""

    outputs: np.ndarray  # int16 Q0.15 output probabilities of the last patterns
    updated: list[np.ndarray] | None  # the updated 32-bit weights, when asked for


class SpertBoard:
    """One emulated Spert-II: memory, fixed-point arithmetic and the link, in time."""

    def __init__(self, config: BoardConfig, clock: BoardClock | None = None) -> None:
        self.config = config
        self.clock = clock or BoardClock(config.time_scale)
        self.plan: MemoryPlan | None = None
        self._cost: CostModel | None = None
        self._network: FixedPointNetwork | None = None
        self._bunch = 0
        self._weights: list[BoardMatrix] | None = None
        self._patterns: Block | None = None
        self._labels: np.ndarray | None = None
        self._outputs = np.zeros((0, 0), dtype=np.int16)
        self._updated: list[np.ndarray] | None = None
        self.patterns_trained = 0
        self.patterns_forward = 0

    @property
    def cost(self) -> CostModel:
        if self._cost is None:
            raise BoardUsageError("the board is not configured for a network")
        return self._cost

    @property
    def saturations(self) -> int:
        return self._network.sat.count if self._network else 0

    @property
    def memory(self) -> WorkerMemory:
        """The board's memory as a worker states it (np mode sizes slices by it)."""
        return WorkerMemory(self.config.memory_bytes, self.config.chunk_patterns, TABLE_BYTES)

    def configure(self, spec: NetworkSpec, bunch: int) -> MemoryPlan:
        """Prepare for ``spec`` trained in bunches of ``bunch``; refuse what does not fit."""
        plan = self.memory.plan(spec, bunch)
        if plan.total > self.config.memory_bytes:
            raise BoardMemoryError(
                f"network {spec.describe()} with bunches of {bunch} does not fit the Spert "
                f"board: it needs {plan.describe()}, the board has "
                f"{self.config.memory_mb:g} MB; use fewer hidden units or a smaller bunch"
            )
        self.plan, self._bunch = plan, bunch
        self._cost = CostModel.for_network(self.config, spec)
        self._network = FixedPointNetwork(spec)
        self._weights = self._patterns = self._labels = self._updated = None
        return plan

    # ------------------------------------------------------------ host -> board

    def load_weights(self, matrices: list[BoardMatrix]) -> None:
        """Copy the 32-bit weights and their exponents into board memory."""
        started = self.clock.start()
        self._weights = [BoardMatrix(m.words.astype(np.int32), m.fraction) for m in matrices]
        nbytes = sum(m.words.size for m in matrices) * WORD32
        self.clock.finish(started, self.cost.to_board(nbytes), "link")

    def load_patterns(self, patterns: Block, labels: np.ndarray | None = None) -> None:
        """Copy a chunk of 16-bit patterns (and their targets, for training) to the board."""
        rows = len(patterns.words)
        if rows > max(self._bunch, self.config.chunk_patterns):
            raise BoardUsageError(f"a chunk of {rows} patterns is larger than the board's buffer")
        started = self.clock.start()
        self._patterns = Block(patterns.words.astype(np.int16), patterns.fraction)
        self._labels = None if labels is None else np.array(labels, dtype=np.int64)
        nbytes = patterns.words.size * WORD16 + (0 if labels is None else rows * WORD16)
        self.clock.finish(started, self.cost.to_board(nbytes), "link")

    # ------------------------------------------------------------ computing

    def _loaded(self) -> tuple[FixedPointNetwork, list[BoardMatrix], Block]:
        if self._network is None or self._weights is None or self._patterns is None:
            raise BoardUsageError("load the weights and the patterns before computing")
        return self._network, self._weights, self._patterns

    def train_bunch(self, rate_shift: int) -> None:
        """Train on the loaded bunch: the updated weights go to a second copy in memory."""
        network, weights, patterns = self._loaded()
        if self._labels is None:
            raise BoardUsageError("training needs the patterns' targets")
        if len(self._labels) > self._bunch:
            raise BoardUsageError(f"{len(self._labels)} patterns exceed the bunch of {self._bunch}")
        started = self.clock.start()
        self._updated, self._outputs = network.train(weights, patterns, self._labels, rate_shift)
        self.patterns_trained += len(self._labels)
        self.clock.finish(started, self.cost.train(len(self._labels)), "compute")

    def forward(self) -> None:
        """Forward pass over the loaded chunk: output probabilities stay on the board."""
        network, weights, patterns = self._loaded()
        started = self.clock.start()
        _, self._outputs = network.forward(weights, patterns)
        self.patterns_forward += len(patterns.words)
        self.clock.finish(started, self.cost.forward(len(patterns.words)), "compute")

    # ------------------------------------------------------------ board -> host

    def read_results(self, weights: bool = False) -> BoardResults:
        """Wait for the board, then bring back the outputs (and the updated weights)."""
        self.clock.wait()
        started = self.clock.start()
        outputs = self._outputs.copy()
        updated = None
        nbytes = outputs.size * WORD16
        if weights:
            if self._updated is None:
                raise BoardUsageError("no updated weights to read: train a bunch first")
            updated = [words.copy() for words in self._updated]
            nbytes += sum(words.size for words in updated) * WORD32
        self.clock.finish(started, self.cost.to_host(nbytes), "link")
        self.clock.wait()
        return BoardResults(outputs, updated)

    def wait(self) -> None:
        """Block until every call issued so far has finished in board time."""
        self.clock.wait()

    # ------------------------------------------------------------ np mode

    def charge(
        self, parts: list[tuple[float, str]], started: tuple[float, float] | None = None
    ) -> None:
        """A call whose arithmetic the host did (np mode's slices, client/slice_work.py),
        of ``parts`` ((board seconds, "link" or "compute") back to back): the board is busy
        for their modelled time from ``started`` (``clock.start()`` taken before the host's
        arithmetic, which the board's time then covers, as the real board's own arithmetic
        would be; now if not given)."""
        self.clock.finish_parts(started or self.clock.start(), parts)
