"""``snet plan``: predicted MCUPS and speed-up per strategy and mode, before running anything.

Given a network, a bunch size, a link speed and worker counts, it evaluates the models of
``snet.perf`` (Quicknet on MultiSpert; the BSP cost of exemplar parallelism) with
constants measured on this machine, prints a table, and can draw the model against a
scaling measurement as a PNG. Where the constants come from, first found wins:
``--constants FILE``, ``--calibrate`` (measure now with a source checkout's
bench/calibrate.py), docs/benchmarks.json in the current directory (written by
``snet bench``), the defaults in ``snet.perf.model.DEFAULT_CONSTANTS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from snet.perf.model import (
    BLOCK_MODES,
    DEFAULT_CONSTANTS,
    MODES,
    STRATEGIES,
    Constants,
    predict,
    update_bytes,
)
from snet.perf.plan import (
    describe_constants,
    find_constants,
    find_scaling,
    plan_document,
    render,
    render_blocks,
    render_bsp,
    render_winners,
)
from snet.protocol.codecs import canonical
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.modes import MODE_SETTINGS, NAMES, describe
from snet.protocol.network import NetworkSpec
from snet.protocol.numbering import plain_int
from snet.protocol.slices import np_problem
from snet.transport.files import read_at_most

from .checkout import bench_process
from .settings import output_file

BENCHMARKS_FILE = Path("docs/benchmarks.json")
# What a plan can size: a link of 1 kbit/s to 1 Pbit/s, a bunch of at most a billion
# patterns (1e-300 Mbit/s printed round times hundreds of digits long; 1e20 patterns, 0 MCUPS)
MIN_LINK_MBPS, MAX_LINK_MBPS = 1e-3, 1e9
MAX_BUNCH = 10**9
TRAINED_TODAY = "pattern"  # the strategy snet trains (in sync and async mode); the rest is model
TRAINS_NOTE = (
    "snet trains pattern-parallel (data-parallel: every worker holds the whole network), "
    "in sync, async and bmuf mode"
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
        "model --mode np: sync without, async with --np-pipeline (docs/network-parallel.md)"
    )


JSON_BYTES = 16 * 1024 * 1024  # a calibration or benchmark file; /dev/zero is not one


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(read_at_most(path, JSON_BYTES, str(path), "a JSON file"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return document


def load_constants(args: argparse.Namespace, network: NetworkSpec) -> Constants:
    if args.constants:
        constants = find_constants(_read_json(Path(args.constants)), args.constants)
    elif args.calibrate:
        constants = _calibrate(network, args.bunch)
    elif BENCHMARKS_FILE.is_file():
        constants = find_constants(_read_json(BENCHMARKS_FILE), str(BENCHMARKS_FILE))
    else:
        constants = DEFAULT_CONSTANTS
    return constants.with_link_mbps(args.link_mbps) if args.link_mbps else constants


def _calibrate(network: NetworkSpec, bunch: int) -> Constants:
    """Measure the constants now, with the checkout's bench/calibrate.py in a child."""
    done = bench_process("bench.calibrate", ["--constants", network.describe(), str(bunch)], True)
    if done.returncode != 0:
        raise ConfigError(f"calibrating failed: {done.stderr.strip()[-500:]}")
    return find_constants(json.loads(done.stdout.strip().splitlines()[-1]), "calibration")


def _counts(text: str, what: str) -> list[int]:
    try:  # every part a number: "1,,2" was taken as 1,2, a typo passed over
        values = [plain_int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what} must be whole numbers >= 1, got {text!r}")
    return list(dict.fromkeys(values))  # a count given twice is one row (it printed two)


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",")]
    unknown = [c for c in chosen if c not in allowed]
    if unknown or not chosen:
        raise ConfigError(f"{what} must be some of {', '.join(allowed)}, got {text!r}")
    return chosen


def _check_strategies(network: NetworkSpec, strategies: list[str], modes: list[str]) -> None:
    """Refuse what the trainer refuses, and a choice with no row at all: the network
    strategy is np mode (one hidden layer; sync and async rows), and bmuf trains whole
    copies (pattern rows only). Both printed an empty or untrainable table."""
    if "network" not in strategies:
        return
    problem = np_problem(network)
    if problem:
        raise ConfigError(f"--strategies network: {problem}")
    if strategies == ["network"] and all(mode in BLOCK_MODES for mode in modes):
        raise ConfigError(
            f"--strategies network has no {', '.join(modes)} rows (bmuf trains whole copies "
            "of the network, pattern-parallel): add --modes sync or async, or --strategies "
            "pattern,network"
        )


def _check_read(args: argparse.Namespace, strategies: list[str], modes: list[str]) -> None:
    """Refuse a setting no row of the plan reads, as a job refuses one its mode would
    ignore (protocol/modes.py): ``--block-bunches`` without a bmuf row, ``--compress``
    with the network strategy's rows alone (np mode sends no updates). Both had printed
    a table they changed nothing in."""
    # the plan's bmuf-overlap rows are a job of bmuf mode with sync blocks (block_overlap)
    kinds = {"bmuf" if mode == "bmuf-overlap" else mode for mode in modes}
    rows = kinds if "pattern" in strategies else set()
    rows |= {"np"} if "network" in strategies else set()  # np mode's sync and async rows
    shown = tuple(kind for kind in NAMES if kind in rows)
    default = JobSpec()
    given = (
        ("--block-bunches", "block_bunches", args.block_bunches, default.block_bunches),
        ("--compress", "compress", canonical(args.compress), default.compress),
    )
    for flag, name, value, unused in given:
        if value != unused and not rows & set(MODE_SETTINGS[name]):
            raise ConfigError(
                f"{flag} {value} applies to {describe(MODE_SETTINGS[name])} only, and this "
                f"plan's rows are of {describe(shown)} (--strategies {args.strategies}, "
                f"--modes {args.modes}): it would change none of them"
            )


def run_plan(args: argparse.Namespace) -> int:
    """The ``snet plan`` command; returns the exit code."""
    if args.png:
        from snet.perf.figure import require_matplotlib

        require_matplotlib()  # before any work, so that nothing is printed in vain
        output_file(args.png, (".png",), "--png")  # matplotlib draws the format it names
    network = NetworkSpec.parse(args.network)
    args.compress = canonical(args.compress)  # in any case, as a job's (--compress FP16)
    if not 1 <= args.bunch <= MAX_BUNCH:
        raise ConfigError(f"--bunch must be 1 to {MAX_BUNCH:,}, got {args.bunch}")
    workers = _counts(args.workers, "--workers")
    strategies = _choices(args.strategies, STRATEGIES, "--strategies")
    modes = _choices(args.modes, MODES, "--modes")
    _check_strategies(network, strategies, modes)
    if args.exemplars < 1:
        raise ConfigError(f"--exemplars must be >= 1, got {args.exemplars}")
    if args.block_bunches < 1:
        raise ConfigError(f"--block-bunches must be >= 1, got {args.block_bunches}")
    _check_read(args, strategies, modes)
    if args.link_mbps is not None and not MIN_LINK_MBPS <= args.link_mbps <= MAX_LINK_MBPS:
        raise ConfigError(f"--link-mbps must be a speed of {MIN_LINK_MBPS:g} to "
                          f"{MAX_LINK_MBPS:g} Mbit/s, got {args.link_mbps:g}")  # fmt: skip
    update_bytes(network, args.compress)  # a clear error for a codec the plan cannot size
    measured = None
    if args.measured:
        measured = find_scaling(_read_json(Path(args.measured)), args.measured)
    constants = load_constants(args, network)
    predictions = [
        predict(network, args.bunch, count, constants, strategy, mode, 1.0,
                args.block_bunches, args.compress if strategy == "pattern" else "none")
        for strategy in strategies
        for mode in modes
        for count in workers
        if strategy == "pattern" or mode not in BLOCK_MODES  # bmuf trains whole copies
    ]  # fmt: skip
    if args.json:
        document = plan_document(
            network, args.bunch, constants, predictions, args.block_bunches, args.compress
        )
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
        blocks = render_blocks(
            network, args.bunch, constants, predictions, args.block_bunches, args.compress
        )
        if blocks:
            print("\n".join([*blocks, ""]))
        winners = render_winners(predictions)
        if winners:
            print("\n".join([*winners, ""]))
        print("\n".join(render_bsp(network, constants, args.bunch, workers, args.exemplars)))
    if args.png:
        from snet.perf.figure import draw

        draw(
            Path(args.png),
            network,
            args.bunch,
            constants,
            workers,
            strategies,
            modes,
            measured,
            args.block_bunches,
        )
        print(f"wrote {args.png}")
    return 0
