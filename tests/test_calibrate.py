"""bench/calibrate.py's arithmetic: constants recovered from the runs' figures (no
benchmark runs; the short training runs are replaced by figures worked out by hand)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import calibrate
from bench.calibrate import RoundCosts, measure_snet_rounds
from snet.protocol.network import NetworkSpec

NETWORK = NetworkSpec.parse("351:1262:45")
# The constants the fake runs are made of: per byte at the server, per byte at the worker,
# per message at the server, latency per message, adding an update, a step per byte and
# a step's fixed cost.
T_S, T_W, T_M, T_L, APPLY, STEP, FIX = 2e-10, 3e-10, 1e-4, 1.2e-4, 3e-11, 6e-10, 2.5e-4


def _fake_round(directory: Path, network: NetworkSpec, bunch: int, workers: int) -> RoundCosts:
    """A sync round of ``workers`` compute-free workers as the model says it costs: the
    server P T_d + T_h, the one worker its end of the two messages, the wall time both
    and the latencies."""
    element = network.connections * 4
    server = workers * (2 * (element * T_S + T_M) + element * APPLY) + element * STEP + FIX
    worker_cpu = 2 * element * T_W + 5e-5  # its end of the bytes, and its own loop
    return RoundCosts(server + 2 * (element * T_W + T_L), server, workers * worker_cpu)


def test_the_runs_are_split_into_the_model_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate, "_sync_rounds", _fake_round)
    costs = measure_snet_rounds(NETWORK, 1000, APPLY)
    # The one-unit network's 16-byte element leaves errors of about 1e-5.
    assert costs.server_per_byte == pytest.approx(T_S, rel=1e-3)
    assert costs.worker_per_byte == pytest.approx(T_W, rel=1e-3)
    assert costs.server_per_message == pytest.approx(T_M, rel=1e-3)
    assert costs.latency_per_message == pytest.approx(T_L, rel=1e-3)
    assert costs.step_per_byte == pytest.approx(STEP, rel=1e-3)
    assert costs.step_fixed == pytest.approx(FIX, rel=1e-3)


def _fake_training(steps: int, cpu: float | None) -> Any:
    def train(*args: object) -> dict[str, Any]:
        return {"best": 5000.0, "steps": steps, "server_cpu_seconds": cpu,
                "workers_cpu_seconds": cpu}  # fmt: skip

    return train


def _no_corpus(path: Path, network: NetworkSpec, frames: int) -> tuple[Path, int]:
    return path, 0


def test_a_run_without_steps_or_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(calibrate, "synthetic_corpus", _no_corpus)
    monkeypatch.setattr(calibrate, "train_modelled", _fake_training(0, 1.0))
    with pytest.raises(RuntimeError, match=r"2 worker\(s\) on 351:1262:45 took no step"):
        calibrate._sync_rounds(tmp_path, NETWORK, 1000, 2)
    monkeypatch.setattr(calibrate, "train_modelled", _fake_training(10, 1.0))
    # 2 x 1000 patterns at 5000 a second: 0.4 s a round; 1 s of CPU over 10 steps
    assert calibrate._sync_rounds(tmp_path, NETWORK, 1000, 2) == RoundCosts(0.4, 0.1, 0.1)
    monkeypatch.setattr(calibrate, "train_modelled", _fake_training(10, None))
    assert calibrate._sync_rounds(tmp_path, NETWORK, 1000, 2) == RoundCosts(0.4, 0.2, 0.2)
