"""The plan: the performance model's predictions as tables and as a JSON document.

``snet plan`` prints these; the scaling benchmark (bench/scaling.py) and the constants
files that ``snet bench`` writes are read with ``find_constants``/``find_scaling``. Pure:
documents in, lines and documents out; reading files is the caller's.
"""

from __future__ import annotations

from typing import Any

from snet.protocol.errors import ConfigError
from snet.protocol.network import NetworkSpec

from .bsp import bsp_epoch_seconds, bsp_machine_from_constants
from .model import BLOCK_MODES, Constants, Prediction, pattern_seconds, predict


def find_constants(document: dict[str, Any], source: str) -> Constants:
    """Constants from a JSON document: the object itself, its "constants", or the
    "constants" of its "scaling" benchmark (as ``snet bench`` writes them)."""
    for candidate in (document, document.get("constants"), document.get("scaling")):
        if isinstance(candidate, dict) and "cu_seconds" in candidate:
            return Constants.from_dict(candidate, source)
        if isinstance(candidate, dict) and isinstance(candidate.get("constants"), dict):
            return Constants.from_dict(candidate["constants"], source)
    raise ConfigError(f"{source}: no performance-model constants in it (see snet plan --help)")


def find_scaling(document: dict[str, Any], source: str) -> dict[str, Any]:
    """The scaling benchmark's result: the document itself or its "scaling" entry."""
    for candidate in (document, document.get("scaling")):
        if isinstance(candidate, dict) and isinstance(candidate.get("rows"), list):
            return candidate
    raise ConfigError(f"{source}: no scaling benchmark rows in it")


def describe_constants(constants: Constants, network: NetworkSpec) -> str:
    per_pattern = pattern_seconds(network, constants)
    return (
        f"constants ({constants.source}): compute {constants.mcups:,.0f} MCUPS per worker "
        f"({per_pattern * 1e6:.1f} us a pattern), link "
        f"{1e-6 / max(constants.link_seconds_per_byte, 1e-30):,.0f} MB/s at the server, "
        f"{1e-6 / max(constants.worker_seconds_per_byte, 1e-30):,.0f} MB/s at a worker, "
        f"message {constants.message_seconds * 1e6:.0f} us at the server + "
        f"{constants.latency_seconds * 1e6:.0f} us elsewhere, server "
        f"{constants.apply_seconds_per_byte * 1e9:.2f} ns/B per update + "
        f"{constants.step_seconds_per_byte * 1e9:.2f} ns/B + "
        f"{constants.step_fixed_seconds * 1e6:.0f} us per step"
    )


def render(predictions: list[Prediction]) -> list[str]:
    lines = [
        f"{'P':>3} {'strategy':8} {'mode':12} {'round ms':>9} {'T_c ms':>8} {'T_d ms':>8} "
        f"{'T_h ms':>8} {'L ms':>7} {'MCUPS':>9} {'speed-up':>8}  bound"
    ]
    for p in predictions:
        lines.append(
            f"{p.workers:>3} {p.strategy:8} {p.mode:12} {p.round_seconds * 1e3:9.2f} "
            f"{p.phases.compute * 1e3:8.2f} {p.phases.transfer * 1e3:8.3f} "
            f"{p.phases.host * 1e3:8.3f} {p.phases.latency * 1e3:7.3f} {p.mcups:9,.0f} "
            f"{p.speedup:8.2f}  {p.bound}"
        )
    return lines


def render_blocks(
    network: NetworkSpec,
    bunch: int,
    constants: Constants,
    predictions: list[Prediction],
    block_bunches: int,
    codec: str,
) -> list[str]:
    """Where bmuf beats per-bunch exchange: per worker count, each bmuf mode's speed-up
    over the better per-bunch mode's, and the fewest bunches per block that reach 90 %
    of linear speed-up (the exchange paid once per block)."""
    pattern = [p for p in predictions if p.strategy == "pattern"]
    blocks = [p for p in pattern if p.mode in BLOCK_MODES]
    if not blocks:
        return []
    lines = [
        f"bmuf, blocks of {block_bunches} bunches, deltas in {codec}: against the better of "
        "per-bunch sync and async",
        f"{'P':>3} {'mode':12} {'speed-up':>8} {'per-bunch':>9} {'gain':>6} {'tau for 90%':>11}",
    ]
    for block in blocks:
        per_bunch = [
            p.speedup for p in pattern if p.workers == block.workers and p.mode not in BLOCK_MODES
        ]
        best = max(per_bunch) if per_bunch else None
        tau = smallest_block(network, bunch, block.workers, constants, block.mode, 0.9, codec)
        lines.append(
            f"{block.workers:>3} {block.mode:12} {block.speedup:8.2f} "
            + (f"{best:9.2f} {block.speedup / best:5.2f}x" if best else f"{'-':>9} {'-':>6}")
            + f" {tau if tau is not None else '> 4096':>11}"
        )
    return lines


def render_winners(predictions: list[Prediction]) -> list[str]:
    """Where each strategy wins: per worker count, the fastest pattern-parallel row
    against the fastest network-parallel one (np mode), when both were asked for."""
    counts = sorted({p.workers for p in predictions})
    lines = []
    for workers in counts:
        best = {
            strategy: max(
                (p for p in predictions if p.workers == workers and p.strategy == strategy),
                key=lambda p: p.mcups,
                default=None,
            )
            for strategy in ("pattern", "network")
        }
        pattern, network = best["pattern"], best["network"]
        if pattern is None or network is None:
            return []
        winner, loser = (network, pattern) if network.mcups > pattern.mcups else (pattern, network)
        lines.append(
            f"{workers:>3} worker(s): {winner.strategy} ({winner.mode}) wins, "
            f"{winner.mcups:,.0f} MCUPS against {loser.mcups:,.0f} ({loser.strategy}, {loser.mode})"
        )
    return ["where each strategy wins (network = --mode np):", *lines] if lines else []


def render_bsp(
    network: NetworkSpec, constants: Constants, bunch: int, workers: list[int], exemplars: int
) -> list[str]:
    machine = bsp_machine_from_constants(constants)
    lines = [
        f"BSP exemplar parallelism, batch learning, {exemplars:,} exemplars per epoch "
        f"(s = {machine.s / 1e9:.1f} Gflop/s, g = {machine.g:.1f} flops/word, "
        f"l = {machine.l:,.0f} flops):",
        f"{'P':>3} {'total exchange s':>17} {'MCUPS':>9} {'via server s':>13} {'MCUPS':>9}",
    ]
    updates = network.connections * exemplars / 1e6
    for count in workers:
        total = bsp_epoch_seconds(network.connections, exemplars, bunch, count, machine, "total")
        server = bsp_epoch_seconds(network.connections, exemplars, bunch, count, machine, "server")
        lines.append(
            f"{count:>3} {total:17.2f} {updates / total:9,.0f} "
            f"{server:13.2f} {updates / server:9,.0f}"
        )
    return lines


def plan_document(
    network: NetworkSpec,
    bunch: int,
    constants: Constants,
    predictions: list[Prediction],
    block_bunches: int = 16,
    codec: str = "none",
) -> dict[str, Any]:
    return {
        "network": network.describe(),
        "bunch": bunch,
        "block_bunches": block_bunches,
        "codec": codec,
        "constants": constants.to_dict(),
        "predictions": [
            {
                "workers": p.workers,
                "strategy": p.strategy,
                "mode": p.mode,
                "round_seconds": p.round_seconds,
                "mcups": p.mcups,
                "speedup": p.speedup,
                "bound": p.bound,
                "compute_seconds": p.phases.compute,
                "transfer_seconds": p.phases.transfer,
                "host_seconds": p.phases.host,
                "latency_seconds": p.phases.latency,
            }
            for p in predictions
        ],
    }


def smallest_block(
    network: NetworkSpec,
    bunch: int,
    workers: int,
    constants: Constants,
    mode: str = "bmuf",
    efficiency: float = 0.9,
    codec: str = "none",
    limit: int = 4096,
) -> int | None:
    """The fewest bunches per block (τ) at which ``mode`` reaches ``efficiency`` x P of
    one worker's rate, or None if even ``limit`` does not. The speed-up grows with τ
    (the exchange is paid once per block), so the first τ that reaches it is the answer."""
    if mode not in BLOCK_MODES:
        raise ConfigError(f"smallest_block is for the block modes {BLOCK_MODES}, not {mode!r}")
    if not 0.0 < efficiency < 1.0:
        raise ConfigError(f"efficiency must be between 0 and 1, got {efficiency}")
    low, high = 1, limit
    if predict(network, bunch, workers, constants, "pattern", mode, 1.0, high, codec).speedup < (
        efficiency * workers
    ):
        return None
    while low < high:  # bisection on the monotone speed-up
        middle = (low + high) // 2
        reached = predict(network, bunch, workers, constants, "pattern", mode, 1.0, middle, codec)
        if reached.speedup >= efficiency * workers:
            high = middle
        else:
            low = middle + 1
    return low
