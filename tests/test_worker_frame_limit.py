"""A worker's own frame limit against what its job sends it.

A worker whose ``--max-frame-mb`` cannot hold the job's weights used to join, refuse the
weights ("the server broke the protocol"), lose the connection and join again, ten
times a second for ever. Now it stops once with exit 2 and one line naming the limit,
the size needed and the flag.
"""

from __future__ import annotations

import pytest

from snet.client.frame_limit import FrameLimitTooSmall

from helpers import QUICK_JOB, Cluster
from inprocess import Lab

BIG_NETWORK = ["--network", "117:2048:10"]  # 262,154 weights: 1,048,616 bytes, over 1 MiB
TOO_SMALL = (
    "this worker's frame limit is 1 MiB (1048576 bytes), but the weights of network "
    "117:2048:10 take 1048616 bytes: give --max-frame-mb (SNET_WORKER_MAX_FRAME_MB, or "
    "max_frame_mb in [worker]) at least 2"
)


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: its subject is not it
async def test_a_worker_whose_frame_limit_is_too_small_stops_at_once(lab: Lab) -> None:
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB, *BIG_NETWORK)
    small = lab.worker(server, "small", "--max-frame-mb", "1", "--retry-seconds", "300")
    with pytest.raises(FrameLimitTooSmall) as raised:  # `snet worker` exits 2 with it
        await small.wait(10)
    assert str(raised.value) == TOO_SMALL
    log = lab.log("small")
    assert "joined" not in log and "reconnecting" not in log
    assert "broke the protocol" not in log  # the limit is this worker's, not the server's
    big = lab.worker(server, "big", "--max-frame-mb", "2")  # what the line says is enough
    assert await big.wait(60) == 0
    assert await server.wait(30) == "trained"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_a_frame_over_the_limit_in_np_mode_stops_the_worker(lab: Lab) -> None:
    """np mode sends no whole network, so the handshake cannot foresee the frame: the
    slice (a lone holder's 117:2048:10 weights, output biases aside, and their velocity:
    2 MiB) is refused by the worker's own limit, which it then names instead of blaming
    the server."""
    args = ("--mode", "np", "--epochs", "1", *QUICK_JOB, *BIG_NETWORK)
    server = await lab.server(*args)
    small = lab.worker(server, "small", "--max-frame-mb", "1", "--retry-seconds", "300")
    with pytest.raises(FrameLimitTooSmall) as raised:
        await small.wait(10)
    assert str(raised.value) == (
        "this worker's frame limit is 1 MiB (1048576 bytes), but a frame from the server "
        "takes 2097152 bytes: give --max-frame-mb (SNET_WORKER_MAX_FRAME_MB, or max_frame_mb "
        "in [worker]) at least 2"
    )
    log = lab.log("small")
    assert log.count("joined") == 1 and "reconnecting" not in log
    assert "broke the protocol" not in log


@pytest.mark.system
def test_snet_worker_with_too_small_a_frame_limit_exits_2_with_one_line(cluster: Cluster) -> None:
    """The stranger's command: one line on stderr, exit 2, at once (it looped for ever)."""
    server = cluster.server("--mode", "async", "--epochs", "1", *QUICK_JOB, *BIG_NETWORK)
    done = cluster.run(
        "worker", "--server", server.address, "--max-frame-mb", "1", "--retry-seconds", "2",
        timeout=20,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"snet: {TOO_SMALL}"]
