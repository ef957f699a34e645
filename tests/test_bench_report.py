"""``snet bench``'s report: the worker targets and partial reruns (no benchmarks run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import suite as bench
from bench.report import render_markdown


def worker_row(bunch: int, **figures: float) -> dict[str, Any]:
    """A row of ``snet bench``'s worker section: MCUPS of the named figures."""
    row: dict[str, Any] = {"network": "351:1262:45", "bunch": bunch, "threads": 1}
    return row | figures


def figures(numpy: float, torch: float, autograd: float, hand: float) -> dict[str, float]:
    """Both backends, PyTorch's steps, and GEMM ceilings of 1.1x numpy and 1.2x torch."""
    return {
        "numpy": numpy,
        "gemm_ceiling_numpy": round(numpy * 1.1, 1),
        "torch_backend": torch,
        "gemm_ceiling_torch": round(torch * 1.2, 1),
        "torch_autograd": autograd,
        "torch_hand": hand,
    }


def target_rows(markdown: str, labelled: str = "worker vs") -> dict[str, list[str]]:
    """The targets table's rows whose label holds ``labelled``: label -> the other cells."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and labelled in cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_ceiling_target_is_met_by_either_backend_against_its_own_blas() -> None:
    # torch is faster (MCUPS) but further from MKL's ceiling; numpy is within 10% of its own
    row = worker_row(1000, **figures(27000.0, 30000.0, 28000.0, 29000.0))
    rows = target_rows(render_markdown({"worker": [row]}))
    assert rows["worker vs the GEMM ceiling (bunch 1000, numpy)"] == ["0.909", ">= 0.9", "True"]
    assert rows["worker vs PyTorch at its best (bunch 1000)"] == ["1.034", ">= 1.0", "True"]


def test_ratios_are_not_rounded_up_into_a_target() -> None:
    row = worker_row(1000, numpy=8960.0, gemm_ceiling_numpy=10000.0)
    rows = target_rows(render_markdown({"worker": [row]}))
    assert rows["worker vs the GEMM ceiling (bunch 1000, numpy)"] == ["0.896", ">= 0.9", "False"]


def test_small_bunch_target_above_the_gemm_ceiling_is_said_so() -> None:
    row = worker_row(12, **figures(10000.0, 13500.0, 8500.0, 15000.0))
    markdown = render_markdown({"worker": [row]})
    assert "1.5x PyTorch's hand-written step (22500 MCUPS) is above the GEMM ceiling" in markdown
    assert "(16200 MCUPS" in markdown and "torch_backend) does 13500 MCUPS, 0.83" in markdown
    rows = target_rows(markdown)
    assert rows["worker vs PyTorch (torch_autograd, bunch 12)"][0] == "1.588"
    row["torch_hand"] = 10000.0  # 1.5x of it is within the ceiling: nothing to explain
    assert "is above the GEMM ceiling" not in render_markdown({"worker": [row]})


def test_a_partial_rerun_keeps_the_other_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, markdown = tmp_path / "b.json", tmp_path / "b.md"
    old_round = {"element_mb": 2.0, "snet_rounds_per_s": 1, "gloo_allreduce_per_s": 2, "ratio": 0.5}
    path.write_text(json.dumps({"when": "earlier", "round": old_round, "worker": []}))
    fresh = [worker_row(1000, numpy=1.0, gemm_ceiling_numpy=2.0)]
    monkeypatch.setattr(bench, "_worker_rows", lambda quick: fresh)
    args = argparse.Namespace(
        only="worker", quick=True, seconds=1.0, json=str(path), markdown=str(markdown)
    )
    assert bench.run_bench(args) == 0
    merged = json.loads(path.read_text())
    assert merged["round"] == old_round and merged["worker"] == fresh
    assert merged["when"] == "earlier" and merged["worker_when"] != "earlier"
    text = markdown.read_text()
    assert "## Synchronous round" in text and f"at {merged['worker_when']}" in text


def test_two_thread_rows_slower_than_one_thread_ceilings_are_flagged() -> None:
    rows = [
        worker_row(1000, **figures(27000.0, 30000.0, 28000.0, 29000.0)),
        worker_row(1000, **figures(900.0, 800.0, 700.0, 600.0)) | {"threads": 2},
        worker_row(12, **figures(9000.0, 12000.0, 8000.0, 14000.0)),
        worker_row(12, **figures(15000.0, 20000.0, 9000.0, 20000.0)) | {"threads": 2},
    ]
    markdown = render_markdown({"worker": rows})
    assert "below half its 1-thread value (351:1262:45 bunch 1000) were measured" in markdown


def server_row(
    clients: int, ratio: float, snet_ms: list[float | None], bound: float | None
) -> dict[str, Any]:
    """A row of ``snet bench``'s server section for 2 MB elements."""
    return {
        "element": "2MB", "network": "351:1262:45", "clients": clients,
        "snet_elements_per_s": 1000.0, "steps_per_pass": 3.5, "snet_gb_per_s": 2.0,
        "plain_gb_per_s": 2.0 / ratio, "ratio": ratio, "snet_cpu_ms": snet_ms,
        "plain_cpu_ms": [0.25, 0.25], "cpu_bound_ratio": bound,
    }  # fmt: skip


def test_the_server_cpu_cost_bounds_its_ratio_and_is_said_so() -> None:
    rows = [server_row(1, 0.4, [1.1, 0.35], 0.5), server_row(4, 0.22, [1.15, 0.45], 0.3)]
    markdown = render_markdown({"server": rows})
    assert "| 1.10 + 0.35 | 0.25 + 0.25 | 0.5 |" in markdown  # the table's CPU columns
    assert "1 client(s): 1.45 ms (server 1.10) against 0.50 ms, at most 0.50 of" in markdown
    assert "4 client(s): 1.60 ms (server 1.15) against 0.50 ms, at most 0.30" in markdown
    # Cores enough for 0.75 at snet's cost: the shortfall is not the machine's, no note.
    fine = render_markdown({"server": [server_row(1, 0.4, [0.3, 0.2], 0.9)]})
    targets = fine.split("## Server throughput")[0]
    assert "1 client(s), vs recv_into | 0.4 |" in targets and "could carry" not in targets
    # Without /proc the server's CPU is unknown: no bound, no note, the table still drawn.
    unknown = server_row(1, 0.4, [None, 0.35], None)
    blind = render_markdown({"server": [unknown]})
    assert "could carry" not in blind.split("## Server throughput")[0]
    assert "| 0.4 | - | 0.25 + 0.25 | - |" in blind


def test_a_section_rerun_on_its_own_says_when() -> None:
    row = server_row(1, 0.4, [1.1, 0.35], 0.5)
    markdown = render_markdown({"when": "T0", "server": [row], "server_when": "T1"})
    assert "Rerun on its own (`snet bench --only server`) at T1. Clients push" in markdown
    assert "Rerun on its own" not in render_markdown({"when": "T0", "server": [row]})


def test_update_and_accuracy_sections_render_with_their_targets() -> None:
    update = {"element": "262kB", "code": "this", "network": "117:512:10", "updates_per_s": 900.0,
              "worker_compute_ms": 0.4, "worker_loop_ms": 0.3, "server_loop_ms": 0.25,
              "server_step_ms": 0.1, "overhead_over_compute": 1.62, "latency_ms": None}  # fmt: skip
    accuracy = {
        "target_cv": 0.9, "repeats": 1, "train_to_target_s": 3.0, "train_first_epoch_s": 1.0,
        "modes": {
            "async": {"to_target_s": 4.0, "speed_ratio": 0.75, "first_epoch_ratio": 1.4,
                      "reached": "1/1", "speed_ratios": [0.7, 0.75, 1.02]},
            "bmuf": {"to_target_s": 2.0, "speed_ratio": 1.5, "first_epoch_ratio": 1.6,
                     "reached": "1/1"},
        },
    }  # fmt: skip
    markdown = render_markdown({"update": [update], "accuracy": accuracy})
    assert "| 262kB | this | 117:512:10 | 900.0 | 0.4 | 0.3 | 0.25 | 0.1 | 1.62 | - |" in markdown
    rows = target_rows(markdown, "2 workers")
    assert rows["async, 2 workers: time to CV target, snet train / demo"] == [
        "0.75", ">= 1.0", "False"]  # fmt: skip
    assert rows["async, 2 workers: first epoch's end, demo / snet train"] == [
        "1.4", "<= 1.5", "True"]  # fmt: skip
    assert rows["bmuf, 2 workers: first epoch's end, demo / snet train"][2] == "False"
    assert rows["bmuf, 2 workers: time to CV target, snet train / demo"] == [
        "1.5", ">= 1.5", "True"]  # fmt: skip
    # each repeat's speed beside the median: how often a run was slower (none kept: "-")
    assert "| async | 4.0 | 0.75 | 0.7-1.02 (1/3) | 1.4 | 1/1 |" in markdown
    assert "| bmuf | 2.0 | 1.5 | - | 1.6 | 1/1 |" in markdown


def test_time_to_accuracy_at_other_seeds_gets_its_own_table_and_targets() -> None:
    """The default job's ``snet train`` is one fixed run: the paired seeds say how the demo
    does against it in general, in a table of their own and targets of their own."""
    seeds = {
        "target_cv": 0.9, "repeats": 2, "seeds": [1, 2], "train_to_target_s": 1.5,
        "runs": [{"train": {"epochs_to_target": 5}}, {"train": {"epochs_to_target": None}}],
        "modes": {
            "async": {"to_target_s": 1.8, "speed_ratio": 0.84, "first_epoch_ratio": 1.2,
                      "reached": "2/2", "speed_ratios": [0.8, 1.1]},
            "bmuf": {"to_target_s": 1.1, "speed_ratio": 1.42, "first_epoch_ratio": 0.9,
                     "reached": "2/2", "speed_ratios": [1.3, 1.5]},
        },
    }  # fmt: skip
    default = {"target_cv": 0.9, "repeats": 1, "seeds": None, "modes": {
        "async": {"to_target_s": 1.5, "speed_ratio": 1.04, "first_epoch_ratio": 1.2,
                  "reached": "1/1", "speed_ratios": [1.04]}}}  # fmt: skip
    markdown = render_markdown({"accuracy": {**default, "across_seeds": seeds}})
    rows = target_rows(markdown, "2 workers")
    assert rows["async, 2 workers: time to CV target, snet train / demo"] == [
        "1.04", ">= 1.0", "True"]  # fmt: skip
    assert rows["async, 2 workers, seeds 1-2: time to CV target, snet train / demo"] == [
        "0.84", ">= 1.0", "False"]  # fmt: skip
    assert rows["bmuf, 2 workers, seeds 1-2: time to CV target, snet train / demo"] == [
        "1.42", ">= 1.5", "False"]  # fmt: skip
    section = markdown[markdown.index("## Time to accuracy") :]
    at_seeds = section[section.index("**At other seeds.**") :]
    assert "| async | 1.5 | 1.04 | 1.04-1.04 (1/1) |" in section.split("**At other")[0]
    assert "| async | 1.8 | 0.84 | 0.8-1.1 (1/2) | 1.2 | 2/2 |" in at_seeds
    assert "| bmuf | 1.1 | 1.42 | 1.3-1.5 (2/2) | 0.9 | 2/2 |" in at_seeds
    assert at_seeds.count("| mode | seconds to target |") == 1  # its own header
    assert "took 1.5 s to the target at the median, and 5, - epochs to it" in at_seeds
    # without the sweep (results of earlier runs), neither the paragraph nor its targets
    plain = render_markdown({"accuracy": default})
    assert "At other seeds" not in plain and "seeds 1-" not in plain


def test_small_bunch_targets_take_the_fastest_backend_against_its_own_ceiling() -> None:
    default_job = {"network": "117:512:10", "bunch": 128, "threads": 1}
    default_job |= {"numpy": 17000.0, "numba": 22000.0, "gemm_ceiling_numpy": 24000.0}
    small = {"network": "39:500:42", "bunch": 12, "threads": 1, "numpy": 6000.0}
    small |= {"gemm_ceiling_numpy": 14000.0}  # numba not installed: numpy alone
    markdown = render_markdown({"worker": [default_job, small]})
    rows = target_rows(markdown)
    assert rows["worker vs the GEMM ceiling (bunch 128, 117:512:10, numba)"] == [
        "0.917",
        ">= 0.85",
        "True",
    ]
    assert rows["worker vs the GEMM ceiling (bunch 12, 39:500:42, numpy)"] == [
        "0.429",
        ">= 0.85",
        "False",
    ]
    assert "| 117:512:10 | 128 | 1 | 17000.0 | 22000.0 | - | 0.71 | 0.92 |" in markdown
