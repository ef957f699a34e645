"""The benchmark suite (``python -m bench``, ``make bench``, ``snet bench`` in a checkout):
JSON to a file and a readable table.

Every figure is a ratio measured in the same run (ours beside a peer, ours beside the
physical limit), because the machines are shared and noisy. Sections: ``worker`` (the
arithmetic beside PyTorch and the GEMM ceiling), ``server`` (elements through the server
beside plain ``recv_into``), ``round`` (a synchronous round beside a gloo all-reduce) and
``scaling`` (emulated workers P = 1..8 against the performance model), ``update`` (what an
update costs the server and a worker beside its bunch's compute: bench/update_cost.py) and
``accuracy`` (time to a CV accuracy against ``snet train``, for the default job and paired
at seeds 1-6: bench/time_to_accuracy.py).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from snet.cli.parser import Parser
from snet.cli.runtime import blas_thread_env

from . import CHECKOUT, child_env
from .arguments import checkout
from .report import render_markdown

WORKER_NETWORKS = ("39:500:42", "351:1262:45")
WORKER_BUNCHES = (12, 96, 1000)
# The default job's network at its bunch size, beside the grid above.
WORKER_EXTRA = (("117:512:10", 128),)
WORKER_THREADS = (1, 2)
SECTIONS = ("worker", "server", "round", "scaling", "update", "accuracy")


def _worker_rows(quick: bool) -> list[dict[str, Any]]:
    rows = []
    bunches = (12, 1000) if quick else WORKER_BUNCHES
    threads = (1,) if quick else WORKER_THREADS
    shapes = [(n, b) for n in WORKER_NETWORKS for b in bunches] + list(WORKER_EXTRA)
    for (network, bunch), count in itertools.product(shapes, threads):
        env = child_env(blas_thread_env(count))
        output = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.worker_compute",
                "--network",
                network,
                "--bunch",
                str(bunch),
                "--threads",
                str(count),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=True,
        ).stdout
        rows.append(json.loads(output))
        print(f"  worker {network} bunch {bunch} threads {count}: {rows[-1]}", flush=True)
    return rows


def run_sections(
    sections: list[str], quick: bool, seconds: float, baseline: Path | None = None
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "processor": platform.machine(),
        },
    }
    if "worker" in sections:
        print("worker arithmetic ...", flush=True)
        results["worker"] = _worker_rows(quick)
    if "server" in sections:
        from .server_throughput import run_server_bench

        print("server throughput ...", flush=True)
        results["server"] = run_server_bench(seconds, (1, 2) if quick else (1, 2, 4))
    if "round" in sections:
        from .sync_round import run_round_bench

        print("synchronous round ...", flush=True)
        results["round"] = run_round_bench(seconds)
    if "scaling" in sections:
        from .scaling import run_scaling

        print("scaling ...", flush=True)
        results["scaling"] = run_scaling()
    if "update" in sections:
        from .update_cost import run_update_bench

        print("per-update cost ...", flush=True)
        results["update"] = run_update_bench(max(seconds, 3.0), baseline=baseline)
    if "accuracy" in sections:
        from .time_to_accuracy import run_accuracy_bench

        print("time to accuracy ...", flush=True)
        results["accuracy"] = run_accuracy_bench(1 if quick else 3, baseline=baseline)
        # The default job's snet train is one fixed run (seed 1); the same at other seeds:
        results["accuracy"]["across_seeds"] = run_accuracy_bench(
            2 if quick else 6, modes=("async", "bmuf"), vary_seed=True
        )
    return results


def parser() -> argparse.ArgumentParser:
    """The suite's flags (``snet bench`` passes its arguments through unchanged)."""
    # snet's parser: a help that cannot be written fails, where argparse's was lost
    parser = Parser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="fewer configurations")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    parser.add_argument(
        "--baseline",
        type=checkout,
        help="a checkout of earlier code measured beside this one in the update and "
        "accuracy sections (e.g. git archive main | tar -x -C DIR)",
    )
    parser.add_argument(
        "--json",
        default=str(CHECKOUT / "docs" / "benchmarks.json"),
        help="results file (default: the checkout's docs/benchmarks.json)",
    )
    parser.add_argument(
        "--markdown",
        default=str(CHECKOUT / "docs" / "benchmarks.md"),
        help="tables file (default: the checkout's docs/benchmarks.md; empty: none)",
    )
    return parser


def run_bench(args: argparse.Namespace) -> int:
    sections = args.only.split(",") if args.only else list(SECTIONS)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        print(
            f"snet: unknown bench section(s) {sorted(unknown)}; known: {SECTIONS}", file=sys.stderr
        )
        return 2
    results = run_sections(sections, args.quick, args.seconds, getattr(args, "baseline", None))
    path = Path(args.json)
    if args.only and path.exists():
        # A partial rerun refreshes its own sections of the file and keeps the others.
        previous = json.loads(path.read_text())
        for section in sections:
            previous[section] = results[section]
            previous[f"{section}_when"] = results["when"]
        results = previous
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    markdown = render_markdown(results)
    if args.markdown:
        Path(args.markdown).write_text(markdown)
    print(markdown)
    return 0
