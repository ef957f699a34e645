"""Network-parallel (np) against pattern-parallel (pp) training, P = 1-4, against the model.

As the MultiSpert report's Fig. 3 set NP and PP measurements over its model: a real
server and P real ``snet worker`` processes (numpy backend) train over 127.0.0.1 in
``--mode np`` and in ``--mode sync`` (pattern-parallel with a barrier per round, as np
mode has one per bunch), and the MCUPS the server applies (from /status, over a window
after a warm-up) are set beside ``snet plan``'s model (snet.perf.model.predict, strategy
``network`` or ``pattern``, mode ``sync``) with constants calibrated in the same run
(bench/calibrate.py).

The compute. This machine has 2 cores, shared with other work, and P workers and the
server share them: a worker computes slower than alone once they are more than the cores
free. The model is given the compute time the workers really spent in the run (their
own timings, reported to /status: a pp worker's gradient, an np worker's forward pass,
scaled by the forward/backward split measured here alone; for np no less than all the
holders' compute over the machine's cores, since holders beyond the cores wait for one
before their clocks start: ``round_compute``), so that it tests the model of everything
else: messages, the server's work, the barrier. The prediction from the quiet
machine's compute (each worker a core of its own) is kept beside it, which is what the
model says for workers on machines of their own. Every point is measured ``repeats``
times, the repeats interleaved in time (a busy spell then spoils one run of each point,
not all), and the median kept.

The crossover: the model (calibrated constants, quiet compute, P = 4) over the hidden
layer's size at the bunch measured, the smallest size from which np is the faster, and
the same over bunch sizes; the measured sweep over hidden sizes at P = 2 checks it.

    .venv/bin/python -m bench.np_vs_pp        # writes docs/np-vs-pp.{json,md,png}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from snet.cli.runtime import blas_thread_env
from snet.perf.model import (
    Constants,
    Phases,
    network_parallel_phases,
    pattern_parallel_phases,
    predict,
)
from snet.protocol.network import NetworkSpec

from .calibrate import calibrate
from .np_calibrate import measure_np_rounds
from .processes import (
    LocalCluster,
    ServerHandle,
    best_rate,
    job_flags,
    sample_patterns,
    synthetic_corpus,
)

ROOT = Path(__file__).resolve().parent.parent
STRATEGY_MODE = {"network": "np", "pattern": "sync"}
WARMUP_PATTERNS = 20  # bunches trained before the window opens (np: after the first cut)


def hidden_layer(spec: NetworkSpec, units: int) -> NetworkSpec:
    """``spec`` with ``units`` hidden units."""
    return NetworkSpec((spec.sizes[0], units, spec.sizes[2]), spec.activations)


def np_job_flags(strategy: str, spec: NetworkSpec, bunch: int, data: Path, context: int,
                 workers: int) -> list[str]:  # fmt: skip
    """The benchmark's job: bench/processes.py's, in chunks of 16 bunches, every worker
    joined before the first lease."""
    flags = job_flags(STRATEGY_MODE[strategy], spec, bunch, data, context, chunk_bunches=16)
    return [*flags, "--learning-rates", "0.01", "--min-workers", str(workers)]


def _compute_seconds(rows: list[dict[str, Any]], connections: int) -> dict[str, tuple[int, float]]:
    """Per worker: (patterns, compute seconds) so far, from /status's rows."""
    out = {}
    for row in rows:
        if row["mcups"] > 0:
            out[row["name"]] = (row["patterns"], connections * row["patterns"] / row["mcups"] / 1e6)
    return out


def measure_window(
    strategy: str, workers: int, spec: NetworkSpec, bunch: int, seconds: float,
    corpus: tuple[Path, int], directory: Path,
    start: Callable[[LocalCluster, ServerHandle, int], object], warmup_timeout: float = 120,
) -> tuple[dict[str, Any], float, dict[str, Any]]:  # fmt: skip
    """One server and ``workers`` workers (``start`` starts the one of an index): /status
    when the window opens, after a warm-up, the mean patterns per second over ``seconds``
    of training, and /status when it closes."""
    with LocalCluster(directory, blas_thread_env(1)) as cluster:
        server = cluster.server(np_job_flags(strategy, spec, bunch, *corpus, workers))
        for index in range(workers):
            start(cluster, server, index)
        cluster.wait_for(
            lambda: server.status()["patterns_processed"] >= WARMUP_PATTERNS * bunch * workers,
            warmup_timeout, "the first bunches",
        )  # fmt: skip
        first = server.status()
        samples = sample_patterns(server, seconds)
        last = server.status()
    _, mean = best_rate(samples, seconds / 2)
    return first, mean, last


def measure(
    strategy: str, workers: int, spec: NetworkSpec, bunch: int, seconds: float,
    corpus: tuple[Path, int], directory: Path,
) -> dict[str, Any]:  # fmt: skip
    """One server and ``workers`` numpy workers: MCUPS over ``seconds`` of training, and the
    compute seconds per bunch the workers reported over the same window."""

    def numpy_worker(cluster: LocalCluster, server: ServerHandle, index: int) -> None:
        cluster.worker(server, f"w{index}", ["--backend", "numpy"])

    first, mean, last = measure_window(
        strategy, workers, spec, bunch, seconds, corpus, directory, numpy_worker
    )
    before = _compute_seconds(first["workers"], spec.connections)
    after = _compute_seconds(last["workers"], spec.connections)
    per_bunch = [
        (after[n][1] - before[n][1]) / (after[n][0] - before[n][0]) * bunch
        for n in after
        if n in before and after[n][0] > before[n][0]
    ]
    mean_compute = statistics.mean(per_bunch) if per_bunch else 0.0
    return {
        "mcups": spec.connections * mean / 1e6,
        "worker_seconds_per_bunch": _slowest(first, last) or mean_compute,
        "mean_worker_seconds_per_bunch": mean_compute,
        "load": os.getloadavg()[0],
    }


def _slowest(first: dict[str, Any], last: dict[str, Any]) -> float:
    """np: the compute a bunch waited for (its slowest holder's), per bunch over the
    window, from /status's ``rule``; 0 for the other modes (the server does not see it)."""
    rules = first.get("rule") or {}, last.get("rule") or {}
    if "slowest_compute_seconds" not in rules[0] or rules[1]["bunches"] <= rules[0]["bunches"]:
        return 0.0
    spent = rules[1]["slowest_compute_seconds"] - rules[0]["slowest_compute_seconds"]
    return float(spent / (rules[1]["bunches"] - rules[0]["bunches"]))


def strategy_phases(
    strategy: str, spec: NetworkSpec, bunch: int, workers: int, constants: Constants
) -> Phases:
    """The model's round for ``strategy`` ("network": np, "pattern": pp)."""
    phases = network_parallel_phases if strategy == "network" else pattern_parallel_phases
    return phases(spec, bunch, workers, constants)


def round_compute(
    strategy: str, workers: int, measured: dict[str, Any], cores: int | None
) -> float:
    """The compute a round waited for, per bunch. pp: the workers' mean, their own clocks'
    (a worker preempted while it computes counts the wait). np: its slowest holder's, but
    on ``cores`` cores no sooner than all holders' compute over the cores: the P holders
    get the bunch at once, and on fewer cores than holders some wait for one before they
    start, which their own clocks do not count (the makespan bound of P tasks on C cores)."""
    spent = float(measured["worker_seconds_per_bunch"])  # np: a bunch's update and forward
    if strategy == "network" and cores:
        spent = max(spent, float(measured["mean_worker_seconds_per_bunch"]) * workers / cores)
    return spent


def model_row(
    strategy: str, workers: int, spec: NetworkSpec, bunch: int, constants: Constants,
    measured: dict[str, Any], cores: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The model beside one measured point: with the compute the round waited for (the
    workers' own, on ``cores`` cores: ``round_compute``), and with the quiet machine's (a
    core each)."""
    phases = strategy_phases(strategy, spec, bunch, workers, constants)
    spent = round_compute(strategy, workers, measured, cores)
    scale = spent / phases.compute if spent > 0 else 1.0
    model = predict(spec, bunch, workers, constants, strategy, "sync", scale)
    quiet = predict(spec, bunch, workers, constants, strategy, "sync")
    return {
        "strategy": strategy,
        "workers": workers,
        "measured_mcups": round(measured["mcups"], 1),
        "runs_mcups": measured["runs"],
        "compute_seconds_per_bunch": round(spent, 6),
        "slowest_compute_seconds_per_bunch": round(measured["worker_seconds_per_bunch"], 6),
        "mean_compute_seconds_per_bunch": round(measured["mean_worker_seconds_per_bunch"], 6),
        "compute_over_quiet": round(scale, 3),
        "predicted_mcups": round(model.mcups, 1),
        "measured_over_predicted": round(measured["mcups"] / model.mcups, 3),
        "predicted_mcups_quiet": round(quiet.mcups, 1),
        "load_average": round(statistics.median(measured["loads"]), 1),
    }


def crossover(
    constants: Constants, spec: NetworkSpec, bunch: int, workers: int, sizes: list[int]
) -> int | None:
    """The first of ``sizes`` (hidden units) from which np is predicted faster (None: none)."""
    for size in sizes:
        b = bunch
        spec = hidden_layer(spec, size)
        np_mcups = predict(spec, b, workers, constants, "network", "sync").mcups
        pp_mcups = predict(spec, b, workers, constants, "pattern", "sync").mcups
        if np_mcups > pp_mcups:
            return size
    return None


def run(spec: NetworkSpec, bunch: int, workers: list[int], seconds: float, repeats: int,
        hidden_sweep: list[int], out: Path, work_dir: str | None) -> dict[str, Any]:  # fmt: skip
    constants = measure_np_rounds(spec, bunch, calibrate(spec, bunch))
    print(f"np_vs_pp: constants {constants.to_dict()}", file=sys.stderr, flush=True)
    points = [(s, p, spec) for s in ("network", "pattern") for p in workers]
    points += [(s, 2, hidden_layer(spec, h)) for h in hidden_sweep for s in ("network", "pattern")]
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="snet-np-pp-", dir=work_dir) as tmp:
        root = Path(tmp)
        corpus = synthetic_corpus(root / "corpus.npz", spec, 100_000)
        for attempt in range(repeats):  # interleaved: each repeat measures every point
            for strategy, count, net in points:
                where = root / f"{attempt}-{strategy}-{count}-{net.sizes[1]}"
                row = measure(strategy, count, net, bunch, seconds, corpus, where)
                runs.setdefault((strategy, count, net.describe()), []).append(row)
                print(f"np_vs_pp: run {attempt + 1}/{repeats} {strategy} P={count} "
                      f"{net.describe()}: {row['mcups']:.0f} MCUPS (load {row['load']:.1f})",
                      file=sys.stderr, flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    cores = len(os.sched_getaffinity(0))
    for (strategy, count, described), found in runs.items():
        net = NetworkSpec.parse(described)
        median = {
            "mcups": statistics.median(r["mcups"] for r in found),
            "worker_seconds_per_bunch": statistics.median(
                r["worker_seconds_per_bunch"] for r in found
            ),
            "mean_worker_seconds_per_bunch": statistics.median(
                r["mean_worker_seconds_per_bunch"] for r in found
            ),
            "runs": [round(r["mcups"], 1) for r in found],
            "loads": [r["load"] for r in found],
        }
        row = model_row(strategy, count, net, bunch, constants, median, cores)
        row["network"] = described
        (rows if described == spec.describe() else sweep).append(row)
    hidden_sizes = list(range(16, 4097, 16))
    bunches = [2**k for k in range(3, 14)]
    result = {
        "benchmark": "np_vs_pp",
        "network": spec.describe(),
        "bunch": bunch,
        "seconds_per_point": seconds,
        "repeats": repeats,
        "cores": cores,
        "constants": constants.to_dict(),
        "rows": rows,
        "hidden_sweep": sweep,
        "crossover_hidden_units_p4": crossover(constants, spec, bunch, 4, hidden_sizes),
        "crossover_hidden_units_p2": crossover(constants, spec, bunch, 2, hidden_sizes),
        "crossover_bunch_p4_np_faster_up_to": _np_faster_up_to(constants, spec, bunches, 4),
        "worst_model_error": round(
            max(abs(r["measured_over_predicted"] - 1.0) for r in rows + sweep), 3
        ),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "np-vs-pp.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _np_faster_up_to(constants: Constants, spec: NetworkSpec, bunches: list[int],
                     workers: int) -> int | None:  # fmt: skip
    """The largest of ``bunches`` at which np is predicted faster (None: at none)."""
    faster = [
        b for b in bunches
        if predict(spec, b, workers, constants, "network", "sync").mcups
        > predict(spec, b, workers, constants, "pattern", "sync").mcups
    ]  # fmt: skip
    return max(faster) if faster else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.np_vs_pp", description=__doc__)
    parser.add_argument("--network", default="351:1262:45")
    parser.add_argument("--bunch", type=int, default=128)
    parser.add_argument("--workers", default="1,2,3,4")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden-sweep", default="64,256,1024", help="hidden sizes, P = 2")
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(NetworkSpec.parse(args.network), args.bunch,
                 [int(p) for p in args.workers.split(",")], args.seconds, args.repeats,
                 [int(h) for h in args.hidden_sweep.split(",") if h], Path(args.out),
                 args.work_dir)  # fmt: skip
    print(json.dumps(result, indent=1))
    print(f"np_vs_pp: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
