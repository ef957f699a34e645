"""docs/np-vs-pp.md and docs/np-vs-pp.png from bench/np_vs_pp.py's JSON.

The table sets every measured point (the median of its interleaved runs, the runs
beside it) over the model given the compute time the workers spent in that run, with
the ratio, and the model for workers on cores of their own beside it; the figure draws
the same, as the MultiSpert report's Fig. 3: MCUPS against P for np and pp (left),
MCUPS against the hidden layer's size at P = 2 and 4 with the crossover (middle), and,
when bench/np_vs_pp_boards.py's np-vs-pp-boards.json lies beside the JSON, the emulated
Spert-II boards' MCUPS in board time against P with their model and the report's own np
figures (right).

    .venv/bin/python -m bench.np_vs_pp_report docs/np-vs-pp.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from snet.perf.figure import require_matplotlib
from snet.perf.model import (
    Constants,
    predict,
)
from snet.protocol.network import NetworkSpec

from .np_vs_pp import hidden_layer, strategy_phases

NAMES = {"network": "np", "pattern": "pp (sync)"}
COLOURS = {"network": "tab:orange", "pattern": "tab:blue"}


def _by(rows: list[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    return sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["workers"])


def _overhead(row: dict[str, Any], bunch: int, constants: Constants) -> str:
    """A round's time beyond the workers' compute, measured (the round's time at the
    median rate less the compute spent) and modelled (``L + P T_d + T_h``)."""
    spec, workers = NetworkSpec.parse(row["network"]), row["workers"]
    phases = strategy_phases(row["strategy"], spec, bunch, workers, constants)
    round_seconds = spec.connections * phases.patterns / (row["measured_mcups"] * 1e6)
    measured = round_seconds - row["compute_seconds_per_bunch"]
    model = phases.latency + workers * phases.transfer + phases.host
    return f"{measured * 1e3:.1f} / {model * 1e3:.1f}"


def table(result: dict[str, Any]) -> str:
    """The markdown of the figures (every point, nothing left out)."""
    lines = [
        f"Network {result['network']}, bunch {result['bunch']}, numpy workers on 127.0.0.1, "
        f"{result['cores']} cores shared with other work; {result['repeats']} interleaved "
        f"runs of {result['seconds_per_point']:g} s a point, the median kept.",
        "",
        "| strategy | P | measured MCUPS (runs) | model, compute as spent | measured / model "
        "| compute / quiet | model, a core each | load | a round's messages and server work, "
        "ms: measured / model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    constants = Constants.from_dict(result["constants"], "the run")
    for row in [*result["rows"], *result["hidden_sweep"]]:
        runs = ", ".join(f"{m:.0f}" for m in row["runs_mcups"])
        name = NAMES[row["strategy"]]
        if row["network"] != result["network"]:
            name += f", {row['network']}"
        lines.append(
            f"| {name} | {row['workers']} | {row['measured_mcups']:.0f} ({runs}) | "
            f"{row['predicted_mcups']:.0f} | {row['measured_over_predicted']:.2f} | "
            f"{row['compute_over_quiet']:.2f} | {row['predicted_mcups_quiet']:.0f} | "
            f"{row['load_average']:.1f} | {_overhead(row, result['bunch'], constants)} |"
        )
    within = sum(abs(r["measured_over_predicted"] - 1) <= 0.15
                 for r in [*result["rows"], *result["hidden_sweep"]])  # fmt: skip
    total = len(result["rows"]) + len(result["hidden_sweep"])
    lines += [
        "",
        f"{within} of {total} points within 15 % of the model; worst "
        f"{result['worst_model_error'] * 100:.0f} %.",
        f"Crossover (model, calibrated constants, a core per worker, bunch {result['bunch']}): "
        f"np is the faster from {result['crossover_hidden_units_p2']} hidden units at P = 2 "
        f"and from {result['crossover_hidden_units_p4']} at P = 4; on "
        f"{result['network']} at P = 4 np is the faster "
        + (
            f"up to bunches of {result['crossover_bunch_p4_np_faster_up_to']}."
            if result["crossover_bunch_p4_np_faster_up_to"]
            else "at no bunch from 8 to 8192."
        ),
    ]
    if constants.np_worker_seconds > 0:  # measured on np's own path (bench/np_calibrate.py)
        lines.append(
            f"np's own constants: {constants.np_worker_seconds * 1e6:.0f} us of the server "
            f"per worker and bunch, {constants.np_bunch_seconds * 1e6:.0f} us + "
            f"{constants.np_bunch_seconds_per_byte * 1e9:.2f} ns per element byte of its own "
            f"per bunch, a round's rest {constants.np_latency_seconds * 1e6:.0f} us + "
            f"{constants.np_latency_seconds_per_byte * 1e9:.2f} ns per element byte, "
            f"{constants.np_pattern_seconds * 1e9:.0f} ns per pattern on every worker; "
            "np's compute as spent is each bunch's slowest holder's (the round waits for it), "
            f"or all holders' over the {result['cores']} cores if longer (holders beyond the "
            "cores wait for one before they start), pp's the workers' mean."
        )
    return "\n".join(lines) + "\n"


def draw(result: dict[str, Any], path: Path, boards: dict[str, Any] | None = None) -> None:
    """The PNG: MCUPS against P (left), against the hidden units (middle), and with
    ``boards`` (bench/np_vs_pp_boards.py's result) the emulated boards' (right)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    constants = Constants.from_dict(result["constants"], "the run")
    spec, bunch = NetworkSpec.parse(result["network"]), result["bunch"]
    panels = 3 if boards else 2
    figure, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.8))
    left, right = axes[0], axes[1]
    if boards:
        _draw_boards(axes[2], boards)
    for strategy in ("network", "pattern"):
        rows, colour = _by(result["rows"], strategy), COLOURS[strategy]
        counts = [r["workers"] for r in rows]
        left.plot(counts, [r["measured_mcups"] for r in rows], "o", color=colour,
                  label=f"{NAMES[strategy]}, measured (median)")  # fmt: skip
        left.plot(counts, [r["predicted_mcups"] for r in rows], "-", color=colour,
                  label=f"{NAMES[strategy]}, model (compute as spent)")  # fmt: skip
        left.plot(counts, [r["predicted_mcups_quiet"] for r in rows], ":", color=colour,
                  label=f"{NAMES[strategy]}, model (a core each)")  # fmt: skip
    left.set_title(f"{spec.describe()}, bunch {bunch}, numpy workers", fontsize="medium")
    left.set_xlabel("workers P")
    left.set_xticks([r["workers"] for r in result["rows"]])
    hidden = list(range(32, 4097, 32))
    for workers, style in ((2, "-"), (4, "--")):
        for strategy in ("network", "pattern"):
            mcups = [predict(hidden_layer(spec, h), bunch, workers, constants, strategy,
                             "sync").mcups for h in hidden]  # fmt: skip
            right.plot(hidden, mcups, style, color=COLOURS[strategy],
                       label=f"{NAMES[strategy]}, model, P = {workers}")  # fmt: skip
        cross = result[f"crossover_hidden_units_p{workers}"]
        if cross:
            right.axvline(cross, color="grey", linestyle=style, alpha=0.5)
    for strategy in ("network", "pattern"):
        rows = sorted((r for r in result["hidden_sweep"] if r["strategy"] == strategy),
                      key=lambda r: NetworkSpec.parse(r["network"]).sizes[1])  # fmt: skip
        right.plot([NetworkSpec.parse(r["network"]).sizes[1] for r in rows],
                   [r["measured_mcups"] for r in rows], "o", color=COLOURS[strategy],
                   label=f"{NAMES[strategy]}, measured, P = 2")  # fmt: skip
    right.set_xscale("log", base=2)
    right.set_title("crossover: hidden units (grey: where np overtakes)", fontsize="medium")
    right.set_xlabel(f"hidden units ({spec.sizes[0]}:N:{spec.sizes[2]})")
    for axis in axes:
        axis.set_ylabel("MCUPS")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="x-small")
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# The report's np measurements on 1-4 Spert-II boards, as shares of one board's raw rate.
REPORT_NP_SHARES = (0.97, 1.78, 2.35, 2.05)


def _draw_boards(axis: Any, boards: dict[str, Any]) -> None:
    """Board-time MCUPS against P for np and pp on emulated boards, with the model given
    the boards' busy time, and the report's np figures (shares of one board's raw rate)."""
    for strategy in ("network", "pattern"):
        rows = sorted((r for r in boards["rows"] if r["strategy"] == strategy),
                      key=lambda r: r["boards"])  # fmt: skip
        counts, colour = [r["boards"] for r in rows], COLOURS[strategy]
        axis.plot(counts, [r["board_mcups"] for r in rows], "o", color=colour,
                  label=f"{NAMES[strategy]}, measured (median)")  # fmt: skip
        axis.plot(counts, [r["model_board_mcups"] for r in rows], "-", color=colour,
                  label=f"{NAMES[strategy]}, model (the boards' busy time)")  # fmt: skip
    raw = boards["board_raw_mcups"]
    axis.plot(range(1, len(REPORT_NP_SHARES) + 1), [raw * s for s in REPORT_NP_SHARES], "x",
              color="grey", label="np, the report's boards (TR-97-047)")  # fmt: skip
    axis.set_title(f"{boards['network']}, bunch {boards['bunch']}, emulated Spert-II boards "
                   "(board time)", fontsize="medium")  # fmt: skip
    axis.set_xlabel("boards P")
    axis.set_xticks(sorted({r["boards"] for r in boards["rows"]}))


def main(argv: list[str] | None = None) -> int:
    source = Path((argv or sys.argv[1:] or ["docs/np-vs-pp.json"])[0])
    result = json.loads(source.read_text())
    source.with_suffix(".md").write_text(table(result))
    boards_file = source.with_name("np-vs-pp-boards.json")  # bench/np_vs_pp_boards.py's
    boards = json.loads(boards_file.read_text()) if boards_file.exists() else None
    draw(result, source.with_suffix(".png"), boards)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
