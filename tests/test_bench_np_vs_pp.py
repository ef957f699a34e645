"""bench/np_vs_pp's and np_vs_pp_boards' model side and reports, without the runs (they
take minutes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bench.np_vs_pp import crossover, hidden_layer, model_row, round_compute, strategy_phases
from bench.np_vs_pp_boards import board_constants, busy_per_bunch, host_seconds
from bench.np_vs_pp_boards import model_row as board_row
from bench.np_vs_pp_boards import table as board_table
from bench.np_vs_pp_report import table
from snet.perf.model import (
    DEFAULT_CONSTANTS,
    network_parallel_phases,
    predict,
)
from snet.protocol.network import NetworkSpec

SPEC = NetworkSpec.parse("351:1262:45")


def _measured(mcups: float, seconds_per_bunch: float) -> dict[str, Any]:
    return {"mcups": mcups, "worker_seconds_per_bunch": seconds_per_bunch,
            "mean_worker_seconds_per_bunch": seconds_per_bunch,
            "runs": [mcups], "loads": [1.0]}  # fmt: skip


def test_the_model_is_given_the_compute_the_workers_spent() -> None:
    quiet = predict(SPEC, 128, 2, DEFAULT_CONSTANTS, "network", "sync")
    row = model_row("network", 2, SPEC, 128, DEFAULT_CONSTANTS,
                    _measured(1000.0, 2 * quiet.phases.compute))  # fmt: skip
    assert row["compute_over_quiet"] == 2.0
    slower = predict(SPEC, 128, 2, DEFAULT_CONSTANTS, "network", "sync", 2.0)
    assert row["predicted_mcups"] == round(slower.mcups, 1)
    assert row["predicted_mcups_quiet"] == round(quiet.mcups, 1)
    assert row["measured_over_predicted"] == round(1000.0 / slower.mcups, 3)


def test_np_holders_beyond_the_cores_wait_for_one_and_pp_counts_its_own_waits() -> None:
    measured = {"worker_seconds_per_bunch": 0.0014, "mean_worker_seconds_per_bunch": 0.001}
    assert round_compute("network", 4, measured, 2) == pytest.approx(0.002)  # 4 x 1 ms / 2
    assert round_compute("network", 2, measured, 2) == 0.0014  # the slowest, a core each
    assert round_compute("network", 4, measured, None) == 0.0014  # cores not given
    assert round_compute("pattern", 4, measured, 2) == 0.0014  # its clocks hold the waits
    row = model_row("network", 4, SPEC, 128, DEFAULT_CONSTANTS, _measured(1000.0, 0.0014)
                    | {"mean_worker_seconds_per_bunch": 0.001}, cores=2)  # fmt: skip
    assert row["compute_seconds_per_bunch"] == 0.002


def test_the_crossover_is_where_np_first_wins() -> None:
    sizes = [16, 64, 256, 1024, 4096]
    found = crossover(DEFAULT_CONSTANTS, SPEC, 128, 4, sizes)
    assert found in sizes

    def np_wins(size: int) -> bool:
        spec = hidden_layer(SPEC, size)
        return (predict(spec, 128, 4, DEFAULT_CONSTANTS, "network", "sync").mcups
                > predict(spec, 128, 4, DEFAULT_CONSTANTS, "pattern", "sync").mcups)  # fmt: skip

    assert found is not None and np_wins(found)
    assert not any(np_wins(size) for size in sizes if size < found)


def test_the_report_lists_every_point_and_counts_those_within_15_percent() -> None:
    rows = []
    for strategy, ratio in (("network", 1.1), ("pattern", 0.5)):
        row = model_row(strategy, 1, SPEC, 128, DEFAULT_CONSTANTS, _measured(5000.0, 0.004))
        row["network"], row["measured_over_predicted"] = SPEC.describe(), ratio
        rows.append(row)
    result = {"network": SPEC.describe(), "bunch": 128, "cores": 2, "repeats": 1,
              "seconds_per_point": 5.0, "rows": rows, "hidden_sweep": [],
              "constants": DEFAULT_CONSTANTS.to_dict(), "worst_model_error": 0.5,
              "crossover_hidden_units_p2": 272, "crossover_hidden_units_p4": 864,
              "crossover_bunch_p4_np_faster_up_to": None}  # fmt: skip
    text = table(result)
    assert text.count("| np | 1 |") == 1 and text.count("| pp (sync) | 1 |") == 1
    assert "1 of 2 points within 15 % of the model; worst 50 %" in text
    assert "from 272 hidden units at P = 2" in text and "at no bunch from 8 to 8192" in text


def _status(boards: dict[str, tuple[int, float, float]]) -> dict[str, Any]:
    """A /status with one row per board (patterns trained, busy s, behind s) and a numpy
    worker, which has no board report."""
    rows: list[dict[str, Any]] = [{"name": "numpy", "report": None}]
    for name, (patterns, busy, behind) in boards.items():
        report = {"board": "spert-ii (emulated)", "patterns_trained": patterns,
                  "modelled_busy_s": busy, "behind_s": behind}  # fmt: skip
        rows.append({"name": name, "report": report})
    return {"workers": rows}


def test_a_np_round_waits_for_its_slowest_board_and_pp_takes_the_mean() -> None:
    first = _status({"b0": (1280, 10.0, 0.0), "b1": (1280, 10.0, 0.5), "idle": (0, 0.0, 0.0)})
    last = _status({"b0": (2560, 13.0, 0.0), "b1": (2560, 15.0, 0.75), "idle": (0, 0.0, 0.0)})
    assert busy_per_bunch(first, last, 128, "network") == (0.5, 0.25)  # 5 s over 10 bunches
    assert busy_per_bunch(first, last, 128, "pattern") == (0.4, 0.25)  # (0.3 + 0.5) / 2
    with pytest.raises(RuntimeError, match="no board trained"):
        busy_per_bunch(first, first, 128, "network")


def test_board_points_are_in_board_time_beside_the_model_given_their_busy_time() -> None:
    scale, busy = 10.0, 0.6
    runs = [{"patterns_per_s": p, "busy": busy, "behind": 0.0, "load": 1.0}
            for p in (2000.0, 2100.0, 1900.0)]  # fmt: skip
    row = board_row("network", 1, SPEC, 128, scale, DEFAULT_CONSTANTS, runs)
    real = SPEC.connections * 2000.0 / 1e6  # the median run, real time
    assert row["board_mcups"] == round(real / scale, 2)
    phases = network_parallel_phases(SPEC, 128, 1, DEFAULT_CONSTANTS)
    model = predict(SPEC, 128, 1, DEFAULT_CONSTANTS, "network", "sync",
                    busy / scale / phases.compute)  # fmt: skip
    assert row["model_board_mcups"] == round(model.mcups / scale, 2)
    assert row["measured_over_model"] == round(real / model.mcups, 3)
    assert row["of_one_board_raw"] == round(real / scale / 115.0, 3)
    result = {"network": SPEC.describe(), "bunch": 128, "time_scale": scale, "cores": 2,
              "repeats": 3, "seconds_per_point": 5.0, "rows": [row],
              "host_seconds": {"network": 0.005, "pattern": 0.0095},
              "worst_model_error": abs(row["measured_over_model"] - 1)}  # fmt: skip
    text = board_table(result)
    assert "| np | 1 |" in text and "MCUPS in board time" in text
    assert "5.0 ms a round in np, 9.5 ms in pp" in text


@pytest.mark.parametrize("strategy", ["network", "pattern"])
def test_a_boards_host_side_is_what_one_board_adds_to_the_models_round(strategy: str) -> None:
    """Measured with one board alone, added to the worker's end of every round: the model's
    round of that one board is then the round measured."""
    scale, busy, host = 10.0, 0.6, 0.005
    phases = strategy_phases(strategy, SPEC, 128, 1, DEFAULT_CONSTANTS)
    measured_round = busy / scale + phases.latency + phases.transfer + phases.host + host
    alone = {"patterns_per_s": 128 / measured_round, "busy": busy}
    found = host_seconds(strategy, SPEC, 128, scale, DEFAULT_CONSTANTS, alone)
    assert found == pytest.approx(host)
    constants = board_constants(DEFAULT_CONSTANTS, strategy, found)
    modelled = predict(SPEC, 128, 1, constants, strategy, "sync",
                       busy / scale / phases.compute)  # fmt: skip
    assert modelled.round_seconds == pytest.approx(measured_round)
    assert (
        host_seconds(
            strategy, SPEC, 128, scale, DEFAULT_CONSTANTS, {"patterns_per_s": 1e9, "busy": busy}
        )
        == 0.0
    )  # never below nothing


def test_a_boards_host_side_reaches_the_np_round_without_nps_own_constants() -> None:
    """Without np's own constants the np round is built from the pattern-parallel ones:
    the host side goes there, not into np's unused latency."""
    plain = replace(DEFAULT_CONSTANTS, np_worker_seconds=0.0)
    before = strategy_phases("network", SPEC, 128, 1, plain)
    after = strategy_phases("network", SPEC, 128, 1, board_constants(plain, "network", 0.005))
    assert after.latency == pytest.approx(before.latency + 0.005)
