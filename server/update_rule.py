"""The update rule: summed worker gradients in, a momentum step on the master weights out.

::

    g = (sum of the received gradient sums) / (patterns they cover)
    v = momentum * v - learning_rate * g
    w = w + v

Updates that already carry their worker's momentum (momentum-corrected codecs such as
``topk``, protocol 8.8) are the ``direct`` ones: scaled the same way, but added to the
weights outside v (``w = w + v - learning_rate * g_direct``); without them the step is
exactly the one above.

Dividing by the pattern count makes the step independent of how the patterns were split:
a synchronous step over N workers of b patterns each equals one sequential step on a
bunch of N*b patterns. Runs in a worker thread; the event loop only ever reads the
immutable ``snapshot`` the coordinator publishes after each step.

**Speed.** A 351:1262:45 network is 2 MB of float32, and a naive step makes five passes
over memory-sized arrays (sum, scale, two for the velocity, one for the weights). Here
the arrays are walked in blocks small enough to stay in the core's L1/L2 cache, and every
operation of a step (and of several consecutive steps, see ``steps``) runs on one block
before the next is loaded: each gradient is read from memory once, the velocity and the
weights once each way, whatever the number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

import numpy as np

from snet.protocol.network import ELEMENT_DTYPE

BLOCK = 65_536  # values per cache block: 256 kB per array: the five a step walks fit in L2
# A network at most this many values larger than whole blocks is cut into that many
# blocks, a little longer each, not one more of a few values: the default job's 65,546
# values were two passes over the step's arrays, the second for 10 of them, at the full
# cost in calls.
BLOCK_SLACK = BLOCK // 8
LANE_MIN_BLOCKS = 2  # split a step across threads only when each gets two blocks or more


class StepRule(Protocol):
    """What the step machinery needs of a rule: ``UpdateRule`` or ``BlockFilter``."""

    snapshot: np.ndarray  # what the workers are sent

    @property
    def weights(self) -> np.ndarray: ...  # the master weights, as the last step left them

    @property
    def model(self) -> np.ndarray: ...  # what is evaluated and saved

    def steps(
        self,
        groups: Sequence[Sequence[np.ndarray]],
        patterns: Sequence[int],
        learning_rate: float,
        direct: Sequence[Sequence[np.ndarray]] | None = None,
    ) -> np.ndarray | None: ...

    def publish(self, snapshot: np.ndarray) -> None: ...

    def load(self, weights: np.ndarray) -> None: ...

    def figures(self) -> dict[str, float | int | str]: ...

    def set_workers(self, workers: int) -> None: ...

    def checkpoint_state(self) -> dict[str, Any]: ...  # only between steps

    def restore_checkpoint(self, state: dict[str, Any]) -> None: ...


class UpdateRule:
    """Master weights and momentum, updated in place, with a published snapshot."""

    def __init__(self, weights: np.ndarray, momentum: float, lanes: int = 2) -> None:
        self.weights = np.array(weights, dtype=ELEMENT_DTYPE)
        self.weights.flags.writeable = False
        # Two velocity buffers: a step writes the spare one, so a step that finds NaN or
        # Inf halfway is dropped without having touched the momentum.
        self.velocity = np.zeros_like(self.weights)
        self._spare_velocity = np.zeros_like(self.weights)
        # A large step is cut into ``lanes`` ranges of blocks run by as many threads (the
        # calling one and helpers): numpy and BLAS release the GIL, and a synchronous
        # round's step is on the critical path while every worker waits for it.
        size = self.weights.size
        blocks = max(1, -(-size // BLOCK))
        if blocks > 1 and 0 < size % BLOCK <= BLOCK_SLACK:
            blocks -= 1
        self.block = -(-size // blocks) if size else 1  # values per block
        lanes = max(1, min(lanes, blocks // LANE_MIN_BLOCKS))
        scratch = min(self.block, max(size, 1))
        edges = (np.linspace(0, blocks, lanes + 1).astype(int) * self.block).tolist()
        # per lane: its range of values [first, last) and a block of scratch of its own
        self._lanes = [
            (first, last, np.empty(scratch, dtype=ELEMENT_DTYPE)) for first, last in pairwise(edges)
        ]
        self._ones = np.ones(scratch, dtype=ELEMENT_DTYPE)
        self._helpers = (
            ThreadPoolExecutor(lanes - 1, thread_name_prefix="snet-lane") if lanes > 1 else None
        )
        self.momentum = momentum
        self.snapshot: np.ndarray = self.weights

    def use_momentum(self, momentum: float) -> None:
        """The momentum of the steps from now on (bmuf's block momentum varies with the
        workers a block averages: server/block_filter.py)."""
        self.momentum = momentum

    @property
    def model(self) -> np.ndarray:
        """The weights that are evaluated and saved: the published snapshot."""
        return self.snapshot

    def publish(self, snapshot: np.ndarray) -> None:
        """The result of ``steps`` goes out with its version (on the event loop)."""
        self.snapshot = snapshot

    def figures(self) -> dict[str, float | int | str]:
        """Nothing to add to /status (a ``BlockFilter`` has its constants)."""
        return {}

    def set_workers(self, workers: int) -> None:
        """The number of workers training does not change this rule."""

    @property
    def lanes(self) -> int:
        """How many threads share a step (1 for networks of a few blocks)."""
        return len(self._lanes)

    def step(
        self,
        gradients: Sequence[np.ndarray],
        patterns: int,
        learning_rate: float,
        direct: Sequence[np.ndarray] = (),
    ) -> np.ndarray | None:
        """Apply one step for gradient sums covering ``patterns`` patterns in total.

        ``direct`` updates already carry their worker's momentum (momentum-corrected
        codecs): they are scaled the same way but added to the weights outside the
        velocity, ``w = w + v - learning_rate * g_direct / patterns``.

        Returns the new weights (read-only); the caller publishes them as ``snapshot``
        together with the new version number, so the two always agree. Returns None, and
        changes nothing, when the gradients contain NaN or Inf (or their sum overflows).
        """
        return self.steps([gradients], [patterns], learning_rate, [direct])

    def steps(
        self,
        groups: Sequence[Sequence[np.ndarray]],
        patterns: Sequence[int],
        learning_rate: float,
        direct: Sequence[Sequence[np.ndarray]] | None = None,
    ) -> np.ndarray | None:
        """Apply consecutive steps, one per group of gradient sums, in one fused pass.

        The result is exactly that of calling ``step`` once per group in order (the same
        float32 operations on every value, in the same order); only the intermediate
        weights are never materialised. Returns the final weights, or None (changing
        nothing) when any gradient holds NaN or Inf or a step overflows.
        """
        bypass = [()] * len(groups) if direct is None else direct
        if not groups or not len(groups) == len(patterns) == len(bypass):
            raise ValueError("steps needs one pattern count per group of gradients")
        if any(count < 1 for count in patterns):
            raise ValueError(f"a step needs at least one pattern, got counts {list(patterns)}")
        if any(not (group or extra) for group, extra in zip(groups, bypass, strict=True)):
            raise ValueError("a step needs at least one gradient (or direct update)")
        # The new weights go to a fresh buffer, which is the snapshot: buffers still being
        # sent to workers are never written again; the velocity goes to the spare buffer.
        work = _Pass(
            groups, bypass, [np.float32(-learning_rate / count) for count in patterns],
            self.weights, self.velocity, np.empty_like(self.weights), self._spare_velocity,
            np.float32(self.momentum), self._ones, self.block,
        )  # fmt: skip
        own, *theirs = self._lanes
        others = [
            self._helpers.submit(work.run, *lane) for lane in theirs if self._helpers is not None
        ]
        finite = work.run(*own)
        finite = all([f.result() for f in others]) and finite
        if not finite:
            return None
        work.weights.flags.writeable = False
        self.weights = work.weights
        self.velocity, self._spare_velocity = work.velocity, work.old_velocity
        return work.weights

    def load(self, weights: np.ndarray) -> None:
        """Replace the weights (e.g. to continue training) and reset the momentum."""
        fresh = np.array(weights, dtype=ELEMENT_DTYPE)
        if fresh.shape != self.weights.shape:
            raise ValueError(
                f"weights of shape {fresh.shape}, the network's are {self.weights.shape}"
            )
        fresh.flags.writeable = False
        self.weights = self.snapshot = fresh
        self.velocity[...] = 0.0
        self._spare_velocity[...] = 0.0

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """The weights and the velocity, consistent only between steps (a step, in the step
        thread or on the loop, writes the velocity). The weights are never written again;
        the velocity is copied, as the step after next overwrites its buffer."""
        return {"weights": self.weights, "velocity": self.velocity.copy()}

    def restore_checkpoint(self, state: dict[str, np.ndarray]) -> None:
        """Continue from ``checkpoint_state()``: the same weights and momentum."""
        self.load(state["weights"])
        velocity = np.asarray(state["velocity"], dtype=ELEMENT_DTYPE)
        if velocity.shape != self.velocity.shape:
            raise ValueError(f"velocity of shape {velocity.shape}, need {self.velocity.shape}")
        self.velocity[...] = velocity


@dataclass(frozen=True)
class _Pass:
    """One call of ``steps``: its inputs, and the fresh arrays it writes."""

    groups: Sequence[Sequence[np.ndarray]]
    direct: Sequence[Sequence[np.ndarray]]
    scales: list[np.float32]
    old_weights: np.ndarray
    old_velocity: np.ndarray
    weights: np.ndarray
    velocity: np.ndarray
    momentum: np.float32
    ones: np.ndarray
    block: int  # values per block

    def run(self, first: int, last: int, scratch: np.ndarray) -> bool:
        """Every step on values [first, last), block by block; False at the first block
        that is not finite."""
        last = min(last, self.weights.size)
        with np.errstate(over="ignore", invalid="ignore"):  # found by the check below
            for start in range(first, last, self.block):
                if not self._block(start, min(start + self.block, last), scratch):
                    return False
        return True

    def _block(self, start: int, end: int, scratch: np.ndarray) -> bool:
        total = scratch[: end - start]
        v, w = self.velocity[start:end], self.weights[start:end]
        steps = zip(self.groups, self.direct, self.scales, strict=True)
        for index, (group, bypass, scale) in enumerate(steps):
            if index == 0:
                np.multiply(self.old_velocity[start:end], self.momentum, out=v)
            else:
                v *= self.momentum
            if group:
                _scaled_sum(group, start, end, scale, total)
                v += total
            if index == 0:
                np.add(self.old_weights[start:end], v, out=w)
            else:
                w += v
            if bypass:
                _scaled_sum(bypass, start, end, scale, total)
                w += total
        # NaN and Inf in any gradient reach the weights (through the velocity), so one
        # check of each block of the result covers every update and every step. The sum
        # is taken as a BLAS dot product with ones: four times faster than numpy's own
        # reduction, and it only overflows where float32 weights would.
        return bool(np.isfinite(np.dot(w, self.ones[: end - start])))


def _scaled_sum(
    group: Sequence[np.ndarray], start: int, end: int, scale: np.float32, out: np.ndarray
) -> None:
    """out = scale * (sum of the group's gradients over [start, end))."""
    if len(group) == 1:
        np.multiply(group[0][start:end], scale, out=out)
        return
    np.add(group[0][start:end], group[1][start:end], out=out)
    for gradient in group[2:]:
        out += gradient[start:end]
    out *= scale
