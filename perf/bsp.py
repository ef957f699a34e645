"""The BSP cost of exemplar parallelism with batch learning (Rogers & Skillicorn, 1998).

Supersteps of cost ``w + h * g + l`` in flops, for an epoch of E exemplars: exchanging
weight changes among all processors, or through a parameter server (snet's sync mode).
docs/performance-model.md compares it with the MultiSpert model of perf/model.py, from
the same measured constants (``bsp_machine_from_constants``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import WORD_BYTES, Constants


@dataclass(frozen=True)
class BspMachine:
    """BSP parameters: ``s`` flops per second, ``g`` flops per word sent or received by
    the busiest processor, ``l`` flops per barrier synchronisation."""

    name: str
    s: float
    g: float
    l: float  # noqa: E741 - the BSP literature's name


@dataclass(frozen=True)
class BspCost:
    """The cost of one batch in flops: work, words through the busiest processor, barriers."""

    w: float
    h: float
    supersteps: int

    def flops(self, machine: BspMachine) -> float:
        return self.w + self.h * machine.g + self.supersteps * machine.l


def bsp_exemplar_batch_cost(
    weights: int, per_processor: int, processors: int, flops_per_update: float = 6.0
) -> BspCost:
    """Exemplar parallelism with batch learning, weight changes by total exchange.

    Superstep 1: every processor runs ``per_processor`` exemplars forward and backward
    (``flops_per_update`` per weight and exemplar: 2 forward, 2 back, 2 for the change)
    and sends its W weight changes to each of the other p - 1 (h = (p-1) W). Then each adds
    the p - 1 received changes to its own and updates its copy (2 flops per weight); that
    work has no communication, so it joins the next batch's first superstep.
    """
    w = weights * (flops_per_update * per_processor + (processors - 1) + 2)
    return BspCost(w=w, h=(processors - 1) * weights, supersteps=1)


def bsp_server_batch_cost(
    weights: int, per_processor: int, processors: int, flops_per_update: float = 6.0
) -> BspCost:
    """The same batch through a parameter server (snet's sync mode), two supersteps.

    Superstep 1: the workers compute as above and send W changes each; the server
    receives p W words. Superstep 2: it adds them and updates ((p + 1) W flops) and sends
    W words to each worker: p W again. So h = 2 p W through the server, two barriers.
    """
    w = weights * (flops_per_update * per_processor + (processors + 1))
    return BspCost(w=w, h=2 * processors * weights, supersteps=2)


def bsp_epoch_flops(
    cost: BspCost, machine: BspMachine, exemplars: int, per_processor: int, processors: int
) -> float:
    """Cost of an epoch of ``exemplars`` exemplars: batches of ``p * per_processor``."""
    batches = math.ceil(exemplars / (per_processor * processors))
    return batches * cost.flops(machine)


def bsp_epoch_seconds(
    weights: int,
    exemplars: int,
    per_processor: int,
    processors: int,
    machine: BspMachine,
    exchange: str = "total",
) -> float:
    """Seconds per epoch of exemplar-parallel batch learning on ``machine``."""
    cost_of = bsp_exemplar_batch_cost if exchange == "total" else bsp_server_batch_cost
    cost = cost_of(weights, per_processor, processors)
    return bsp_epoch_flops(cost, machine, exemplars, per_processor, processors) / machine.s


def bsp_machine_from_constants(constants: Constants, name: str = "this machine") -> BspMachine:
    """The BSP view of measured constants: s from the compute rate (6 flops per update),
    g from the server's time per word, l from a message's whole cost (a barrier is one
    message to the server and one back, each with its wake-ups)."""
    s = 6.0 / constants.cu_seconds
    g = WORD_BYTES * constants.link_seconds_per_byte * s
    return BspMachine(name, s, g, (constants.message_seconds + constants.latency_seconds) * s)
