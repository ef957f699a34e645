"""The benchmarks' command lines refuse a bad value in argparse's one line and exit 2
before anything starts, and print their figures before writing them to ``--json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import suite, time_to_accuracy, update_cost
from bench.arguments import emit


@pytest.mark.parametrize(
    ("main", "argv", "said"),
    [
        (time_to_accuracy.main, ["--repeats", "0"], "--repeats: must be at least 1, got 0"),
        (time_to_accuracy.main, ["--repeats", "-1"], "must be at least 1, got -1"),
        (time_to_accuracy.main, ["--modes", "foo,,async"], "--modes 'foo,,async': each of"),
        (time_to_accuracy.main, ["--modes", "async,async"], "at most once"),
        (time_to_accuracy.main, ["--target", "90"], "--target 90: a CV accuracy above 0"),
        (time_to_accuracy.main, ["--json", "/nonexistent/t.json"], "/nonexistent is not a dir"),
        (time_to_accuracy.main, ["--baseline", "/nonexistent"], "no checkout at /nonexistent"),
        (update_cost.main, ["--seconds", "-1"], "--seconds: must be above 0, got -1"),
        (update_cost.main, ["--seconds", "nan"], "must be above 0, got nan"),
        (update_cost.main, ["--elements", "1GB"], "unknown element(s) 1GB"),
        (update_cost.main, ["--json", "/"], "/ is a directory"),
        (update_cost.main, ["--baseline", "/tmp"], "no checkout at /tmp (no src/snet)"),
        (suite.parser().parse_args, ["--baseline", "/tmp"], "no checkout at /tmp"),
    ],
)
def test_a_bad_value_is_one_line_before_anything_runs(
    main: object, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)  # type: ignore[operator]
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_figures_are_printed_before_they_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emit('{"speed": 1.0}', tmp_path / "r.json")
    assert (tmp_path / "r.json").read_text() == '{"speed": 1.0}\n'
    with pytest.raises(OSError):  # the run's figures are on stdout all the same
        emit('{"speed": 2.0}', tmp_path / "gone" / "r.json")
    assert capsys.readouterr().out == '{"speed": 1.0}\n{"speed": 2.0}\n'


def test_an_elements_two_runs_of_one_code_are_averaged() -> None:
    """With a baseline each code runs twice (baseline, this, this, baseline: the second of
    two runs back to back measured 6-12 % slower, whichever code it was); its row is the
    mean, and a figure one run lacks (an older code's latency) stays as it was."""
    runs = [
        {"element": "262kB", "code": "this", "updates_per_s": 1400.0, "latency_ms": None},
        {"element": "262kB", "code": "this", "updates_per_s": 1300.0, "latency_ms": 2.0},
    ]
    row = update_cost._mean_row(runs)
    assert row == {"element": "262kB", "code": "this", "updates_per_s": 1350.0,
                   "latency_ms": None}  # fmt: skip


def test_the_averaged_rows_overhead_is_that_of_its_means() -> None:
    """(0.2 + 0.2) / 0.1 and (0.4 + 0.4) / 0.4, two runs: the mean of the ratios is 3.0,
    the ratio of the means 2.4 (the figures a reader multiplies back)."""
    runs = [
        {"server_loop_ms": 0.2, "server_step_ms": 0.0, "worker_loop_ms": 0.2,
         "worker_compute_ms": 0.1, "overhead_over_compute": 4.0},
        {"server_loop_ms": 0.4, "server_step_ms": 0.0, "worker_loop_ms": 0.4,
         "worker_compute_ms": 0.4, "overhead_over_compute": 2.0},
    ]  # fmt: skip
    assert update_cost._mean_row(runs)["overhead_over_compute"] == 2.4


def test_vary_seed_runs_each_repeat_at_its_own_seed_for_every_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paired: ``snet train`` and the demo of repeat r at job seed 1 + r; without the flag
    no ``--seed`` (the default job, as every earlier result)."""
    launched: list[list[str]] = []

    def timed(args: list[str], env: object, cpu: list[float]) -> tuple[list[object], str]:
        launched.append(args)
        cpu += [1.0, 2.0]
        return [(1.0, 0.95)], ""

    monkeypatch.setattr(time_to_accuracy, "timed_epochs", timed)
    monkeypatch.setattr(time_to_accuracy, "compiled", lambda package: None)
    result = time_to_accuracy.run_accuracy_bench(2, modes=("async",), vary_seed=True)
    seeds = {(args[0], args[args.index("--seed") + 1]) for args in launched}
    assert seeds == {("train", "1"), ("demo", "1"), ("train", "2"), ("demo", "2")}
    assert len(launched) == 4 and result["seeds"] == [1, 2]
    assert result["modes"]["async"]["speed_ratios"] == [1.0, 1.0]
    launched.clear()
    assert time_to_accuracy.run_accuracy_bench(1, modes=("async",))["seeds"] is None
    assert len(launched) == 2 and not any("--seed" in args for args in launched)
