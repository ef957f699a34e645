"""Data division end to end: leases survive a worker killed mid-epoch and a newcomer
that cannot read the data (its frames come inline), with real processes; saved weights
are evaluated and training continues from them, and newbob on a real server, in process."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import signal

import pytest

from snet.cli.main import main

from helpers import QUICK_JOB, SMALL_JOB, Cluster, wait_until
from inprocess import Lab
from short_data import FRAMES as SHORT_FRAMES
from short_data import short_job


def _ledgers_exact(status: dict) -> None:
    for epoch in status["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"], ledger
        assert ledger["used_more"] == 0 and ledger["unused"] == 0, ledger


@pytest.mark.system
def test_worker_killed_mid_epoch_and_an_inline_newcomer_every_pattern_once(
    cluster: Cluster,
) -> None:
    server = cluster.server(
        "--mode", "async", "--epochs", "2", "--linger-seconds", "30", *SMALL_JOB,
        "--chunk-frames", "1024",
    )  # fmt: skip

    def updates_of(name: str) -> int:
        rows = {row["name"]: row for row in server.status()["workers"]}
        return int(rows[name]["updates_sent"]) if name in rows else 0

    # A stopped worker keeps its leases, so the epoch cannot end while it is stopped: the
    # order of events below does not depend on how fast the machine is.
    doomed = cluster.worker(server, "w-doomed")
    wait_until(lambda: updates_of("w-doomed") > 5, 60, "the first worker to train")
    doomed.send_signal(signal.SIGSTOP)
    first = cluster.worker(server, "w-first")
    wait_until(lambda: updates_of("w-first") > 20, 60, "the second worker to train")
    doomed.send_signal(signal.SIGKILL)  # mid-epoch, holding leases
    killed_in = server.status()["epoch"]
    first.send_signal(signal.SIGSTOP)
    # the newcomer cannot (here: will not) read the data: the server sends its frames
    newcomer = cluster.worker(server, "w-inline", "--data-access", "inline")
    wait_until(lambda: updates_of("w-inline") > 10, 60, "the inline newcomer to train")
    first.send_signal(signal.SIGCONT)
    wait_until(lambda: server.status()["state"] == "trained", 120, "training to finish")
    status = server.status()
    assert killed_in == 1 and status["epochs_done"] == 2
    _ledgers_exact(status)
    assert sum(e["ledger"]["requeued_frames"] for e in status["epochs"]) > 0
    rows = {row["name"]: row for row in status["workers"]}
    assert rows["w-doomed"]["state"] == "gone"
    assert rows["w-inline"]["inline_frames"] and rows["w-inline"]["updates_sent"] > 10
    assert not rows["w-first"]["inline_frames"]
    # raw frames, not windows, and each at most once: fewer than one per training frame
    sent = status["inline_frames"]["frames_sent"]
    assert 0 < sent <= 53999
    assert status["inline_frames"]["bytes_sent"] < 53999 * (13 * 4 + 12)
    assert status["cv_accuracy"] > 0.6
    assert "frames come inline" in cluster.log("w-inline")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert first.wait(30) == 0 and newcomer.wait(30) == 0


async def test_a_worker_that_cannot_read_the_data_trains_on_frames_sent_inline(
    lab: Lab,
) -> None:
    """The fast ring's view of the inline path (the system test above adds the kill), on
    a third of the data (tests/short_data.py)."""
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--min-workers", "2", *short_job()
    )  # both hold leases from the start: the inline one trains whatever the timing
    local = lab.worker(server, "w-local")
    inline = lab.worker(server, "w-inline", "--data-access", "inline")
    assert await server.wait(60) == "trained"
    assert [await local.wait(30), await inline.wait(30)] == [0, 0]
    status = server.final_status()
    _ledgers_exact(status)
    rows = {row["name"]: row for row in status["workers"]}
    assert rows["w-inline"]["inline_frames"] and rows["w-inline"]["updates_sent"] > 0
    assert not rows["w-local"]["inline_frames"]
    sent = status["inline_frames"]["frames_sent"]  # raw frames, each at most once
    assert 0 < sent <= SHORT_FRAMES
    assert status["inline_frames"]["bytes_sent"] < SHORT_FRAMES * (13 * 4 + 12)
    assert "frames come inline" in lab.log("w-inline")


def _snet(*args: str) -> str:
    """``snet ARGS`` (a command that runs to its end), in this process: its output."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert main(list(args)) == 0
    return output.getvalue()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # slow: one loop (tests/README.md)
async def test_newbob_on_the_server_then_eval_and_continue(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "sync", "--epochs", "6", "--schedule", "newbob", "--newbob-ramp", "3",
        "--newbob-stop", "1", "--learning-rates", "0.4", *QUICK_JOB,
    )  # fmt: skip
    worker = lab.worker(server, "w0")
    assert await server.wait(120) == "trained" and await worker.wait(30) == 0
    status = server.final_status()
    rates = [e["learning_rate"] for e in status["epochs"]]
    assert rates[0] == 0.4 and all(b in (a, a / 2) for a, b in itertools.pairwise(rates))
    accuracy = [e["cv_accuracy"] for e in status["epochs"]]
    # replay the rule on the measured CV errors: the server followed it
    from snet.protocol.schedule import NewbobSchedule

    rule = NewbobSchedule(0.4, 0.5, 3.0, 1.0, max_epochs=6)
    expected = [rule.after_epoch(100 * (1 - a)) for a in accuracy]
    assert [e["learning_rate"] for e in status["epochs"][1:]] == [
        d.next_rate for d in expected[:-1]
    ]
    assert [e["kept"] for e in status["epochs"]] == [not d.restore_best for d in expected]
    assert expected[-1].stop
    assert status["hooks"]["accuracy"]["epochs"][0]["cv"] == accuracy[0]
    assert status["hooks"]["mcups"]["mcups"] > 0
    assert (server.out_dir / "norms").read_text().startswith("vec 13\n")

    weights = server.out_dir / "weights.npz"
    scored = json.loads(_snet("eval", "--weights", str(weights), "--json"))
    best = max(a for a, d in zip(accuracy, expected, strict=True) if not d.restore_best)
    assert scored["frames"] == 5520 and abs(scored["accuracy"] - best) < 1e-6
    # /status names the CV of the weights it holds (and saved), not a rolled-back epoch's
    assert abs(status["weights_cv_accuracy"] - scored["accuracy"]) < 1e-6

    again = await lab.server(
        "--mode", "sync", "--epochs", "1", "--learning-rates", "0.05",
        "--init-weights", str(weights), *QUICK_JOB, name="continued",
    )  # fmt: skip
    assert (await again.status())["cv_accuracy"] is None
    worker = lab.worker(again, "w1")
    assert await again.wait(120) == "trained" and await worker.wait(30) == 0
    assert again.final_status()["epochs"][0]["cv_accuracy"] > best - 0.02  # went on from there
