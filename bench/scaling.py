"""The scaling benchmark: emulated workers, P = 1, 2, 4, 8, measured against the model.

A real server and P real worker processes train over 127.0.0.1; the workers use the
compute-free ``modelled`` backend (client/modelled_backend.py), which sleeps the time
Quicknet's model gives a bunch, ``bunch * (c1 * N_h + c2)``, and sends a tiny constant gradient. So
the networking, the server's steps and the flow control are real, the compute is not, and
eight workers fit on a two-core machine. The measured MCUPS (connections x patterns the
server applied / wall seconds, from two /status readings) is set beside the prediction of
``snet.perf.model`` calibrated with constants measured in the same run.

Standalone: ``python -m bench.scaling --seconds 6 --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from snet.perf.model import Constants, predict
from snet.protocol.network import NetworkSpec

from .arguments import emit, output_path
from .calibrate import calibrate, measure_loopback
from .processes import job_flags, modelled_env, synthetic_corpus, train_modelled

DEFAULT_NETWORK = "351:1262:45"


def measure(
    workers: int,
    mode: str,
    network: NetworkSpec,
    bunch: int,
    seconds: float,
    corpus: tuple[Path, int],
    env: dict[str, str],
    workdir: Path,
) -> dict[str, Any]:
    """One server and ``workers`` modelled workers: MCUPS over ``seconds`` of training."""
    flags = job_flags(mode, network, bunch, *corpus)
    run = train_modelled(workdir / f"{mode}-{workers}", env, flags, workers, seconds)
    reports = [row.get("report") or {} for row in run["status"]["workers"]]
    modelled = sum(r.get("modelled_seconds", 0.0) for r in reports)
    real = sum(r.get("real_seconds", 0.0) for r in reports)
    return {
        "workers": workers,
        "mode": mode,
        "seconds": round(run["seconds"], 3),
        "patterns": run["patterns"],
        "measured_mcups": round(network.connections * run["best"] / 1e6, 1),
        "mean_mcups": round(network.connections * run["mean"] / 1e6, 1),
        "staleness_mean": run["status"]["staleness_mean"],
        # how faithfully the workers slept the modelled time (1.0 = exactly)
        "compute_real_over_modelled": round(real / modelled, 4) if modelled else 1.0,
    }


def predicted(
    row: dict[str, Any], network: NetworkSpec, bunch: int, constants: Constants, scale: float
) -> dict[str, Any]:
    """``row`` with the model's prediction beside the measurement.

    The model gets the compute time the workers really spent: a sleep overruns a little on
    a busy machine, and that is the emulator's error, not the model's. The prediction for
    the intended compute time is kept beside it.
    """
    mode, count = row["mode"], row["workers"]
    intended = predict(network, bunch, count, constants, "pattern", mode, scale)
    spent = scale * row["compute_real_over_modelled"]
    model = predict(network, bunch, count, constants, "pattern", mode, spent)
    row = dict(row)
    row["predicted_mcups"] = round(model.mcups, 1)
    row["predicted_mcups_intended_compute"] = round(intended.mcups, 1)
    row["measured_over_predicted"] = round(row["measured_mcups"] / model.mcups, 3)
    row["bound"] = model.bound
    print(
        f"scaling: {mode:5} P={count}: best {row['measured_mcups']:9.1f} MCUPS, "
        f"model {row['predicted_mcups']:9.1f} ({row['measured_over_predicted']:.3f})",
        file=sys.stderr,
        flush=True,
    )
    return row


def run_scaling(
    workers: Sequence[int] = (1, 2, 4, 8),
    seconds: float = 5.0,
    network: str = DEFAULT_NETWORK,
    bunch: int = 1000,
    modes: Sequence[str] = ("async", "sync"),
    time_scale: float = 1.0,
    constants: Constants | None = None,
    workdir: str | None = None,
    compute_mcups: float | None = None,
    repeats: int = 2,
    frames: int = 500_000,
) -> dict[str, Any]:
    """Measure MCUPS of 1..8 emulated workers per mode beside the model's prediction.

    ``constants`` default to ``calibrate()`` in this run, so that model and measurement
    share the machine's state. The emulated workers compute at the constants' rate
    (``cu_seconds``: the numpy step measured now) times ``time_scale``, or at
    ``compute_mcups`` when given (e.g. the worker benchmark's figure from the same run).
    Returns a JSON-able dict: the constants, the scenario, and a row per (mode, workers)
    with measured and predicted MCUPS and their ratio. ``frames``: the synthetic corpus's
    size (every process loads and normalises it: a test's smaller one starts faster).
    """
    spec = NetworkSpec.parse(network)
    constants = constants or calibrate(spec, bunch)
    if compute_mcups is not None:
        if not compute_mcups > 0:
            raise ValueError(f"compute_mcups must be > 0, got {compute_mcups}")
        constants = replace(constants, cu_seconds=1e-6 / compute_mcups)
    best: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="snet-scaling-", dir=workdir) as tmp:
        root = Path(tmp)
        corpus = synthetic_corpus(root / "corpus.npz", spec, frames)
        env = modelled_env(constants.cu_seconds, time_scale)
        # Every point is measured ``repeats`` times, the repeats apart in time, and the best
        # run kept: a busy spell of other processes then rarely spoils a point twice.
        for attempt in range(repeats):
            for mode in modes:
                for count in workers:
                    where = root / f"{attempt}"
                    row = measure(count, mode, spec, bunch, seconds, corpus, env, where)
                    print(
                        f"scaling: run {attempt + 1}/{repeats}, {mode} P={count}: "
                        f"{row['measured_mcups']:.1f} MCUPS",
                        file=sys.stderr,
                        flush=True,
                    )
                    kept = best.get((mode, count))
                    if kept is None or row["measured_mcups"] > kept["measured_mcups"]:
                        best[(mode, count)] = row
    rows = [
        predicted(best[(m, p)], spec, bunch, constants, time_scale) for m in modes for p in workers
    ]
    per_byte, message = measure_loopback()
    worst = max(abs(row["measured_over_predicted"] - 1.0) for row in rows)
    return {
        "benchmark": "scaling",
        "network": spec.describe(),
        "bunch": bunch,
        "time_scale": time_scale,
        "seconds_per_point": seconds,
        "repeats": repeats,
        "constants": constants.to_dict(),
        # the plain-socket limit of the same link, for comparison with snet's constants
        "loopback": {"link_seconds_per_byte": per_byte, "message_seconds": message},
        "rows": rows,
        "worst_model_error": round(worst, 3),
        "within_15_percent": worst <= 0.15,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point")
    parser.add_argument("--repeats", type=int, default=2, help="runs per point; the best kept")
    parser.add_argument("--network", default=DEFAULT_NETWORK)
    parser.add_argument("--bunch", type=int, default=1000, help="patterns per worker update")
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--time-scale", dest="time_scale", type=float, default=1.0)
    parser.add_argument(
        "--compute-mcups",
        dest="compute_mcups",
        type=float,
        help="emulated workers' compute rate (default: the numpy step measured now)",
    )
    parser.add_argument("--json", type=output_path, help="also write the result to this file")
    args = parser.parse_args(argv)
    result = run_scaling(
        workers=[int(p) for p in args.workers.split(",")],
        seconds=args.seconds,
        network=args.network,
        bunch=args.bunch,
        modes=args.modes.split(","),
        time_scale=args.time_scale,
        compute_mcups=args.compute_mcups,
        repeats=args.repeats,
    )
    emit(json.dumps(result, indent=2), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
