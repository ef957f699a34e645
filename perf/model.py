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

bmuf (docs/bmuf.md) is the pattern-parallel round with τ bunches of compute per exchange
(``τ T_c + L + P T_d + T_h`` sync, ``max(τ T_c + L / 2, P T_d + T_h)`` async blocks, and
``max(τ T_c + L / 2, L + P T_d + T_h)`` sync blocks whose workers train the next block
during the exchange, overlap); a
compressed update shrinks the way to the server only (``update_bytes``).

Every time is in seconds unless a name says otherwise; MCUPS counts connection updates
(weights and biases times patterns) per second, in millions, as snet's /status does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from snet.protocol.codecs import parse_codec
from snet.protocol.errors import ConfigError
from snet.protocol.network import ELEMENT_DTYPE, ElementLayout, NetworkSpec

STRATEGIES = ("pattern", "network")
MODES = ("sync", "async", "bmuf", "bmuf-overlap", "bmuf-async")
# bmuf: a worker trains a block of ``block_bunches`` bunches on its own copy, then sends
# its model delta once (server/block_filter.py); "bmuf" waits for every worker's block,
# "bmuf-overlap" too, but its workers train the next block meanwhile (block_overlap),
# "bmuf-async" filters each block as it arrives. Pattern-parallel only.
BLOCK_MODES = ("bmuf", "bmuf-overlap", "bmuf-async")
# the asynchronous modes, whose workers never wait for the server between updates
# (``overlapped_round_seconds``; bmuf-overlap's wait when the exchange outlasts a block:
# ``overlapped_blocks_round_seconds``)
ASYNC_MODES = ("async", "bmuf-async")
WORD_BYTES = ELEMENT_DTYPE.itemsize  # float32 on the wire
INDEX_BYTES = 8  # np mode: a pattern's frame index (int64) on the wire
FIXED_SIZE_CODECS = ("none", "fp16", "int8", "sign")


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
    # np mode's own path (bench/np_calibrate.py; 0: not measured, the pattern-parallel
    # message costs stand in): the server's cost per worker per bunch (both messages,
    # beyond their bytes); its own work per bunch (sum, softmax, bookkeeping) and per
    # byte of the element (the periodic slice reports and their assembly, the CV it
    # scores); the rest of a one-worker round (its messages' other ends, wake-ups) and
    # per element byte; a worker's compute per pattern beyond its units' connection
    # updates (its window, the calls' fixed costs), paid by every worker for every pattern.
    np_worker_seconds: float = 0.0
    np_bunch_seconds: float = 0.0
    np_bunch_seconds_per_byte: float = 0.0
    np_latency_seconds: float = 0.0
    np_latency_seconds_per_byte: float = 0.0
    np_pattern_seconds: float = 0.0
    source: str = "defaults"

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if item.name != "source" and not (number and 0.0 <= value < math.inf):  # no inf
                raise ConfigError(f"constant {item.name} must be a number >= 0, got {value!r}")
        if self.cu_seconds < 1e-15:  # a petaflop core: 1e-320 gave MCUPS Infinity, JSON NaN
            raise ConfigError("constant cu_seconds must be at least 1e-15")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> Constants:
        """Constants from a JSON object; every field is required but ``source`` and those
        with defaults (0 when absent: files written before they existed)."""
        data = {f.name: f.default for f in fields(cls) if isinstance(f.default, float)} | data
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
    np_worker_seconds=8.0e-5,  # np, measured 2026-11-23 on 351:4|2048:45, bunch 128
    np_bunch_seconds=1.3e-4,
    np_bunch_seconds_per_byte=1.5e-10,
    np_latency_seconds=1.0e-4,
    np_latency_seconds_per_byte=3.0e-10,
    np_pattern_seconds=9.0e-7,
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


def update_bytes(network: NetworkSpec, codec: str = "none") -> int:
    """Bytes of one update (or bmuf delta) element sent in ``codec``: the sum of the
    codec's parts over the element's segments (protocol/codecs). Only codecs whose size
    does not depend on the values (none, fp16, int8, sign) can be planned."""
    parsed = parse_codec(codec)
    if parsed.family not in FIXED_SIZE_CODECS:
        raise ConfigError(
            f"the plan models codecs of a fixed size ({', '.join(FIXED_SIZE_CODECS)}), "
            f"not {codec!r}: its size depends on the values"
        )
    layout = ElementLayout.for_network(network)
    return sum(
        int(np.dtype(part.dtype).itemsize) * math.prod(part.shape)
        for shape in layout.shapes
        for part in parsed.part_specs(shape)
    )


def _transfers(up: int, down: int, constants: Constants) -> tuple[float, float]:
    """(T_d, L) of a round trip of ``up`` bytes to the server and ``down`` back: the
    server's end of both messages, and the worker's end with the latencies."""
    size = up + down
    return (
        size * constants.link_seconds_per_byte + 2 * constants.message_seconds,
        size * constants.worker_seconds_per_byte + 2 * constants.latency_seconds,
    )


def pattern_parallel_phases(
    network: NetworkSpec,
    bunch: int,
    workers: int,
    constants: Constants,
    time_scale: float = 1.0,
    block_bunches: int = 1,
    up_bytes: int | None = None,
) -> Phases:
    """Data division: each worker trains ``bunch`` patterns of its own per round, sends its
    update element and gets the new weights back; the server adds P updates and steps.

    In bmuf a round is a block: ``block_bunches`` bunches computed locally, then one
    exchange, so the compute grows τ-fold and the transfers and the step do not.
    ``up_bytes``: the update's size on the wire (a compressed codec; default float32).
    """
    element = network.connections * WORD_BYTES
    compute = time_scale * block_bunches * bunch * pattern_seconds(network, constants)
    transfer, latency = _transfers(element if up_bytes is None else up_bytes, element, constants)
    host = element * (workers * constants.apply_seconds_per_byte + constants.step_seconds_per_byte)
    patterns = workers * block_bunches * bunch
    return Phases(compute, transfer, host + constants.step_fixed_seconds, latency, patterns)


def network_parallel_phases(
    network: NetworkSpec, bunch: int, workers: int, constants: Constants, time_scale: float = 1.0
) -> Phases:
    """Hidden units split across workers; a round is one bunch, through every worker.

    As snet's np mode runs it (docs/network-parallel.md): the server sends every worker
    the bunch's frame indices (8 bytes a pattern) with the previous bunch's output
    errors (patterns x outputs); each computes its N_h / P hidden units for all the
    patterns, updates its slice, and answers the output layer's partial sums (patterns x
    outputs); the server adds the P of them and applies the softmax. No weights cross
    the link, but every bunch is an exchange with every worker. np's own constants
    (``np_*``, measured on its path) give T_d, T_h and L, and every worker pays
    ``np_pattern_seconds`` a pattern; without them pattern-parallel's stand in.
    """
    hidden = sum(network.sizes[1:-1])
    c1, c2 = per_pattern_coefficients(network, constants.cu_seconds)
    per_pattern = c1 * hidden / workers + c2 + constants.pattern_seconds
    compute = time_scale * bunch * (per_pattern + constants.np_pattern_seconds)
    activations = bunch * network.output_size * WORD_BYTES
    if constants.np_worker_seconds > 0.0:
        size, element = 2 * activations + bunch * INDEX_BYTES, network.connections * WORD_BYTES
        transfer = constants.np_worker_seconds + size * constants.link_seconds_per_byte
        latency = (constants.np_latency_seconds + size * constants.worker_seconds_per_byte
                   + element * constants.np_latency_seconds_per_byte)  # fmt: skip
        host = constants.np_bunch_seconds + element * constants.np_bunch_seconds_per_byte
        return Phases(compute, transfer, host, latency, bunch)
    transfer, latency = _transfers(activations, activations + bunch * INDEX_BYTES, constants)
    host = activations * (workers * constants.apply_seconds_per_byte)
    return Phases(compute, transfer, host + constants.step_fixed_seconds, latency, bunch)


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


def overlapped_blocks_round_seconds(phases: Phases, workers: int) -> float:
    """Sync blocks whose workers train the next block during the exchange (bmuf with
    ``block_overlap``): ``max(T_c + L / 2, L + P T_d + T_h)``.

    As in async mode only a worker's own end of its message lies between two blocks; but
    each block's delta is sent once the weights holding the last one are in, so the whole
    exchange of a round (every worker's delta in, the step, the weights out, both ends'
    latency) must fit in one block, or the worker waits for it.
    """
    return max(
        phases.compute + phases.latency / 2,
        phases.latency + workers * phases.transfer + phases.host,
    )


def serial_round_seconds(phases: Phases, workers: int) -> float:
    """A round with a barrier (snet's sync mode): ``T_c + L + P T_d + T_h``.

    A worker's compute and its own end of the round trip, then the server's P transfers
    and its step, one after the other: the BSP supersteps of ``bsp_server_batch_cost``,
    in seconds. A staggered form (``max(T_c + L + (P + 1) T_d / 2, P T_d) + T_h``, each
    worker computing once its own copy is in) was up to 15 % optimistic at P = 8 where
    this one was within 6 % (docs/performance-model.md): there the workers' ends of the
    transfers share the server's two cores and queue too.
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
    block_bunches: int = 16,
    codec: str = "none",
) -> Prediction:
    """Predicted MCUPS and speed-up of ``workers`` workers for one strategy and mode.

    ``block_bunches`` (τ) matters in the bmuf modes only; ``codec`` is the update codec
    of the pattern-parallel modes (``update_bytes``). Throughput only: how many epochs a
    mode needs to reach an accuracy is the convergence benchmark's question.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    if bunch < 1 or workers < 1 or block_bunches < 1:
        raise ConfigError("bunch, workers and block bunches must be >= 1")
    if mode in BLOCK_MODES and strategy != "pattern":
        raise ConfigError(f"mode {mode} is pattern-parallel only (workers train whole copies)")
    if strategy == "pattern":
        up = None if codec == "none" else update_bytes(network, codec)
        tau = block_bunches if mode in BLOCK_MODES else 1
        phases = pattern_parallel_phases(network, bunch, workers, constants, time_scale, tau, up)
    else:
        phases = network_parallel_phases(network, bunch, workers, constants, time_scale)
    if mode in (*ASYNC_MODES, "bmuf-overlap"):
        if mode in ASYNC_MODES:
            seconds = overlapped_round_seconds(phases, workers)
        else:
            seconds = overlapped_blocks_round_seconds(phases, workers)
        # a round of the worker's own term (T_c + L / 2), not the exchange's
        compute_bound = phases.compute + phases.latency / 2 >= seconds
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
