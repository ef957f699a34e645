"""The figure of ``snet plan --png``: MCUPS against workers, model and measurement.

Left: the model for the planned scenario, one line per strategy and mode, beside ideal
linear scaling. Right (with ``--measured``): the scaling benchmark's measured MCUPS as
points over the model evaluated for the very scenario and constants that run used, as
the MultiSpert paper set its measurements over its model. matplotlib is an optional
dependency (the ``bench`` extra) and is imported only here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from snet.protocol.errors import ConfigError
from snet.protocol.network import NetworkSpec

from .model import BLOCK_MODES, Constants, predict

_STYLE = {"sync": "--", "async": "-", "bmuf": "-.", "bmuf-async": ":"}
_COLOUR = {"pattern": "tab:blue", "network": "tab:orange"}
_MEASURED_COLOUR = {"sync": "tab:red", "async": "tab:green"}


def require_matplotlib() -> None:
    """Fail early, with the way out, when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "--png needs matplotlib, which is not installed: "
            "pip install 'snet-train[bench]' (or pip install matplotlib)"
        )


def _curve(
    network: NetworkSpec,
    bunch: int,
    constants: Constants,
    counts: list[int],
    strategy: str,
    mode: str,
    time_scale: float = 1.0,
    block_bunches: int = 16,
) -> list[float]:
    return [
        predict(network, bunch, p, constants, strategy, mode, time_scale, block_bunches).mcups
        for p in counts
    ]


def draw(
    path: Path,
    network: NetworkSpec,
    bunch: int,
    constants: Constants,
    workers: list[int],
    strategies: list[str],
    modes: list[str],
    measured: dict[str, Any] | None = None,
    block_bunches: int = 16,
) -> None:
    """Write the figure to ``path`` (PNG)."""
    require_matplotlib()
    # A Figure of its own, not pyplot's: no global state, no display, and saving it to
    # PNG uses Agg (pyplot's import alone was 0.35 s of CPU more, 0.9 s against 0.6).
    from matplotlib.figure import Figure

    panels = 2 if measured else 1
    figure = Figure(figsize=(6.4 * panels, 4.8))
    axes = figure.subplots(1, panels, squeeze=False)
    left = axes[0][0]
    counts = list(range(1, max(workers) + 1))
    for strategy in strategies:
        for mode in modes:
            if strategy != "pattern" and mode in BLOCK_MODES:
                continue  # bmuf workers train whole copies
            left.plot(
                counts,
                _curve(network, bunch, constants, counts, strategy, mode, 1.0, block_bunches),
                _STYLE[mode],
                color=_COLOUR[strategy],
                label=f"{strategy}-parallel, {mode}"
                + (f" (tau {block_bunches})" if mode in BLOCK_MODES else ""),
            )
    one = (
        predict(network, bunch, 1, constants).mcups / predict(network, bunch, 1, constants).speedup
    )
    left.plot(counts, [one * p for p in counts], ":", color="grey", label="ideal (P x one alone)")
    left.set_title(
        f"model: {network.describe()}, bunch {bunch}, link {_link(constants)}", fontsize="medium"
    )
    if measured:
        _draw_measured(axes[0][1], measured)
    for axis in axes[0]:
        axis.set_xlabel("workers P")
        axis.set_ylabel("MCUPS")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from None


def _link(constants: Constants) -> str:
    return f"{1e-6 / max(constants.link_seconds_per_byte, 1e-30):,.0f} MB/s"


def _draw_measured(axis: Any, measured: dict[str, Any]) -> None:
    """Model lines for the measured run's own scenario, and its measured points."""
    try:
        network = NetworkSpec.parse(str(measured["network"]))
        bunch = int(measured["bunch"])
        scale = float(measured.get("time_scale", 1.0))
        constants = Constants.from_dict(measured["constants"], "the measurement")
        rows = [
            (str(r["mode"]), int(r["workers"]), float(r["measured_mcups"]))
            for r in measured["rows"]
        ]
        # the model for the compute time the emulated workers really spent, where recorded
        adjusted = [
            (str(r["mode"]), int(r["workers"]), float(r["predicted_mcups"]))
            for r in measured["rows"]
            if "predicted_mcups" in r
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the scaling measurement lacks {exc}") from None
    top = max(p for _, p, _ in rows)
    counts = list(range(1, top + 1))
    for mode in sorted({m for m, _, _ in rows}):
        axis.plot(
            counts,
            _curve(network, bunch, constants, counts, "pattern", mode, scale),
            _STYLE.get(mode, "-"),
            color=_MEASURED_COLOUR.get(mode, "black"),
            label=f"model, {mode}",
        )
        for series, marker, what in (
            (rows, "o", "measured"),
            (adjusted, "x", "model for the compute time spent"),
        ):
            points = [(p, m) for row_mode, p, m in series if row_mode == mode]
            if points:
                axis.plot(
                    [p for p, _ in points],
                    [m for _, m in points],
                    marker,
                    color=_MEASURED_COLOUR.get(mode, "black"),
                    label=f"{what}, {mode}",
                )
    rate = constants.mcups / scale
    axis.set_title(
        f"measured: {network.describe()}, bunch {bunch}, workers emulating {rate:,.0f} MCUPS",
        fontsize="medium",
    )
