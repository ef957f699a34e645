"""np mode end to end (in-process lab): a real server and workers exchanging slices,
bunches and partial outputs over 127.0.0.1, checked against sequential training."""

from __future__ import annotations

import ast
import functools
import signal
from typing import Any

import numpy as np
import pytest

from bench.np_pipeline import train_np_replay
from snet.cli.offline import train_job
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import NetworkSpec

from helpers import Cluster
from helpers import wait_until as system_wait
from inprocess import Lab, wait_until
from sequential_replay import load_weights
from short_data import short_data


def np_job(epochs: int = 1, bunch_size: int = 256) -> list[str]:
    """Small and quick: fsdd digits, 117:32:10, bunches of 256 (190 bunches an epoch).
    Bunches of 512 (95 bunches) for a test of what holders do, not of what they compute:
    one sequential epoch of them still scores 66% of the CV frames."""
    return [
        "--mode", "np", "--network", "117:32:10", "--epochs", str(epochs), "--bunch-size",
        str(bunch_size), "--chunk-frames", "4096", "--learning-rates", "0.2", "--momentum",
        "0.9",
    ]  # fmt: skip


# np_job() as a JobSpec (sequential training and the pipeline replay take one)
NP_JOB = JobSpec(
    mode="np",
    network=NetworkSpec.parse("117:32:10"),
    epochs=1,
    bunch_size=256,
    chunk_frames=4096,
    learning_rates=(0.2,),
    momentum=0.9,
)


def short_np_job() -> list[str]:
    """np_job() on a third of the data (tests/short_data.py): 63 bunches, for the tests
    that np gives what sequential training or its replay gives, whatever the data, and
    of what holders' memory lets them hold."""
    return [*np_job(), "--data", short_data()]


def short_np_spec() -> JobSpec:
    """short_np_job() as a JobSpec."""
    return NP_JOB.with_changes(data=DataSpec(source=short_data()))


@functools.cache
def _sequential_weights() -> np.ndarray:
    """short_np_spec() trained sequentially: computed once for the tests that compare with
    it (read-only, as they only compare)."""
    weights = train_job(short_np_spec().with_changes(mode="sync")).weights
    weights.setflags(write=False)
    return weights


def assert_trained_once(status: dict[str, Any], epochs: int) -> None:
    """Every epoch done, every training frame applied exactly once, and it learned."""
    assert status["epochs_done"] == epochs
    for epoch in status["epochs"]:
        ledger = epoch["ledger"]
        assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0
    assert status["cv_accuracy"] > 0.5


def _saved(lab_server_out: object) -> np.ndarray:
    arrays = load_weights(lab_server_out / "weights.npz")  # type: ignore[operator]
    return np.concatenate([a.ravel() for a in arrays])


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
@pytest.mark.parametrize("workers", [2, 3])
async def test_np_equals_sequential_training(lab: Lab, workers: int) -> None:
    server = await lab.server(*short_np_job())
    codecs = ("--compress", "sign", "--weights-codec", "fp16")  # nothing to encode in np mode
    started = [lab.worker(server, f"w{i}", *(codecs if i == 0 else ())) for i in range(workers)]
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in started] == [0] * workers
    np.testing.assert_allclose(_saved(server.out_dir), _sequential_weights(), rtol=1e-4, atol=1e-5)
    said = lab.log("w0")  # it joined saying so, not "updates sign, weights fp16"
    assert "(np mode, network 117:32:10: a slice of its hidden units)" in said
    assert "np mode: --compress sign and --weights-codec fp16 do nothing" in said
    status = server.final_status()
    assert status["mode"] == "np"
    assert status["rule"]["rule"] == "np slices"  # who holds which hidden units
    assert len(status["rule"]["slices"].split()) == workers
    rows = {row["name"]: row for row in status["workers"]}
    assert all(row["updates_sent"] > 10 for row in rows.values())  # partials, each bunch
    # and the workers count them as theirs: they said "no update" all run, "after 0 updates"
    assert all(w.worker.updates_sent == rows[w.name]["updates_sent"] for w in started)
    assert all(w.worker.progress.patterns == rows[w.name]["patterns"] for w in started)
    # every bunch completed, with the compute its slowest holder reported (what the round
    # waited for): summed, at least any one worker's compute (rows: rounded MCUPS)
    bunches, slowest = status["rule"]["bunches"], status["rule"]["slowest_compute_seconds"]
    ledger = status["epochs"][0]["ledger"]
    assert bunches == -(-ledger["frames"] // 256)  # the epoch's bunches of 256, the last short
    connections = NetworkSpec.parse("117:32:10").connections
    computed = [connections * row["patterns"] / row["mcups"] / 1e6 for row in rows.values()]
    assert 0 < max(computed) <= slowest * 1.01
    assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_worker_leaving_hands_its_units_over(lab: Lab) -> None:
    """A holder that leaves mid-epoch: its units go to the others as last reported, the
    bunches in flight are run again, and training completes every frame once."""
    server = await lab.server("--min-workers", "2", *np_job(bunch_size=512))
    first, second = lab.worker(server, "w0"), lab.worker(server, "w1")

    async def some_bunches_done() -> bool:
        return int((await server.status())["steps"]) >= 15

    await wait_until(some_bunches_done, 60, "15 bunches")
    second.stop("leaving on purpose")
    assert await second.wait(30) == 0
    # it goes on with one: not waiting for --min-workers again (its status said so)
    status = await server.status()
    assert status["workers_live"] == 1 and status["state"] in ("training", "trained")
    assert await server.wait(120) == "trained"
    assert await first.wait(30) == 0
    status = server.final_status()
    assert_trained_once(status, epochs=1)
    assert "np: w1 left holding units" in lab.log("server")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_holder_that_stops_answering_is_dropped_not_waited_for(lab: Lab) -> None:
    """Every bunch waits for every holder, but only until the round deadline: a worker
    whose partial output is lost is dropped (round_deadline), rejoins, and is given
    units again; training does not freeze and applies every frame once."""
    # It lingers: the dropped worker may reconnect only after the other finished the job,
    # and is then told so (a server gone before it reconnects would leave it exit 3). Both
    # workers end when told the job is trained; the lingering server is then asked.
    server = await lab.server("--stall-seconds", "0.5", "--join-seconds", "2",
                              "--linger-seconds", "30", *np_job(bunch_size=512))  # fmt: skip
    steady = lab.worker(server, "w0")
    lossy = lab.worker(server, "w1", "--faults", "drop:np_partial:30")
    assert [await steady.wait(120), await lossy.wait(30)] == [0, 0]
    status = await server.status()
    assert status["state"] == "trained"
    assert status["workers_dropped_late"] == 1
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"] and ledger["used_more"] == 0
    assert "np: w1 left holding units" in lab.log("server")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_pipelined_gives_the_replayed_pipeline_weights(lab: Lab) -> None:
    """With np_pipeline the forward pass of bunch k+1 runs before bunch k's error is
    applied: the server and workers give exactly what bench/np_pipeline.py's replay of
    that order gives (so the default-job figures measured with it hold for the daemon)."""
    server = await lab.server(*short_np_job(), "--np-pipeline", "true", "--min-workers", "2")
    started = [lab.worker(server, f"w{i}") for i in range(2)]
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in started] == [0, 0]
    replayed, _ = train_np_replay(short_np_spec(), 2, pipelined=True)
    saved = _saved(server.out_dir)
    np.testing.assert_allclose(saved, replayed, rtol=1e-4, atol=1e-5)
    assert not np.allclose(saved, _sequential_weights(), rtol=1e-4, atol=1e-5)


# Boards of 0.6 MB: 117:256:10 (1.04 MB on a board) fits no single one; a quarter of its
# hidden units (64: 0.53 MB) fits each. Ten times faster than the modelled board.
SMALL_BOARD = ["--memory-mb", "0.6", "--time-scale", "10"]
WIDE_NP_JOB = [*np_job(), "--network", "117:256:10"]


def short_wide_np_job() -> list[str]:
    """WIDE_NP_JOB on a third of the data (what a board holds depends on the network and
    the bunch, not on the data)."""
    return [*short_np_job(), "--network", "117:256:10"]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_network_no_board_holds_waits_beside_one_and_trains_on_four(lab: Lab) -> None:
    alone = await lab.server(*short_wide_np_job(), name="alone")
    board = lab.spert(alone, "board", *SMALL_BOARD)
    # cut no slice it cannot hold (it had refused the whole hidden layer, exit 4, for good)
    said = "256 hidden units do not fit the 1 workers"
    await wait_until(lambda: said in lab.log("alone"), 60, "the server to say why it waits")
    assert "training waits for more workers (or more memory)" in lab.log("alone")
    assert "does not fit the Spert board" not in lab.log("board")
    status = await alone.status()  # it waits beside the server, not gone
    assert status["workers_live"] == 1 and status["rule"]["memory_short"]
    board.stop("test over")
    assert await board.wait(30) == 0
    alone.stop("test over")
    await alone.wait(30)

    server = await lab.server(*short_wide_np_job(), "--min-workers", "4")
    # reporting every 0.1 s, not every second: the last report is one of a board that
    # has trained (the first comes with its first partials, before it has)
    boards = [
        lab.spert(server, f"board{i}", *SMALL_BOARD, "--heartbeat-seconds", "0.1") for i in range(4)
    ]
    assert await server.wait(120) == "trained"
    assert [await b.wait(30) for b in boards] == [0, 0, 0, 0]
    status = server.final_status()
    assert status["cv_accuracy"] > 0.5
    reports = [row["report"] for row in status["workers"]]
    assert all(0 < r["memory_mb"] < 0.6 and r["modelled_mcups"] > 0 for r in reports), reports
    assert all(r["patterns_trained"] > 0 for r in reports)


# A 0.5 MB board holds 48 of 117:256:10's units in bunches of 256 (an equal half, 128,
# it would refuse); two such boards hold 96 of the 256.
TINY_BOARD = ["--memory-mb", "0.5", "--time-scale", "10"]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_slices_fit_their_holders_memory(lab: Lab) -> None:
    server = await lab.server(*short_wide_np_job(), "--min-workers", "2")
    started = [lab.spert(server, "board", *TINY_BOARD), lab.worker(server, "numpy")]
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in started] == [0, 0]
    status = server.final_status()
    assert_trained_once(status, 1)
    assert status["rule"]["memory_short"] == ""
    rows = {row["name"]: row for row in status["workers"]}
    board = rows["board"]["id"]
    lines = lab.log("server").splitlines()
    cut_lines = [line for line in lines if "hidden units cut among 2 workers" in line]
    cuts = [ast.literal_eval(line.split("workers: ")[1]) for line in cut_lines]
    first = {worker: stop - start for worker, (start, stop) in cuts[0].items()}
    assert first[board] == 48 and sum(first.values()) == 256  # its memory's worth, not half
    assert all(cut[board][1] - cut[board][0] <= 48 for cut in cuts)  # then by speed: less
    assert 0 < rows["board"]["report"]["memory_mb"] <= 0.5


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_network_the_workers_cannot_hold_together_waits_for_more(lab: Lab) -> None:
    """The server cut such a network by speed alone and each board refused the half it
    was cut (exit 4, which a service manager does not restart): a run whose second board
    died stalled for good, its survivor thrown out. Nobody is cut a slice it cannot hold
    now: the run waits, saying why, and a worker that joins makes the cut possible."""
    server = await lab.server(*short_wide_np_job(), "--min-workers", "2")
    boards = [lab.spert(server, f"board{i}", *TINY_BOARD) for i in range(2)]
    said = "256 hidden units do not fit the 2 workers: their memory holds at most 96"
    await wait_until(lambda: said in lab.log("server"), 60, "the server to say so")
    assert "training waits for more workers (or more memory)" in lab.log("server")
    status = await server.status()
    assert status["rule"]["memory_short"] and status["workers_live"] == 2
    numpy = lab.worker(server, "numpy")  # it holds any slice: the rest is its
    assert await server.wait(120) == "trained"
    assert [await w.wait(30) for w in (*boards, numpy)] == [0, 0, 0]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_worker_that_cannot_read_the_data_is_told_why(lab: Lab) -> None:
    server = await lab.server(*np_job())
    inline = lab.worker(server, "inline", "--data-access", "inline")
    assert await inline.wait(60) == 4  # refused for good: np mode sends no frames
    assert "np mode needs every worker to read the data itself" in lab.log("inline")
    server.stop("test over")
    await server.wait(30)


@pytest.mark.system
def test_np_holder_killed_mid_run_hands_its_units_over(cluster: Cluster) -> None:
    """Real processes: a holder killed (no goodbye) is noticed by its lost connection; its
    units go to the others as last reported and every frame is still applied once."""
    server = cluster.server(*np_job(), "--min-workers", "3", "--linger-seconds", "30")
    workers = [cluster.worker(server, f"w{i}") for i in range(3)]
    system_wait(lambda: server.status()["steps"] > 30, 60, "np training")
    workers[1].send_signal(signal.SIGKILL)
    system_wait(lambda: server.status()["state"] == "trained", 120, "training to finish")
    status = server.status()
    assert_trained_once(status, epochs=1)
    assert "np: w1 left holding units" in server.log.read_text()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert workers[0].wait(30) == 0 and workers[2].wait(30) == 0


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_np_server_restarted_mid_epoch_resumes_and_completes(lab: Lab) -> None:
    """A stopped np server's last checkpoint holds the element assembled from the slices
    (docs/network-parallel.md, limits); a new server on the same out-dir resumes from it,
    cuts the units among the workers that join it and completes the epoch."""
    first = await lab.server(*np_job(), "--min-workers", "2")
    workers = [lab.worker(first, f"w{i}") for i in range(2)]

    async def past_a_report() -> bool:
        return int((await first.status())["steps"]) > 80  # reports come every 64 bunches

    await wait_until(past_a_report, 60, "80 bunches")
    first.stop("restart")
    assert await first.wait(30) == "restart"
    for worker in workers:
        worker.stop("server restarted elsewhere")
        await worker.wait(30)
    second = await lab.server(*np_job(), "--min-workers", "2")
    assert second.server.resumed is not None
    assert second.server.coordinator.version > 80
    again = [lab.worker(second, f"v{i}") for i in range(2)]
    assert await second.wait(120) == "trained"
    assert [await w.wait(30) for w in again] == [0, 0]
    assert_trained_once(second.final_status(), epochs=1)
    # written by the first at its stop, by the second at completion, and not again at its
    # stop (it said "trained nothing since it started: ... left as it is" after a resume)
    assert lab.log("server").count("final weights (version") == 2
    assert "left as it is" not in lab.log("server")


def test_np_runs_are_told_in_bunches_not_updates() -> None:
    """np's workers send no updates (README); `snet status` said "2274 updates applied" of
    an np run (each bunch's partial answers, one a slice holder, counted as updates)."""
    from snet.cli.status import _work_line

    document = {"mode": "np", "steps": 1137, "updates_applied": 2274, "updates_rejected": 0}
    assert _work_line(document) == "1137 bunches, 0 answers refused"
    document["mode"] = "async"
    assert _work_line(document) == "2274 updates applied, 0 refused"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_an_np_checkpoint_counts_only_the_bunches_in_its_element(lab: Lab) -> None:
    """A checkpoint holds the element of the last slice report; the bunches done after it
    are trained again after a restore. Their steps, versions and figures were saved all
    the same, so an np server killed and restarted counted them twice (a probe: 149,149
    patterns processed of 145,437 planned, an epoch of 408 steps for 379 bunches)."""
    from snet.server.resume import coordinator_state

    server = await lab.server(*np_job(), "--min-workers", "2")
    for i in range(2):
        lab.worker(server, f"w{i}")
    coordinator = server.server.coordinator

    def between_reports() -> bool:  # past the first report (64 bunches), more done since
        return coordinator.version > 70 and bool(coordinator.traffic.not_in_weights())

    await wait_until(between_reports, 60, "bunches after a report")
    lost = coordinator.traffic.not_in_weights()
    state = coordinator_state(coordinator)
    book = state["book"]["ledger"]
    in_element = int(np.asarray(book["uses"]).sum())  # the frames its element holds
    assert state["version"] == coordinator.version - len(lost)
    stats = state["stats"]
    assert stats["patterns_applied"] == in_element == stats["epochs"][-1]["train_patterns"]
    assert stats["steps"] == state["version"]  # a bunch a version, a step
    server.stop("test over")
    assert await server.wait(30) == "test over"
