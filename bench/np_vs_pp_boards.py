"""The MultiSpert report's Fig. 3 with emulated Spert-II boards: np against pp, P = 1-4.

bench/np_vs_pp.py's measurement with ``snet spert`` boards as the workers instead of numpy
workers: a real server and P board emulators over 127.0.0.1 train 351:1262:45 (it fits
one 8 MB board) in ``--mode np`` and in ``--mode sync`` (pattern-parallel with a barrier
per round). A board runs ``--time-scale`` times faster than real time (its clock's
seconds are real seconds times the scale), so its link and compute are the board's
(client/spert/timing.py) while the server, the messages and the barrier are this
machine's, in real time.

Every MCUPS here is in **board time** (the real rate divided by the scale), as the
report's are, and also over one board's raw training rate (the report measured 97 %,
178 %, 235 % and 205 % for np on 1-4 boards). The model beside each point is ``snet
plan``'s (snet.perf.model.predict, mode ``sync``) with the constants calibrated in the
same run, given each board's busy time per bunch on its own clock (link and compute,
from its /status report; np: the slowest board's, which the round waits for; pp: the
mean), converted to real time, so that it tests the rounds: what np and pp exchange,
the server's work, the barrier. The board's host side (pp: the new weights quantised
into the board's words and the update read back each bunch; np: little, the board's time
covering the host's arithmetic for a slice) costs real time per round that a numpy
worker does not have, so it is measured first, in a run of one board per strategy
(``host_seconds``: that run's round, less the board's busy time and the rest of the
model's round), and added to the model's worker end of a round (L) for every point: the
P = 1 points are near the model by construction, P = 2-4 test it. A board that fell
behind its model (its real arithmetic slower than the board it emulates) is counted per
point; then its time is not the board's. The default scale, 5, makes a millisecond of
this machine five of the board's (docs/network-parallel.md has 5 and 10 side by side).

    .venv/bin/python -m bench.np_vs_pp_boards     # writes docs/np-vs-pp-boards.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from snet.client.spert.config import BoardConfig
from snet.perf.model import (
    Constants,
    predict,
)
from snet.protocol.network import NetworkSpec

from .calibrate import calibrate
from .np_calibrate import measure_np_rounds
from .np_vs_pp import measure_window, strategy_phases
from .np_vs_pp_report import NAMES
from .processes import LocalCluster, ServerHandle, synthetic_corpus

ROOT = Path(__file__).resolve().parent.parent


def _board_totals(status: dict[str, Any]) -> dict[str, tuple[int, float, float]]:
    """Per board: (patterns trained, modelled busy seconds, seconds behind the model)."""
    return {
        row["name"]: (r["patterns_trained"], r["modelled_busy_s"], r["behind_s"])
        for row in status["workers"]
        if (r := row.get("report") or {}).get("board")
    }


def busy_per_bunch(
    first: dict[str, Any], last: dict[str, Any], bunch: int, strategy: str
) -> tuple[float, float]:
    """(board seconds a round waits for per bunch, seconds behind the model in the window):
    np's round waits for its slowest board (every board trains every pattern of the bunch
    on its slice); pp's boards each train bunches of their own (the mean)."""
    before, after = _board_totals(first), _board_totals(last)
    per_bunch, behind = [], 0.0
    for name, (patterns, busy, late) in after.items():
        if name in before and patterns > before[name][0]:
            bunches = (patterns - before[name][0]) / bunch
            per_bunch.append((busy - before[name][1]) / bunches)
            behind += late - before[name][2]
    if not per_bunch:
        raise RuntimeError("no board trained while the point was measured")
    return (max(per_bunch) if strategy == "network" else statistics.mean(per_bunch)), behind


def measure(
    strategy: str, boards: int, spec: NetworkSpec, bunch: int, seconds: float, scale: float,
    corpus: tuple[Path, int], directory: Path,
) -> dict[str, Any]:  # fmt: skip
    """One server and ``boards`` emulated boards: the real rate (patterns per second, the
    mean over ``seconds`` of training after a warm-up, as bench/np_vs_pp.py takes it) and
    the boards' busy time per bunch in that window."""

    def board(cluster: LocalCluster, server: ServerHandle, index: int) -> None:
        cluster.spert(server, f"b{index}", ["--time-scale", f"{scale:g}"])

    first, mean, last = measure_window(
        strategy, boards, spec, bunch, seconds, corpus, directory, board, warmup_timeout=600
    )
    busy, behind = busy_per_bunch(first, last, bunch, strategy)
    return {"patterns_per_s": mean, "busy": busy, "behind": behind,
            "load": os.getloadavg()[0]}  # fmt: skip


def host_seconds(
    strategy: str, spec: NetworkSpec, bunch: int, scale: float, constants: Constants,
    alone: dict[str, Any],
) -> float:  # fmt: skip
    """A board's host side per round, from a run of one board (``alone``): its round in
    real time less the board's busy time and the rest of the model's round."""
    round_seconds = bunch / float(alone["patterns_per_s"])
    phases = strategy_phases(strategy, spec, bunch, 1, constants)
    rest = phases.latency + phases.transfer + phases.host
    return max(round_seconds - float(alone["busy"]) / scale - rest, 0.0)


def board_constants(constants: Constants, strategy: str, host: float) -> Constants:
    """``constants`` with a board's host side added to the worker's end of each round (L):
    np's own latency when np's constants were measured (network_parallel_phases uses
    them then), else the pattern-parallel one, which L counts twice (a message each way)."""
    if strategy == "network" and constants.np_worker_seconds > 0.0:
        return replace(constants, np_latency_seconds=constants.np_latency_seconds + host)
    return replace(constants, latency_seconds=constants.latency_seconds + host / 2)


def model_row(
    strategy: str, boards: int, spec: NetworkSpec, bunch: int, scale: float,
    constants: Constants, runs: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """A point's median against the model given the boards' busy time (board seconds,
    converted to real by the scale); MCUPS in board time."""
    raw = BoardConfig().train_mcups
    measured = spec.connections * statistics.median(r["patterns_per_s"] for r in runs) / 1e6
    busy = statistics.median(r["busy"] for r in runs)
    phases = strategy_phases(strategy, spec, bunch, boards, constants)
    model = predict(spec, bunch, boards, constants, strategy, "sync",
                    busy / scale / phases.compute)  # fmt: skip
    return {
        "strategy": strategy,
        "boards": boards,
        "board_mcups": round(measured / scale, 2),
        "runs_board_mcups": [
            round(spec.connections * r["patterns_per_s"] / 1e6 / scale, 2) for r in runs
        ],
        "of_one_board_raw": round(measured / scale / raw, 3),
        "model_board_mcups": round(model.mcups / scale, 2),
        "measured_over_model": round(measured / model.mcups, 3),
        "busy_board_seconds_per_bunch": round(busy, 5),
        "behind_model_seconds": round(sum(r["behind"] for r in runs), 3),
        "load_average": round(statistics.median(r["load"] for r in runs), 1),
    }


def run(spec: NetworkSpec, bunch: int, boards: list[int], seconds: float, repeats: int,
        scale: float) -> dict[str, Any]:  # fmt: skip
    constants = measure_np_rounds(spec, bunch, calibrate(spec, bunch))
    print(f"np_vs_pp_boards: constants {constants.to_dict()}", file=sys.stderr, flush=True)
    points = [(s, p) for s in ("network", "pattern") for p in boards]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    host: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="snet-np-pp-boards-") as tmp:
        root = Path(tmp)
        corpus = synthetic_corpus(root / "corpus.npz", spec, 100_000)
        for strategy in ("network", "pattern"):  # the boards' host side, one board alone
            alone = measure(strategy, 1, spec, bunch, seconds, scale, corpus,
                            root / f"host-{strategy}")  # fmt: skip
            host[strategy] = host_seconds(strategy, spec, bunch, scale, constants, alone)
            shown = f"{host[strategy] * 1e3:.2f} ms a round"
            print(f"np_vs_pp_boards: {strategy}: a board's host side {shown}", file=sys.stderr)
        for attempt in range(repeats):  # interleaved: each repeat measures every point
            for strategy, count in points:
                where = root / f"{attempt}-{strategy}-{count}"
                row = measure(strategy, count, spec, bunch, seconds, scale, corpus, where)
                runs.setdefault((strategy, count), []).append(row)
                print(f"np_vs_pp_boards: run {attempt + 1}/{repeats} {strategy} P={count}: "
                      f"{spec.connections * row['patterns_per_s'] / 1e6 / scale:.1f} board MCUPS, "
                      f"busy {row['busy']:.3f} board s a bunch (load {row['load']:.1f})",
                      file=sys.stderr, flush=True)  # fmt: skip
    rows = [
        model_row(s, p, spec, bunch, scale, board_constants(constants, s, host[s]), found)
        for (s, p), found in runs.items()
    ]
    return {
        "benchmark": "np_vs_pp_boards",
        "network": spec.describe(),
        "bunch": bunch,
        "time_scale": scale,
        "seconds_per_point": seconds,
        "repeats": repeats,
        "cores": len(os.sched_getaffinity(0)),
        "board_raw_mcups": BoardConfig().train_mcups,
        "constants": constants.to_dict(),
        "host_seconds": {strategy: round(value, 6) for strategy, value in host.items()},
        "rows": rows,
        "worst_model_error": round(max(abs(r["measured_over_model"] - 1.0) for r in rows), 3),
    }


def table(result: dict[str, Any]) -> str:
    """The markdown of every point."""
    lines = [
        f"Network {result['network']}, bunch {result['bunch']}, emulated Spert-II boards "
        f"(time scale {result['time_scale']:g}) on 127.0.0.1, {result['cores']} cores; "
        f"{result['repeats']} interleaved runs of {result['seconds_per_point']:g} s a point, "
        "the median kept. MCUPS in board time.",
        "",
        "| strategy | P | board MCUPS (runs) | of one board's raw rate | model | measured / model "
        "| board s a bunch | behind the model, s | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        runs = ", ".join(f"{m:.1f}" for m in row["runs_board_mcups"])
        lines.append(
            f"| {NAMES[row['strategy']]} | {row['boards']} | {row['board_mcups']:.1f} ({runs}) | "
            f"{row['of_one_board_raw'] * 100:.0f} % | {row['model_board_mcups']:.1f} | "
            f"{row['measured_over_model']:.2f} | {row['busy_board_seconds_per_bunch']:.3f} | "
            f"{row['behind_model_seconds']:.2f} | {row['load_average']:.1f} |"
        )
    within = sum(abs(r["measured_over_model"] - 1) <= 0.15 for r in result["rows"])
    host = result["host_seconds"]
    lines += ["", f"{within} of {len(result['rows'])} points within 15 % of the model; worst "
              f"{result['worst_model_error'] * 100:.0f} %. A board's host side, measured "
              f"with one board alone and added to the model's rounds: "
              f"{host['network'] * 1e3:.1f} ms a round in np, {host['pattern'] * 1e3:.1f} ms "
              "in pp (real time)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.np_vs_pp_boards", description=__doc__)
    parser.add_argument("--network", default="351:1262:45")
    parser.add_argument("--bunch", type=int, default=128)
    parser.add_argument("--boards", default="1,2,3,4")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(NetworkSpec.parse(args.network), args.bunch,
                 [int(p) for p in args.boards.split(",")], args.seconds, args.repeats,
                 args.time_scale)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "np-vs-pp-boards.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "np-vs-pp-boards.md").write_text(table(result))
    print(table(result))
    print(f"np_vs_pp_boards: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
