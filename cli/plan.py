"""``snet plan``: predicted MCUPS and speed-up per strategy and mode, before running anything.

Given a network, a bunch size, a link speed and worker counts, it evaluates the models of
``perfmodel`` (Quicknet on MultiSpert; the BSP cost of exemplar parallelism) with
constants measured on this machine, prints a table, and can draw the model against a
scaling measurement as a PNG. Where the constants come from, first found wins:
``--constants FILE``, ``--calibrate`` (measure now), docs/benchmarks.json in the current
directory (written by ``snet bench``), the defaults in ``perfmodel.DEFAULT_CONSTANTS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from snet.protocol.errors import ConfigError
from snet.protocol.network import NetworkSpec

from .perfmodel import (
    DEFAULT_CONSTANTS,
    MODES,
    STRATEGIES,
    Constants,
    Prediction,
    bsp_epoch_seconds,
    bsp_machine_from_constants,
    pattern_seconds,
    predict,
)

BENCHMARKS_FILE = Path("docs/benchmarks.json")
TRAINED_TODAY = "pattern"  # the strategy snet trains (in sync and async mode); the rest is model
TRAINS_NOTE = (
    "snet trains pattern-parallel (data-parallel: every worker holds the whole network), "
    "in sync and async mode"
)


def link_note(args: argparse.Namespace, constants: Constants) -> str:
    """What the link in the table is: the speed given, or a warning that it is loopback."""
    if args.link_mbps:
        return f"link: {args.link_mbps:g} Mbit/s at the server and at every worker (--link-mbps)"
    speed = 1e-6 / max(constants.link_seconds_per_byte, 1e-30)
    return (
        f"note: no --link-mbps given, so the link is the one the constants were measured on "
        f"({speed:,.0f} MB/s: 127.0.0.1 loopback, {constants.source}), which no network "
        "between machines reaches; give your link's speed, e.g. --link-mbps 1000 for "
        "gigabit Ethernet"
    )


def strategy_note(strategies: list[str]) -> str:
    if strategies == [TRAINED_TODAY]:
        return TRAINS_NOTE
    return (
        f"{TRAINS_NOTE}; the network-parallel rows (each worker a slice of the hidden units) "
        "are the model only: snet cannot train that way yet"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return document


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


def load_constants(args: argparse.Namespace, network: NetworkSpec) -> Constants:
    if args.constants:
        constants = find_constants(_read_json(Path(args.constants)), args.constants)
    elif args.calibrate:
        from snet.bench.calibrate import calibrate

        constants = calibrate(network, args.bunch)
    elif BENCHMARKS_FILE.is_file():
        constants = find_constants(_read_json(BENCHMARKS_FILE), str(BENCHMARKS_FILE))
    else:
        constants = DEFAULT_CONSTANTS
    return constants.with_link_mbps(args.link_mbps) if args.link_mbps else constants


def _counts(text: str, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what} must be whole numbers >= 1, got {text!r}")
    return values


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [c for c in chosen if c not in allowed]
    if unknown or not chosen:
        raise ConfigError(f"{what} must be some of {', '.join(allowed)}, got {text!r}")
    return chosen


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
        f"{'P':>3} {'strategy':8} {'mode':5} {'round ms':>9} {'T_c ms':>8} {'T_d ms':>8} "
        f"{'T_h ms':>8} {'L ms':>7} {'MCUPS':>9} {'speed-up':>8}  bound"
    ]
    for p in predictions:
        lines.append(
            f"{p.workers:>3} {p.strategy:8} {p.mode:5} {p.round_seconds * 1e3:9.2f} "
            f"{p.phases.compute * 1e3:8.2f} {p.phases.transfer * 1e3:8.3f} "
            f"{p.phases.host * 1e3:8.3f} {p.phases.latency * 1e3:7.3f} {p.mcups:9,.0f} "
            f"{p.speedup:8.2f}  {p.bound}"
        )
    return lines


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


def run_plan(args: argparse.Namespace) -> int:
    """The ``snet plan`` command; returns the exit code."""
    if args.png:
        from .plan_figure import require_matplotlib

        require_matplotlib()  # before any work, so that nothing is printed in vain
    network = NetworkSpec.parse(args.network)
    if args.bunch < 1:
        raise ConfigError(f"--bunch must be >= 1, got {args.bunch}")
    workers = _counts(args.workers, "--workers")
    strategies = _choices(args.strategies, STRATEGIES, "--strategies")
    modes = _choices(args.modes, MODES, "--modes")
    if args.exemplars < 1:
        raise ConfigError(f"--exemplars must be >= 1, got {args.exemplars}")
    measured = None
    if args.measured:
        measured = find_scaling(_read_json(Path(args.measured)), args.measured)
    constants = load_constants(args, network)
    predictions = [
        predict(network, args.bunch, count, constants, strategy, mode)
        for strategy in strategies
        for mode in modes
        for count in workers
    ]
    if args.json:
        document = plan_document(network, args.bunch, constants, predictions)
        document["link_mbps"] = args.link_mbps  # null: the constants' (loopback) link
        document["trains"] = TRAINS_NOTE
        print(json.dumps(document, indent=2))
        if not args.link_mbps:
            print(f"snet plan: {link_note(args, constants)}", file=sys.stderr)
    else:
        element_mb = network.connections * 4 / 1e6
        print(
            f"snet plan: network {network.describe()} ({network.connections:,} connections, "
            f"{element_mb:.2f} MB element), bunch {args.bunch} per worker"
        )
        print(strategy_note(strategies))
        print(link_note(args, constants))
        print(describe_constants(constants, network))
        print("\n".join(render(predictions)))
        print()
        print("\n".join(render_bsp(network, constants, args.bunch, workers, args.exemplars)))
    if args.png:
        from .plan_figure import draw

        draw(Path(args.png), network, args.bunch, constants, workers, strategies, modes, measured)
        print(f"wrote {args.png}")
    return 0


def plan_document(
    network: NetworkSpec, bunch: int, constants: Constants, predictions: list[Prediction]
) -> dict[str, Any]:
    return {
        "network": network.describe(),
        "bunch": bunch,
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
