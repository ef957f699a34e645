"""`snet plan` and the modelled backend: the performance model beside what is measured.

Every expected number here is worked out by hand in the comments; nothing is timed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from snet.cli.main import main
from snet.client.backend import make_backend
from snet.client.modelled_backend import MODELLED_GRADIENT, ModelledBackend
from snet.perf.model import (
    DEFAULT_CONSTANTS,
    predict,
)
from snet.perf.plan import smallest_block
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.network import NetworkSpec

from hand_constants import HAND
from helpers import SMALL_JOB
from inprocess import Lab, wait_until
from output_checks import check_log_files

# ------------------------------------------------------------------ the modelled backend


def test_modelled_backend_sleeps_the_model_and_sends_a_tiny_constant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SNET_MODELLED_C1", "1e-7")
    monkeypatch.setenv("SNET_MODELLED_C2", "2e-6")
    monkeypatch.setenv("SNET_MODELLED_TIME_SCALE", "0.5")
    backend = make_backend("modelled")
    assert isinstance(backend, ModelledBackend)

    class Corpus:
        cv_frames = np.arange(7)

    backend.prepare(JobSpec(network=NetworkSpec.parse("117:300:10")), Corpus())  # type: ignore[arg-type]
    assert backend.bunch_seconds(4) == pytest.approx(0.5 * 4 * (1e-7 * 300 + 2e-6))
    out = np.ones(5, dtype=np.float32)
    assert backend.gradient(out, np.arange(4), out) == (0.0, 0)
    # every value overwritten; not zeros, which the server refuses as implausible
    np.testing.assert_array_equal(out, np.float32(MODELLED_GRADIENT * 4))
    report = backend.report()
    assert report is not None and report["bunches"] == 1 and report["patterns"] == 4
    assert report["real_seconds"] >= report["modelled_seconds"] > 0  # it sleeps to a deadline
    assert backend.evaluate(out) == (7, 0, 0.0)


def test_modelled_bunches_back_to_back_keep_the_models_pace_despite_late_wakeups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each sleep wakes 1 ms late (a busy core); a run of bunches still ends when the
    model says, plus the last one's lateness; after a pause the debt is forgotten."""
    from snet.client import modelled_backend

    clock = [100.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds + 1e-3

    monkeypatch.setattr(modelled_backend.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(modelled_backend.time, "sleep", sleep)
    backend = ModelledBackend(c1=0.0, c2=1e-3)  # 4 ms for a bunch of 4
    out = np.zeros(5, dtype=np.float32)
    for _ in range(10):
        backend.gradient(out, np.arange(4), out)
    assert clock[0] == pytest.approx(100.0 + 10 * 4e-3 + 1e-3)  # not 10 x 5 ms
    clock[0] += 1.0  # the worker waited: nothing computed meanwhile is owed
    began = clock[0]
    backend.gradient(out, np.arange(4), out)
    assert clock[0] - began == pytest.approx(5e-3)


def test_modelled_backend_refuses_bad_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNET_MODELLED_C1", "fast")
    with pytest.raises(ConfigError, match="SNET_MODELLED_C1 must be a number"):
        make_backend("modelled")
    monkeypatch.setenv("SNET_MODELLED_C1", "1e-9")
    monkeypatch.setenv("SNET_MODELLED_TIME_SCALE", "0")
    with pytest.raises(ConfigError, match="time scale must be > 0"):
        make_backend("modelled")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # slow: one loop (tests/README.md)
async def test_modelled_workers_train_and_report_through_the_server(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNET_MODELLED_CU_SECONDS", "1e-9")
    server = await lab.server("--mode", "async", "--epochs", "50", *SMALL_JOB)
    for name in ("m0", "m1"):  # a report every second, or every heartbeat if sooner
        lab.worker(server, name, "--backend", "modelled", "--heartbeat-seconds", "0.25")

    async def reported() -> list[dict]:
        rows = (await server.status())["workers"]
        reports = [row.get("report") or {} for row in rows]
        return rows if len(rows) == 2 and all(r.get("bunches", 0) > 2 for r in reports) else []

    rows = await wait_until(reported, 60, "reports from two modelled workers")
    assert {row["backend"] for row in rows} == {"modelled"}
    assert (await server.status())["patterns_processed"] > 0
    for row in rows:
        assert row["report"]["modelled_seconds"] > 0
        assert row["report"]["hidden_units"] == 64


# ------------------------------------------------------------------ snet plan


def test_plan_prints_every_strategy_mode_and_worker_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "plan",
            "--network",
            "351:1262:45",
            "--bunch",
            "1000",
            "--link-mbps",
            "1000",
            "--workers",
            "1,2,8",
            "--strategies",
            "pattern,network",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line[:3].strip() in ("1", "2", "8")]
    table = {(r[0], r[1], r[2]) for r in rows if r[1] in ("pattern", "network")}
    # sync and async for both strategies, bmuf's three modes pattern-parallel only
    assert len(table) == 3 * (2 * 2 + 3)
    assert {r[2] for r in rows if r[1] == "network"} == {"sync", "async"}
    assert "bmuf, blocks of 16 bunches, deltas in none" in out
    assert "link 125 MB/s" in out and "BSP exemplar parallelism" in out


def test_plan_says_where_blocks_pay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    constants = tmp_path / "constants.json"
    constants.write_text(json.dumps(DEFAULT_CONSTANTS.to_dict()))
    argv = ["plan", "--network", "39:500:42", "--link-mbps", "1000", "--workers", "5"]
    argv += ["--strategies", "pattern", "--constants", str(constants)]
    assert main([*argv, "--block-bunches", "64", "--compress", "int8"]) == 0
    out = capsys.readouterr().out
    assert "bmuf, blocks of 64 bunches, deltas in int8" in out
    gigabit = DEFAULT_CONSTANTS.with_link_mbps(1000)
    network = NetworkSpec.parse("39:500:42")
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["5", "bmuf"])
    block = predict(network, 1000, 5, gigabit, "pattern", "bmuf", block_bunches=64, codec="int8")
    assert float(row[2]) == pytest.approx(block.speedup, abs=0.005)
    assert row[-1] == str(smallest_block(network, 1000, 5, gigabit, "bmuf", 0.9, "int8"))


def test_plan_json_reads_constants_from_a_benchmark_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"scaling": {"constants": HAND.to_dict(), "rows": []}}))
    assert (
        main(
            [
                "plan",
                "--network",
                "2:3:1",
                "--bunch",
                "10",
                "--workers",
                "2",
                "--constants",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    sync = next(p for p in document["predictions"] if p["mode"] == "sync")
    assert sync["strategy"] == "pattern"
    assert (document["block_bunches"], document["codec"]) == (16, "none")
    modes = {"sync", "async", "bmuf", "bmuf-overlap", "bmuf-async"}
    assert {p["mode"] for p in document["predictions"]} == modes
    assert sync["round_seconds"] == pytest.approx(1.3e-4 + 1.00208e-4 + 2 * 2.00104e-4 + 3.0208e-6)


def test_a_worker_count_given_twice_is_one_row(capsys: pytest.CaptureFixture[str]) -> None:
    """`snet plan --workers 1,1,2` printed the rows of 1 worker twice."""
    assert main(["plan", "--workers", "1,1,2", "--modes", "async", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["predictions"]
    assert [row["workers"] for row in rows] == [1, 2]


def test_plan_refuses_bad_input_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for workers in ("1,two", "1,,2", "2,"):  # an empty part was passed over
        assert main(["plan", "--workers", workers]) == 2
        assert "--workers must be comma-separated whole numbers" in capsys.readouterr().err
    assert main(["plan", "--modes", "eventual"]) == 2
    modes = "sync, async, bmuf, bmuf-overlap, bmuf-async"
    assert f"--modes must be some of {modes}" in capsys.readouterr().err
    assert main(["plan", "--block-bunches", "0"]) == 2
    assert "--block-bunches must be >= 1" in capsys.readouterr().err
    # 0 was taken as "no --link-mbps given"; 1e-300 printed round times hundreds of digits long
    for speed in ("0", "-5", "nan", "inf", "1e-300", "1e10"):
        assert main(["plan", "--link-mbps", speed]) == 2, speed
        assert "--link-mbps must be a speed of 0.001 to 1e+09 Mbit/s" in capsys.readouterr().err
    assert main(["plan", "--bunch", str(10**20)]) == 2  # it planned 0 MCUPS
    assert f"--bunch must be 1 to 1,000,000,000, got {10**20}\n" in capsys.readouterr().err
    tiny = tmp_path / "tiny.json"  # a denormal compute time: MCUPS Infinity, JSON NaN
    from snet.perf.model import DEFAULT_CONSTANTS

    tiny.write_text(json.dumps({**DEFAULT_CONSTANTS.to_dict(), "cu_seconds": 1e-320}))
    assert main(["plan", "--constants", str(tiny), "--json"]) == 2
    assert "constant cu_seconds must be at least 1e-15" in capsys.readouterr().err
    assert main(["plan", "--compress", "topk:0.1"]) == 2
    assert "fixed size" in capsys.readouterr().err
    # a codec in any case, as a job's setting takes it (FP16 was an unknown codec)
    assert main(["plan", "--compress", "FP16", "--workers", "2", "--json"]) == 0
    capsys.readouterr()
    for strategies in ("network", "pattern,network"):  # np mode refuses it: no np rows
        assert main(["plan", "--strategies", strategies, "--network", "117:64:32:10"]) == 2
        assert "np mode trains networks with one hidden layer" in capsys.readouterr().err
    assert main(["plan", "--network", "117:64:32:10"]) == 0  # pattern-parallel trains it
    capsys.readouterr()
    (tmp_path / "c.json").write_text("{}")
    assert main(["plan", "--constants", str(tmp_path / "c.json")]) == 2
    assert "no performance-model constants" in capsys.readouterr().err
    # choices with no row at all (an empty table, exit 0, before)
    assert main(["plan", "--strategies", "network", "--modes", "bmuf,bmuf-async"]) == 2
    assert "--strategies network has no bmuf, bmuf-async rows" in capsys.readouterr().err


def test_plan_refuses_a_setting_no_row_of_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    """As a job refuses a setting its mode would ignore: --block-bunches without a bmuf
    row, --compress with np mode's rows alone, had printed a table they changed nothing in."""
    assert main(["plan", "--modes", "sync,async", "--block-bunches", "8"]) == 2
    assert capsys.readouterr().err == (
        "snet: --block-bunches 8 applies to bmuf mode only, and this plan's rows are of sync "
        "mode and async mode (--strategies pattern, --modes sync,async): it would change none "
        "of them\n"
    )
    assert main(["plan", "--strategies", "network", "--modes", "sync", "--compress", "int8"]) == 2
    assert capsys.readouterr().err == (
        "snet: --compress int8 applies to sync mode, async mode and bmuf mode only, and this "
        "plan's rows are of np mode (--strategies network, --modes sync): it would change none "
        "of them\n"
    )
    # a row that reads it is enough; at its default it is no choice at all
    for argv in (
        ["--modes", "sync,bmuf-async", "--block-bunches", "8"],
        ["--strategies", "pattern,network", "--modes", "sync", "--compress", "int8"],
        ["--modes", "sync", "--block-bunches", "16", "--compress", "none"],
        # bmuf-overlap's rows are bmuf's (a traceback, and a false refusal beside np's rows)
        ["--modes", "bmuf-overlap", "--compress", "int8", "--block-bunches", "64"],
        ["--strategies", "pattern,network", "--modes", "bmuf-overlap", "--compress", "int8"],
    ):
        assert main(["plan", "--network", "117:64:10", "--workers", "2", *argv]) == 0, argv
        assert "snet:" not in capsys.readouterr().err


def test_plan_png_needs_matplotlib_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    assert main(["plan", "--png", str(tmp_path / "plan.png")]) == 2
    assert "--png needs matplotlib, which is not installed" in capsys.readouterr().err
    assert not (tmp_path / "plan.png").exists()


def test_plan_draws_model_against_measurement(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    measured = {
        "network": "351:1262:45",
        "bunch": 1000,
        "time_scale": 1.0,
        "constants": DEFAULT_CONSTANTS.to_dict(),
        "rows": [{"mode": "async", "workers": p, "measured_mcups": 7000.0 * p} for p in (1, 2)],
    }
    (tmp_path / "scaling.json").write_text(json.dumps(measured))
    png = tmp_path / "plan.png"
    assert (
        main(
            [
                "plan",
                "--workers",
                "1,2,4",
                "--measured",
                str(tmp_path / "scaling.json"),
                "--png",
                str(png),
            ]
        )
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(png.stat().st_size) and png.stat().st_size > 10_000


@pytest.mark.system
def test_scaling_benchmark_sets_measurement_beside_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.processes import LocalCluster
    from bench.scaling import run_scaling

    stop = LocalCluster.close

    def close_and_check(cluster: LocalCluster) -> None:
        """Its processes' logs are scanned for tracebacks once they have stopped (before
        the benchmark's temporary directory goes)."""
        stop(cluster)
        check_log_files(cluster.directory)

    monkeypatch.setattr(LocalCluster, "close", close_and_check)

    result = run_scaling(
        workers=(1, 2),
        seconds=1.0,
        network="13:8:3",
        bunch=100,
        modes=("async",),
        constants=DEFAULT_CONSTANTS,
        workdir=str(tmp_path),
        repeats=1,
        frames=40_000,
    )
    json.dumps(result)  # JSON-able, for snet bench
    assert [row["workers"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["measured_mcups"] > 0 and row["predicted_mcups"] > 0
        ratio = row["measured_mcups"] / row["predicted_mcups"]
        assert row["measured_over_predicted"] == pytest.approx(ratio, rel=0.02)  # both rounded
    assert result["constants"] == DEFAULT_CONSTANTS.to_dict()
