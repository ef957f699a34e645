"""The worker's per-update figures (client/update_timing.py): which update a bunch's
weights include, and what is reported."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from snet.client.backend import NumpyBackend
from snet.client.update_timing import UpdateTiming
from snet.transport.inline import InlineChoice, timed

from helpers import QUICK_JOB
from inprocess import Lab


def test_latency_runs_from_the_send_to_the_first_bunch_on_weights_that_include_it() -> None:
    timing = UpdateTiming()
    assert timing.figures() is None  # nothing to say before the first update
    timing.computed(0.002)
    timing.sent(1)
    timing.computed(0.004)
    timing.sent(2)
    timing.bunch_started(0)  # still the weights from before either update
    assert timing.latency_count == 0
    time.sleep(0.01)
    timing.bunch_started(1)  # weights with the first update in: its latency, not the second's
    assert timing.latency_count == 1 and timing.latency_sum >= 0.01
    timing.bunch_started(1)  # the same weights again: counted once
    assert timing.latency_count == 1
    timing.bunch_started(2)
    assert timing.latency_count == 2
    figures = timing.figures()
    assert figures is not None
    assert figures["updates"] == 2 and figures["compute_cpu_ms"] == 3.0
    assert figures["latency_ms"] >= 0 and figures["latency_mean_ms"] >= 5
    assert figures["loop_cpu_ms"] >= 0  # the event loop's CPU after the first update


def test_a_new_connection_forgets_the_updates_it_will_never_see_settled() -> None:
    timing = UpdateTiming()
    timing.sent(1)
    timing.new_connection()
    timing.sent(1)  # numbering starts again on the new connection
    timing.bunch_started(1)
    assert timing.latency_count == 1


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # its subject is a report, not the loop
async def test_a_worker_asked_to_reports_its_per_update_figures_to_status(lab: Lab) -> None:
    server = await lab.server("--mode", "sync", "--epochs", "1", *QUICK_JOB)
    timed = lab.worker(server, "timed", "--report-timing")
    plain = lab.worker(server, "plain")
    assert await server.wait(60) == "trained"
    assert [await timed.wait(30), await plain.wait(30)] == [0, 0]
    rows = {row["name"]: row for row in server.final_status()["workers"]}
    figures = rows["timed"]["report"]["per_update"]
    # reported with every 32nd update (and each second): the last few may not be in
    assert rows["timed"]["updates_sent"] - 32 < figures["updates"] <= rows["timed"]["updates_sent"]
    assert figures["compute_cpu_ms"] > 0 and figures["latency_ms"] > 0
    assert "per_update" not in rows["plain"]["report"]  # only when asked


def test_small_bunches_are_computed_inline_once_measured_and_big_ones_never() -> None:
    choice = InlineChoice(0.002)
    assert not choice.chosen  # the first bunch goes to the compute thread: not yet timed
    choice.measured(0.0003)
    assert choice.chosen
    for _ in range(10):  # bunches grew (a bigger lease, a busy machine): back to the thread
        choice.measured(0.01)
    assert not choice.chosen
    never = InlineChoice(0.0)
    never.measured(0.0)
    assert not never.chosen


def test_a_pass_of_many_updates_goes_to_the_thread_even_when_single_ones_ran_inline() -> None:
    """The server's step passes: a backlog of fused steps is many updates in one pass; the
    choice weighs the mean per update by the updates of the pass at hand."""
    choice = InlineChoice(0.002)
    assert not choice.chosen_for(1)  # nothing timed yet: the thread, and timed there
    choice.measured(0.001, 2)  # a pass of two updates, 0.5 ms each
    assert choice.chosen_for(2) and choice.chosen_for(3)
    assert not choice.chosen_for(16)  # about 8 ms: it would hold the loop that long


def test_the_choice_is_made_on_cpu_time_not_on_time_spent_waiting_for_a_core() -> None:
    """A bunch that waited (here: slept) is not a long bunch: on a busy machine wall time
    counts the waits, and had every bunch handed to the thread exactly when cores were
    scarce."""

    def waits() -> int:
        time.sleep(0.05)
        return 7

    (value, cpu) = timed(waits)
    assert value == 7 and 0 <= cpu < 0.01
    choice = InlineChoice(0.002)
    choice.measured(cpu)
    assert choice.chosen


def test_compute_on_the_event_loop_is_not_counted_as_the_loop_s_own_work() -> None:
    timing = UpdateTiming()
    timing.computed(0.0, on_loop=True)
    timing.sent(1)  # the loop's CPU is counted from the first update on
    started = time.thread_time()
    while time.thread_time() - started < 0.02:  # a bunch "computed" on this thread
        pass
    timing.computed(time.thread_time() - started, on_loop=True)
    timing.sent(2)
    figures = timing.figures()
    assert figures is not None
    assert figures["compute_cpu_ms"] >= 10  # 20 ms over 2 updates
    assert figures["loop_cpu_ms"] < 5  # the loop itself did next to nothing meanwhile


class WhereComputed(NumpyBackend):
    """numpy's arithmetic, noting for each bunch whether it ran on the event loop's
    thread (the test's main thread) or the compute thread; ``sleep``: it also sleeps
    that long, as an emulated board's modelled time does (client/spert/timing.py)."""

    def __init__(self, sleep: float = 0.0) -> None:
        super().__init__("numpy")
        self.models_device_time = sleep > 0
        self.sleep = sleep
        self.on_loop: list[bool] = []

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        self.on_loop.append(threading.current_thread() is threading.main_thread())
        if self.sleep:
            time.sleep(self.sleep)
        return super().gradient(weights, frames, out)


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # its subject is a thread, not the loop
async def test_a_backend_that_sleeps_a_device_s_time_never_computes_on_the_loop(lab: Lab) -> None:
    """The inline choice sees CPU time: a bunch that is mostly a board's slept time would
    look short and hold the event loop (no heartbeats, nothing received) while it sleeps."""
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB)
    board_like, plain = WhereComputed(sleep=0.005), WhereComputed()
    lab.worker(server, "board-like", backend=board_like)
    lab.worker(server, "plain", backend=plain)
    assert await server.wait(120) == "trained"
    assert len(board_like.on_loop) >= 5 and not any(board_like.on_loop)
    assert any(plain.on_loop)  # a short bunch of CPU is computed inline: the check sees it
