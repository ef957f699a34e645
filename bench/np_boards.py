"""A network no single emulated Spert board holds, refused by one and trained on four.

351:4000:45 (Quicknet's 39 features x 9 frames in, 45 phone classes out) needs 16.9 MB on
one emulated Spert-II board (two 32-bit copies of its 1.6 M weights, the pattern buffer,
a bunch's activations and deltas, the tables) and 4.8 MB for a quarter of its hidden
units. This benchmark starts real processes on 127.0.0.1: an np-mode server and one
``snet spert`` board (which must refuse its slice, the whole network, and exit 4), then a
server with ``--min-workers 4`` and four boards, trained for one epoch on synthetic
frames (random labels: the CV accuracy is chance, 1/45; the point is the memory and the
modelled rate). It writes each board's slice memory and modelled MCUPS::

    .venv/bin/python bench/np_boards.py          # writes docs/np-boards.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.processes import LocalCluster, synthetic_corpus
from snet.cli.runtime import blas_thread_env
from snet.protocol.network import NetworkSpec

ROOT = Path(__file__).resolve().parent.parent
NETWORK = NetworkSpec.parse("351:4000:45")


def _job(data: Path, context: int, bunch: int) -> list[str]:
    return [
        "--mode", "np", "--network", NETWORK.describe(), "--bunch-size", str(bunch),
        "--chunk-frames", str(16 * bunch), "--epochs", "1", "--data", str(data),
        "--context", str(context), "--learning-rates", "0.05", "--linger-seconds", "30",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--bunch", type=int, default=128)
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "np-boards.json"))
    parser.add_argument("--work-dir", help="keep the logs and data here (default: a temporary one)")
    args = parser.parse_args()
    board = ["--time-scale", str(args.time_scale)]
    env = blas_thread_env(1)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.work_dir or scratch
        data, context = synthetic_corpus(Path(tmp) / "data.npz", NETWORK, args.frames)
        job = _job(data, context, args.bunch)
        with LocalCluster(Path(tmp) / "one", env) as cluster:
            alone = cluster.spert(cluster.server(job), "board", board)
            refused = alone.wait(120)
            refusal = (Path(tmp) / "one" / "board.log").read_text()
        with LocalCluster(Path(tmp) / "four", env) as cluster:
            server = cluster.server([*job, "--min-workers", "4"])
            for i in range(4):
                cluster.spert(server, f"board{i}", board)
            started = time.monotonic()
            status_path = Path(tmp) / "four" / "out" / "status.json"
            cluster.wait_for(
                lambda: (
                    status_path.exists()
                    and json.loads(status_path.read_text()).get("state") == "trained"
                ),
                3600,
                "one epoch on four boards",
            )
            wall = time.monotonic() - started
            status = json.loads(status_path.read_text())
    reports = [row["report"] for row in status["workers"]]
    result = {
        "network": NETWORK.describe(),
        "bunch": args.bunch,
        "one_board": {
            "exit_code": refused,
            "refusal": next((ln for ln in refusal.splitlines() if "does not fit" in ln), ""),
        },
        "four_boards": {
            "cv_accuracy": status["cv_accuracy"],
            "train_accuracy": status["epochs"][0]["train_accuracy"],
            "wall_seconds": round(wall, 1),
            "boards": [
                {k: r[k] for k in ("memory_mb", "modelled_mcups", "patterns_trained")}
                for r in reports
            ],
            # every board trains its slice on every pattern: the system's rate is the sum
            "modelled_mcups_total": round(sum(r["modelled_mcups"] for r in reports), 1),
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
