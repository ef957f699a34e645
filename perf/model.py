"""Performance models of the seed papers, calibrated from measured constants (pure, no I/O).

Two models, both written down in docs/performance-model.md:

- **Quicknet on MultiSpert** (Färber & Asanović, 1997). A host (here: the snet server)
  feeds P workers over one link; per bunch a worker needs ``T_d`` of transfer, the host
  ``T_h`` of its own work, and a worker ``T_c`` of compute. On MultiSpert a round took
  ``T_d + T_c`` while ``(P - 1) * T_d + T_h < T_c`` and ``P * T_d`` otherwise. snet's
  async mode overlaps all but the sending end of a worker's update with its compute, so
  a round takes ``max(T_c + L / 2, P * T_d + T_h)``; without overlap (sync mode)
  ``T_c + L + P * T_d + T_h``, where T_d is the server's time per worker (its cost for
  one more worker) and L the rest of a worker's round trip.
  Compute per pattern is ``c1 * N_h + c2``. Two strategies: *pattern*-parallel (data
  division: each worker trains its own patterns and exchanges the whole element) and
  *network*-parallel (the hidden units split across workers, which exchange the output
  layer's activations).
- **BSP cost of exemplar parallelism with batch learning** (Rogers & Skillicorn, 1998):
  supersteps of cost ``w + h * g + l``, in flops, for an epoch of E exemplars.

Every time is in seconds unless a name says otherwise; MCUPS counts connection updates
(weights and biases times patterns) per second, in millions, as snet's /status does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from snet.protocol.errors import ConfigError
from snet.protocol.network import ELEMENT_DTYPE, NetworkSpec

STRATEGIES = ("pattern", "network")
MODES = ("sync", "async")
WORD_BYTES = ELEMENT_DTYPE.itemsize  # float32 on the wire


def per_pattern_coefficients(network: NetworkSpec, cu_seconds: float) -> tuple[float, float]:
    """(c1, c2) of Quicknet's per-pattern cost ``c1 * N_h + c2`` for a network whose every
    connection update costs ``cu_seconds``.

    A pattern updates ``connections`` weights and biases; the ones that grow with the hidden
    units go to c1 (per hidden unit), the output biases to c2. For one hidden layer
    c1 = (I + O + 1) * cu_seconds and c2 = O * cu_seconds.
    """
    hidden = sum(network.sizes[1:-1])
    fixed = network.output_size
    if hidden == 0:
        return 0.0, network.connections * cu_seconds
    return (network.connections - fixed) / hidden * cu_seconds, fixed * cu_seconds


@dataclass(frozen=True)
class Constants:
    """What the models are calibrated with, in seconds (bench/calibrate.py measures them)."""

    cu_seconds: float  # one connection update of one worker (one thread, bunch mode)
    pattern_seconds: float  # a pattern's cost beyond its connection updates
    link_seconds_per_byte: float  # one byte at the server's end of a transfer
    worker_seconds_per_byte: float  # one byte at the worker's end of a transfer
    message_seconds: float  # the server's own work for one message
    latency_seconds: float  # a message's cost away from the server (its other end, wake-ups)
    apply_seconds_per_byte: float  # server: per byte of each update it adds up
    step_seconds_per_byte: float  # server: per byte of the element, once per step
    step_fixed_seconds: float = 0.0  # server: a step's own cost beyond its bytes
    source: str = "defaults"

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if item.name != "source" and not (number and value >= 0.0):
                raise ConfigError(f"constant {item.name} must be a number >= 0, got {value!r}")
        if self.cu_seconds <= 0.0:
            raise ConfigError("constant cu_seconds must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> Constants:
        """Constants from a JSON object; every field is required but ``source`` and
        ``step_fixed_seconds`` (0 when absent: files written before it existed)."""
        data = {"step_fixed_seconds": 0.0, **data}
        names = [f.name for f in fields(cls) if f.name != "source"]
        missing = [name for name in names if name not in data]
        if missing:
            raise ConfigError(f"{source}: constants lack {', '.join(missing)}")
        try:
            values = {name: float(data[name]) for name in names}
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: constants must be numbers ({exc})") from None
        return cls(**values, source=source)

    def with_link_mbps(self, mbps: float) -> Constants:
        """The same constants with both ends of every transfer on ``mbps`` Mbit/s links."""
        if not mbps > 0:
            raise ConfigError(f"link speed must be > 0 Mbit/s, got {mbps}")
        per_byte = 8.0 / (mbps * 1e6)
        return replace(self, link_seconds_per_byte=per_byte, worker_seconds_per_byte=per_byte)

    @property
    def mcups(self) -> float:
        """One worker's compute rate alone, in MCUPS (patterns' fixed cost ignored)."""
        return 1e-6 / self.cu_seconds


# Measured on the development machine (2 cores, shared) with ``bench/calibrate.py`` on
# 351:1262:45, bunch 1000; `snet plan --calibrate` measures anew, `--constants` reads them.
DEFAULT_CONSTANTS = Constants(
    cu_seconds=3.39e-11,  # 29,500 MCUPS: the numpy step, one thread, denormals flushed
    pattern_seconds=0.0,
    link_seconds_per_byte=2.16e-10,  # the server's end of a transfer: 4.6 GB/s
    worker_seconds_per_byte=2.38e-10,  # the worker's end: 4.2 GB/s
    message_seconds=1.27e-4,  # the server's work for a message (framing, loop, step thread)
    latency_seconds=8.2e-5,  # a message's wake-ups and work away from the server
    apply_seconds_per_byte=4.1e-11,  # adding one more 2 MB update into the sum
    step_seconds_per_byte=4.89e-10,  # momentum, new weights and their publication, per byte
    step_fixed_seconds=1.0e-4,  # a step's hand-offs, ledger and statistics
    source="defaults (measured 2026-11-22 on the development machine)",
)


@dataclass(frozen=True)
class Phases:
    """One worker's share of a round: the MultiSpert model's T_c, T_d and T_h, and L."""

    compute: float  # T_c: one worker's compute for its part of the round
    transfer: float  # T_d: the server's time for its messages, both ways (serial over P)
    host: float  # T_h: the server's own work for the round
    latency: float  # L: the rest of its round trip, its own end and wake-ups (in parallel)
    patterns: int  # patterns the whole round trains


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one strategy, mode and worker count."""

    strategy: str
    mode: str
    workers: int
    round_seconds: float
    mcups: float
    speedup: float  # over one worker computing alone, with no communication at all
    # "compute" or "link": what limits the round. Async: whether a worker's cycle
    # (T_c + L / 2) or the server's P T_d + T_h is the longer; sync: whether compute is
    # at least half of the round (the rest is transfers and the step, in series with it).
    bound: str
    phases: Phases


def pattern_seconds(network: NetworkSpec, constants: Constants) -> float:
    """Quicknet's per-pattern cost ``c1 * N_h + c2`` on one worker."""
    c1, c2 = per_pattern_coefficients(network, constants.cu_seconds)
    return c1 * sum(network.sizes[1:-1]) + c2 + constants.pattern_seconds


def alone_mcups(network: NetworkSpec, constants: Constants, time_scale: float = 1.0) -> float:
    """MCUPS of one worker computing alone, with no communication: the speed-ups' base."""
    return network.connections / (time_scale * pattern_seconds(network, constants)) / 1e6


def _transfers(size: int, constants: Constants) -> tuple[float, float]:
    """(T_d, L) of a round trip of ``size`` bytes each way: the server's end of both
    messages, and the worker's end with the latencies."""
    return (
        2 * (size * constants.link_seconds_per_byte + constants.message_seconds),
        2 * (size * constants.worker_seconds_per_byte + constants.latency_seconds),
    )


def pattern_parallel_phases(
    network: NetworkSpec, bunch: int, workers: int, constants: Constants, time_scale: float = 1.0
) -> Phases:
    """Data division: each worker trains ``bunch`` patterns of its own per round, sends its
    update element and gets the new weights back; the server adds P updates and steps."""
    element = network.connections * WORD_BYTES
    compute = time_scale * bunch * pattern_seconds(network, constants)
    transfer, latency = _transfers(element, constants)
    host = element * (workers * constants.apply_seconds_per_byte + constants.step_seconds_per_byte)
    return Phases(compute, transfer, host + constants.step_fixed_seconds, latency, workers * bunch)


def network_parallel_phases(
    network: NetworkSpec, bunch: int, workers: int, constants: Constants, time_scale: float = 1.0
) -> Phases:
    """Hidden units split across workers; the round trains the same P * bunch patterns.

    Each worker computes its N_h / P hidden units for all patterns and sends the output
    layer's partial sums (patterns x outputs); the server adds them, applies the softmax
    and sends the output errors back; every worker then updates its own slice of the
    weights, so no weights cross the link.
    """
    patterns = workers * bunch
    hidden = sum(network.sizes[1:-1])
    c1, c2 = per_pattern_coefficients(network, constants.cu_seconds)
    per_pattern = c1 * hidden / workers + c2 + constants.pattern_seconds
    compute = time_scale * patterns * per_pattern
    activations = patterns * network.output_size * WORD_BYTES
    transfer, latency = _transfers(activations, constants)
    host = activations * (workers * constants.apply_seconds_per_byte)
    return Phases(compute, transfer, host + constants.step_fixed_seconds, latency, patterns)


def multispert_round_seconds(t_d: float, t_h: float, t_c: float, workers: int) -> float:
    """The MultiSpert rule: ``T_d + T_c`` while ``(P-1) T_d + T_h < T_c``, else ``P T_d``.

    As Färber & Asanović state it: a board waits for its own data (T_d) before it
    computes, and the host feeds the P boards one after the other.
    """
    if (workers - 1) * t_d + t_h < t_c:
        return t_d + t_c
    return workers * t_d


def overlapped_round_seconds(phases: Phases, workers: int) -> float:
    """A round with communication overlapped with compute (snet's async mode).

    A snet worker double-buffers (``max_in_flight`` 2): new weights arrive while it
    computes, and it does not wait for the server between bunches. Only the sending of its
    update, its end of one of the two messages (half of L), lies between two bunches. So a
    round takes ``T_c + L / 2`` while the server's ``P T_d + T_h`` fits in it, and
    ``P T_d + T_h`` once the server is the bottleneck: the MultiSpert rule with the
    board's wait for its own data (T_d) replaced by the sending end, and continuous where
    the regimes meet.
    """
    return max(phases.compute + phases.latency / 2, workers * phases.transfer + phases.host)


def serial_round_seconds(phases: Phases, workers: int) -> float:
    """A round with a barrier (snet's sync mode): ``T_c + L + P T_d + T_h``.

    A worker's compute and its own end of the round trip, then the server's P transfers
    and its step, one after the other: the BSP supersteps of ``bsp_server_batch_cost``,
    in seconds. A staggered form, each worker computing as soon as its own copy of the
    weights is in (``max(T_c + L + (P + 1) T_d / 2, P T_d) + T_h``, the MultiSpert rule
    with a barrier), was tried: over four runs it was up to 15 % optimistic at P = 8,
    this form within 6 % in the same runs (docs/performance-model.md). The server's
    copies do leave one after the other (its sockets take each 2 MB write whole), but
    in that benchmark the workers' own ends of the transfers share the server's two
    cores, so they queue as well; for workers on machines of their own the staggered
    form may fit better.
    """
    return phases.compute + phases.latency + workers * phases.transfer + phases.host


def predict(
    network: NetworkSpec,
    bunch: int,
    workers: int,
    constants: Constants,
    strategy: str = "pattern",
    mode: str = "async",
    time_scale: float = 1.0,
) -> Prediction:
    """Predicted MCUPS and speed-up of ``workers`` workers for one strategy and mode."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    if bunch < 1 or workers < 1:
        raise ConfigError("bunch and workers must be >= 1")
    phases_of = pattern_parallel_phases if strategy == "pattern" else network_parallel_phases
    phases = phases_of(network, bunch, workers, constants, time_scale)
    if mode == "async":
        seconds = overlapped_round_seconds(phases, workers)
        compute_bound = (
            phases.compute + phases.latency / 2 >= workers * phases.transfer + phases.host
        )
    else:
        seconds = serial_round_seconds(phases, workers)
        # Every part of a sync round but T_c is communication or the step, none of it
        # overlapped: the round is compute-bound while T_c is at least half of it.
        compute_bound = phases.compute >= seconds - phases.compute
    mcups = network.connections * phases.patterns / seconds / 1e6
    alone = alone_mcups(network, constants, time_scale)
    return Prediction(
        strategy,
        mode,
        workers,
        seconds,
        mcups,
        mcups / alone,
        "compute" if compute_bound else "link",
        phases,
    )


# ---------------------------------------------------------------- BSP (Rogers & Skillicorn)


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
