"""bench/chaos_reading.py: where a server kill's seconds went, read from the server's log (no
benchmark run)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from bench.chaos_reading import kill_phases, server_log_times, worker_rejoin_seconds

LOG = """\
2026-11-23 15:41:21,974 INFO    snet.server: event loop: uvloop
2026-11-23 15:41:22,368 INFO    snet.server: serving snet (async mode, ...) on 127.0.0.1:1
2026-11-23 15:41:28,928 INFO    snet.server: worker w2 (numpy, 127.0.0.1:51666) joined
2026-11-23 15:41:33,899 INFO    snet.server: epoch 3 done at version 528: train accuracy 89.72%
2026-11-23 15:41:36,119 INFO    snet.server: event loop: uvloop
2026-11-23 15:41:36,769 INFO    snet.server: resumed from ckpt-00000008.snet: version 532
2026-11-23 15:41:36,772 INFO    snet.server: serving snet (async mode, ...) on 127.0.0.1:1
2026-11-23 15:41:37,581 INFO    snet.server: worker w0 (numpy, 127.0.0.1:53162) joined
2026-11-23 15:41:38,223 INFO    snet.server: worker w2 (numpy, 127.0.0.1:53174) joined
"""


def at(clock: str) -> float:
    return datetime.strptime(f"2026-11-23 {clock}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def test_a_kill_splits_into_start_state_rejoin_and_first_step(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG)
    starts = server_log_times(log)
    assert len(starts) == 2 and len(starts[1]["joined"]) == 2
    kill = {"killed_at": at("15:41:34.119"), "first_step_at": at("15:41:37.781")}
    phases = kill_phases(kill, starts[1])
    assert phases == pytest.approx(
        {"start_and_imports": 2.0, "state_load": 0.653, "first_worker_rejoins": 0.809,
         "first_step": 0.2}, abs=1e-3)  # fmt: skip
    assert sum(phases.values()) == pytest.approx(3.662, abs=1e-3)  # the kill to the step
    assert kill == {}  # the wall times are taken out of the kill's record


def test_a_worker_kill_lasts_until_that_worker_joins_again(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG)
    kills = [(at("15:41:28.000"), "w2"), (at("15:41:37.000"), "w2"), (at("15:41:38.000"), "w1")]
    assert worker_rejoin_seconds(log, kills) == [0.928, 1.223, None]
