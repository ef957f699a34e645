"""Fixed-point parity: sync training on 2 emulated Spert-II boards vs 2 float workers.

Both runs use the same job (by default snet's: 117:512:10, 10 epochs, bunch 128 per
worker, the default learning-rate schedule) on the default data, in sync mode, so that
they see the same schedule; only the arithmetic differs. Prints each run's CV accuracy
per epoch and the difference in points. Quicknet reported that 16+16-bit fixed point
classifies as well as float; the project's target is a final difference within 2 points.

    .venv/bin/python bench/spert_parity.py [--epochs N] [--network 117:512:10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def train(label: str, extra: list[str], job: list[str], out_dir: Path) -> dict[str, Any]:
    """Run ``snet demo`` in sync mode and return its final status document."""
    started = time.monotonic()
    command = [sys.executable, "-m", "snet.cli", "demo", "--mode", "sync", *job, *extra]
    result = subprocess.run(
        [*command, "--out-dir", str(out_dir)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{label} run failed:\n{result.stdout}\n{result.stderr}")
    status: dict[str, Any] = json.loads((out_dir / "status.json").read_text())
    status["bench_seconds"] = time.monotonic() - started
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--network", default="117:512:10")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1000.0,
        help="boards run this much faster than the modelled Spert-II (accuracy is unaffected)",
    )
    args = parser.parse_args()
    job = ["--epochs", str(args.epochs), "--network", args.network]
    with tempfile.TemporaryDirectory() as tmp:
        float_run = train("float", ["--workers", "2"], job, Path(tmp) / "float")
        board_run = train(
            "spert",
            ["--workers", "0", "--spert", "2", "--spert-time-scale", str(args.time_scale)],
            job,
            Path(tmp) / "spert",
        )
    print(f"sync mode, 2 workers each, network {args.network}, {args.epochs} epochs")
    print(f"{'epoch':>5} {'float CV':>9} {'spert CV':>9} {'diff':>7}")
    for a, b in zip(float_run["epochs"], board_run["epochs"], strict=True):
        diff = 100 * (b["cv_accuracy"] - a["cv_accuracy"])
        print(
            f"{a['epoch']:>5} {100 * a['cv_accuracy']:>8.2f}% "
            f"{100 * b['cv_accuracy']:>8.2f}% {diff:>+7.2f}"
        )
    final = 100 * (board_run["cv_accuracy"] - float_run["cv_accuracy"])
    print(
        f"final: float {100 * float_run['cv_accuracy']:.2f}%, "
        f"spert {100 * board_run['cv_accuracy']:.2f}%, difference {final:+.2f} points "
        f"({'within' if abs(final) <= 2 else 'OUTSIDE'} 2 points)"
    )
    for row in board_run["workers"]:
        report = row["report"]
        print(
            f"{row['name']}: modelled busy {report['modelled_busy_s']:.1f} s "
            f"(link {report['modelled_link_s']:.1f} s, "
            f"compute {report['modelled_compute_s']:.1f} s), "
            f"modelled {report['modelled_mcups']:.1f} MCUPS, real compute "
            f"{report['real_compute_s']:.1f} s, saturations {report['saturations']}"
        )
    print(
        f"wall: float {float_run['bench_seconds']:.1f} s, spert {board_run['bench_seconds']:.1f} s"
    )
    return 0 if abs(final) <= 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
