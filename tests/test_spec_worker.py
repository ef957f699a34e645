"""A worker written from protocol/README.md alone (spec_worker.py) trains with the server.

It shares no code with snet, so this fails when the server and the specification part:
a field renamed, a message reordered, a rule the README does not state. ``--verify-cv``
has the server score the CV set too and refuse a worker whose score differs from its
own: the worker's CV split, taken from the README, must be the server's.
"""

from __future__ import annotations

import asyncio

import pytest
from spec_worker import run_worker

from inprocess import Lab
from short_data import short_job


@pytest.mark.parametrize(
    ("mode", "in_flight", "learned"),
    [("sync", None, 0.5), ("async", 1, 0.5), ("async", 2, 0.15)],  # sync: no such bound
)
async def test_a_worker_written_from_the_readme_trains_an_epoch(
    lab: Lab, mode: str, in_flight: int | None, learned: float
) -> None:
    """One worker, one epoch: sync, and async one update in flight, are sequential
    training (0.60 of the CV frames, as the reference worker); async with two in flight
    computes on weights a step stale and learns less in one epoch (0.24 to 0.55)."""
    server = await lab.server(
        "--mode", mode, *(["--max-in-flight", str(in_flight)] if in_flight else []),
        "--epochs", "1", "--verify-cv", *short_job(),
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    joined = loop.run_in_executor(None, run_worker, "127.0.0.1", server.port)
    outcome = await asyncio.wait_for(joined, 60)
    assert outcome.goodbye == "training complete" and not outcome.errors, outcome
    assert outcome.evaluations == 1
    assert await server.wait(10) == "trained"
    status = server.final_status()
    assert status["updates_rejected"] == 0 and status["updates_applied"] == outcome.updates
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == ledger["unused"] == 0
    # scored by the worker and by the server, and the same: the worker's split is right
    assert status["cv_checks"] == {"scorers": 2, "agreed": 0, "refereed": 1, "refused": 0}
    assert status["epochs"][0]["cv_accuracy"] > learned  # chance is 0.1
    assert status["workers"][0]["inline_frames"]
