"""Convergence of bmuf against sequential, per-bunch sync and async training, at equal epochs.

Every run trains the same job (the same epochs and learning rates) with real processes
on 127.0.0.1 and records the CV frame accuracy after every epoch:

- ``sequential``: ``snet train`` (one process, a global bunch of ``--bunch`` patterns);
- ``sync N`` and ``async N``: a server and N workers exchanging every bunch;
- ``<filter> N tau``: bmuf with N workers, blocks of tau bunches, a block filter of
  cbm, nbm, average or nesterov (their default constants, server/block_filter.py);
  ``<filter>+overlap N tau`` the same with the workers training the next block during
  the exchange (``--block-overlap``; ``--overlap`` adds these to the grid).

Parallel runs divide the global bunch among the workers (``--bunch`` / N each, as ``snet
demo`` and docs/convergence.md do), so a bmuf worker takes as many local steps per epoch
as sequential training does over the whole epoch. Results go to a JSON file as each run
ends; a rerun skips the runs already in it, so a grid can be run in parts::

    .venv/bin/python -m bench.bmuf_convergence --results /tmp/fsdd.json
    .venv/bin/python -m bench.fashion_mnist /tmp/fmnist.npz
    .venv/bin/python -m bench.bmuf_convergence --results /tmp/fm.json --epochs 4 \\
        --taus 16 -- --data /tmp/fmnist.npz --context 0 --network 784:512:10 \\
        --learning-rates 0.2,0.1,0.05,0.025
    .venv/bin/python -m bench.bmuf_convergence --results /tmp/fm.json --table

Extra job flags after ``--`` go to every run. ``--table`` prints the markdown table of a
results file (docs/bmuf.md holds the tables of the runs made for issue 15).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from snet.cli.runtime import blas_thread_env

from .convergence import run_parallel, snet_command

FILTERS = ("cbm", "nbm", "average", "nesterov")
CV_LINE = re.compile(r"^epoch\s+(\d+)\b.*CV\s+([0-9.]+)%")


def run_sequential(job_args: list[str], timeout: float) -> dict[str, Any]:
    """``snet train`` with one BLAS thread: its CV accuracy after each epoch."""
    with tempfile.TemporaryDirectory(prefix="snet-bmuf-seq-") as tmp:
        done = subprocess.run(
            snet_command("train", "--out-dir", tmp, *job_args),
            env=blas_thread_env(1),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if done.returncode != 0:
        raise RuntimeError(f"snet train failed: {done.stderr[-800:]}")
    accuracy = [float(m.group(2)) / 100 for line in done.stdout.splitlines()
                if (m := CV_LINE.match(line))]  # fmt: skip
    return {"cv": accuracy}


def run_one(
    name: str,
    workers: int,
    bunch: int,
    job_args: list[str],
    timeout: float,
    server_args: list[str] | None = None,
) -> dict:
    """One named configuration (see the module's docstring); its CV accuracy per epoch.
    ``server_args``: flags for the server alone (e.g. ``--join-seconds``)."""
    started = time.perf_counter()
    if name == "sequential":
        result = run_sequential(["--bunch-size", str(bunch), *job_args], timeout)
    else:
        kind, *rest = name.split()
        per_worker = ["--bunch-size", str(max(bunch // workers, 1))]
        if kind in ("sync", "async"):
            mode = kind
            flags = [*per_worker, *job_args]
        else:
            mode = "bmuf"
            block_filter, _, overlap = kind.partition("+")
            ahead = ["--block-overlap", "true"] if overlap else []
            flags = [*per_worker, "--block-filter", block_filter, "--block-bunches", rest[1],
                     *ahead, *job_args]  # fmt: skip
        status = run_parallel(mode, workers, [*flags, *(server_args or [])], timeout)
        result = {
            "cv": [e["cv_accuracy"] for e in status["epochs"]],
            "staleness_mean": status.get("staleness_mean"),
            "rule": status.get("rule"),
            # sync rounds drop a worker past its deadline (server/lateness.py); it rejoins
            "workers_dropped_late": status.get("workers_dropped_late"),
            "server_args": server_args or [],
        }
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def grid(
    workers: list[int], taus: list[int], filters: list[str], overlap: bool = False
) -> list[tuple[str, int]]:
    names: list[tuple[str, int]] = [("sequential", 1)]
    names += [(f"{mode} {n}", n) for mode in ("sync", "async") for n in workers]
    kinds = [*filters, *(f"{f}+overlap" for f in filters if overlap)]
    names += [(f"{f} {n} {tau}", n) for f in kinds for n in workers for tau in taus]
    return names


def markdown(results: dict[str, Any]) -> str:
    """The table of a results file: final CV, its gap to sequential, the best epoch."""
    runs = results["runs"]
    base = runs.get("sequential", {}).get("cv", [None])[-1]
    lines = [
        "| run | CV after each epoch (%) | final | minus sequential | wall s |",
        "|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        cv = run["cv"]
        final = cv[-1] if cv else None
        gap = "" if final is None or base is None else f"{100 * (final - base):+.2f}"
        epochs = " ".join(f"{100 * value:.2f}" for value in cv)
        shown = "—" if final is None else f"{100 * final:.2f}"
        lines.append(f"| {name} | {epochs} | {shown} | {gap} | {run['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bmuf_convergence", description=__doc__)
    parser.add_argument("--results", required=True, help="JSON file the runs are added to")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--bunch", type=int, default=128, help="global bunch (patterns)")
    parser.add_argument("--workers", default="2,4", help="comma-separated worker counts")
    parser.add_argument("--taus", default="4,16,64", help="comma-separated block lengths")
    parser.add_argument("--filters", default=",".join(FILTERS))
    parser.add_argument("--only", help="comma-separated run names to do (of the grid or not)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--server-args",
        dest="server_args",
        default="",
        help='flags for the servers alone, e.g. "--join-seconds 120"',
    )
    parser.add_argument("--overlap", action="store_true", help="add <filter>+overlap runs")
    parser.add_argument("--again", action="store_true", help="rerun runs already done")
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    parser.add_argument("job_args", nargs="*", help="extra job flags for every run")
    args = parser.parse_args(argv)
    path = Path(args.results)
    results: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    if args.table:
        print(markdown(results))
        return 0
    job_args = ["--epochs", str(args.epochs), *args.job_args]
    if results.setdefault("job_args", job_args) != job_args:
        parser.error(f"{path} holds runs of another job: {results['job_args']}")
    results.setdefault("bunch", args.bunch)
    runs: dict[str, Any] = results.setdefault("runs", {})
    workers = [int(n) for n in args.workers.split(",")]
    taus = [int(t) for t in args.taus.split(",")]
    todo = grid(workers, taus, args.filters.split(","), args.overlap)
    if args.only:
        wanted = [name.strip() for name in args.only.split(",")]
        for name in wanted:  # a misspelt one ran plain blocks, recorded under its name
            kind = name.split()[0]
            if "+" in kind and kind.partition("+")[2] != "overlap":
                parser.error(f"run {name!r}: after '+' only 'overlap' is known")
        todo = [(name, int(name.split()[1]) if " " in name else 1) for name in wanted]
    for name, count in todo:
        if name in runs and not args.again:
            continue
        server_args = args.server_args.split()
        runs[name] = run_one(name, count, args.bunch, job_args, args.timeout, server_args)
        path.write_text(json.dumps(results, indent=1) + "\n")
        print(name, runs[name], file=sys.stderr, flush=True)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
