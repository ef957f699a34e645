"""SNet v2's Figure 4 on today's cores: per-bunch exchange against bmuf over 1 Gbit/s links.

SNet's own setting: network 39:500:42, a bunch of 1000 patterns per worker, P = 1..5
workers, each worker and the server in a network namespace of its own behind a bridge
whose every port is shaped to ``--link`` with tbf (bench/netns.py; needs root). The
workers use the ``modelled`` backend (client/modelled_backend.py): they sleep the time
the numpy step needs for a bunch on this machine (as recorded in docs/benchmarks.json,
or measured now with ``--measure-compute``), and send a tiny constant,
so the links, the server's steps and the flow control are real and five workers fit on
two cores. Modes: per-bunch ``sync`` and ``async``, and ``bmuf`` (synchronous blocks of
``--block-bunches`` bunches) with float32 deltas and with ``--compress int8`` deltas,
both also with the workers training the next block during the exchange
(``--block-overlap``), and asynchronous blocks.

Each point trains for ``--seconds`` after start-up; its rate is the best window of at
least half of them between /status readings (bench/processes.best_rate), as MCUPS, and
the speed-up divides it by one worker computing alone. Beside it stands ``snet plan``'s
prediction (snet.perf.model.predict) with the same constants, the link replaced by
``--link``, and the compute the workers really spent::

    sudo .venv/bin/python -m bench.bmuf_figure4 --json /tmp/figure4.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from snet.perf.model import DEFAULT_CONSTANTS, Constants, alone_mcups, predict
from snet.perf.plan import find_constants
from snet.protocol.network import NetworkSpec

from .calibrate import calibrate, measure_compute
from .netns import SlowNetwork
from .nsrun import train
from .processes import best_rate, job_flags, modelled_env, synthetic_corpus

ROOT = Path(__file__).resolve().parent.parent
# name: (the plan's mode, extra server flags)
MODES: dict[str, tuple[str, list[str]]] = {
    "sync": ("sync", []),
    "async": ("async", []),
    "bmuf": ("bmuf", []),
    "bmuf-int8": ("bmuf", ["--compress", "int8"]),
    "bmuf-overlap": ("bmuf-overlap", ["--block-overlap", "true"]),
    "bmuf-overlap-int8": ("bmuf-overlap", ["--block-overlap", "true", "--compress", "int8"]),
    "bmuf-async": ("bmuf-async", ["--block-sync", "false"]),
}


def constants_here(
    link_mbps: float, network: NetworkSpec, bunch: int, measure: bool, calibrated: bool
) -> Constants:
    """docs/benchmarks.json's constants (or the defaults), with the link at ``link_mbps``;
    ``calibrated``: the server's and the messages' costs measured now (bench/calibrate.py,
    as the scaling benchmark does: the model and the measurement then share the machine's
    state); ``measure``: the numpy step measured now too, else the recorded rate (on a
    busy machine a measurement now measures the neighbours as much as numpy)."""
    path = ROOT / "docs" / "benchmarks.json"
    recorded = (
        find_constants(json.loads(path.read_text()), str(path))
        if path.is_file()
        else DEFAULT_CONSTANTS
    )
    constants = calibrate(network, bunch) if calibrated else recorded
    cu_seconds = measure_compute(network, bunch) if measure else recorded.cu_seconds
    return replace(constants, cu_seconds=cu_seconds).with_link_mbps(link_mbps)


def point(
    name: str,
    workers: int,
    network: NetworkSpec,
    bunch: int,
    tau: int,
    seconds: float,
    corpus: tuple[Path, int],
    constants: Constants,
    link: SlowNetwork,
    workdir: Path,
) -> dict[str, Any]:
    """One mode and worker count: measured MCUPS beside the model's."""
    mode, extra = MODES[name]
    server_mode = "bmuf" if mode.startswith("bmuf") else mode
    flags = job_flags(server_mode, network, bunch, *corpus)
    flags += ["--chunk-frames", str(2 * tau * bunch), *extra]  # the same leases in every mode
    if server_mode == "bmuf":  # a job of another mode refuses bmuf's own settings
        flags += ["--block-bunches", str(tau)]
    env = modelled_env(constants.cu_seconds, 1.0)
    run = train(
        workdir / f"{name}-{workers}",
        flags,
        workers,
        ["--backend", "modelled"],
        network=link,
        env=env,
        stop_after=seconds + 2.0,
        timeout=180.0,
    )
    live = [r for r in run.readings if r["live"] == workers and r["patterns"] > 0]
    if len(live) < 3:
        raise RuntimeError(f"{name} P={workers}: no progress: {run.readings[-3:]}")
    start = live[0]["t"] + 2.0  # the first blocks and leases are start-up
    samples = [(r["t"], r["patterns"]) for r in live if r["t"] >= start] or [
        (r["t"], r["patterns"]) for r in live
    ]
    best, mean = best_rate(samples, (samples[-1][0] - samples[0][0]) / 2)
    spent = live[-1]["real_seconds"] / max(live[-1]["modelled_seconds"], 1e-9)
    model = predict(network, bunch, workers, constants, "pattern", mode, spent, tau,
                    "int8" if "int8" in name else "none")  # fmt: skip
    alone = alone_mcups(network, constants)
    measured = network.connections * best / 1e6
    row = {
        "mode": name,
        "workers": workers,
        "measured_mcups": round(measured, 1),
        "mean_mcups": round(network.connections * mean / 1e6, 1),
        "measured_speedup": round(measured / alone, 3),
        # over one worker alone at the compute rate the workers' sleeps really had
        "measured_speedup_compute_spent": round(measured * spent / alone, 3),
        "predicted_mcups": round(model.mcups, 1),
        "predicted_speedup": round(model.mcups / alone, 3),
        "measured_over_predicted": round(measured / model.mcups, 3),
        "compute_real_over_modelled": round(spent, 4),
        "bound": model.bound,
    }
    print(f"figure 4: {row}", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bmuf_figure4", description=__doc__)
    parser.add_argument("--workers", default="1,2,3,4,5")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--measure-compute",
        dest="measure_compute",
        action="store_true",
        help="model the workers at the numpy rate measured now, not the recorded one",
    )
    parser.add_argument("--network", default="39:500:42")
    parser.add_argument("--bunch", type=int, default=1000)
    parser.add_argument("--block-bunches", dest="tau", type=int, default=16)
    parser.add_argument("--link", type=float, default=1000.0, help="Mbit/s")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured per point")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the server's and the messages' costs now (about 40 s)",
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=2_000_000,
        help="frames in the synthetic corpus (an epoch must span many blocks)",
    )
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--workdir", help="keep the runs' logs in this directory")
    args = parser.parse_args(argv)
    network = NetworkSpec.parse(args.network)
    counts = [int(p) for p in args.workers.split(",")]
    names = args.modes.split(",")
    constants = constants_here(args.link, network, args.bunch, args.measure_compute, args.calibrate)
    rows = []
    with tempfile.TemporaryDirectory(prefix="snet-figure4-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        corpus = synthetic_corpus(workdir / "corpus.npz", network, frames=args.frames)
        for count in counts:
            with SlowNetwork(count, f"{args.link:g}mbit") as link:
                for name in names:
                    rows.append(point(name, count, network, args.bunch, args.tau,
                                      args.seconds, corpus, constants, link, workdir))  # fmt: skip
    worst = max(abs(r["measured_over_predicted"] - 1) for r in rows)
    result = {
        "benchmark": "bmuf figure 4",
        "network": network.describe(),
        "bunch": args.bunch,
        "block_bunches": args.tau,
        "link_mbps": args.link,
        "constants": constants.to_dict(),
        "rows": rows,
        "worst_model_error": round(worst, 3),
    }
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
