"""bench/np_vs_pp's model side and report, without the runs (they take minutes)."""

from __future__ import annotations

from typing import Any

from bench.np_vs_pp import crossover, hidden_layer, model_row
from bench.np_vs_pp_report import table
from snet.perf.model import DEFAULT_CONSTANTS, predict
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
