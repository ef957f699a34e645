"""A worker's own frame limit, and its retry window against servers that drop it.

A worker whose ``--max-frame-mb`` cannot hold the job's weights used to join, refuse the
weights ("the server broke the protocol"), lose the connection and join again, ten
times a second for ever: joining renewed its retry window, and the refusal blamed the
server. Now it stops once with exit 2 and one line naming the limit, the size needed and
the flag; a server that drops a joined worker at once no longer renews its window
(client/retry_window.py); and a SIGTERM while a session ends is no longer lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import msgpack
import pytest

from snet.client.frame_limit import FrameLimitTooSmall
from snet.client.retry_window import FIRST_PAUSE_SECONDS, STEADY_SECONDS, RetryWindow
from snet.protocol import PROTOCOL_VERSION
from snet.protocol.framing import PREFIX, encode_bytes
from snet.protocol.messages import TIMEOUT, ErrorMessage, ServerHello
from snet.transport.dial import MAX_BACKOFF_SECONDS

from helpers import QUICK_JOB, Cluster
from inprocess import Lab, LabServer, wait_until

BIG_NETWORK = ["--network", "117:2048:10"]  # 262,154 weights: 1,048,616 bytes, over 1 MiB
TOO_SMALL = (
    "this worker's frame limit is 1 MiB (1048576 bytes), but the weights of network "
    "117:2048:10 take 1048616 bytes: give --max-frame-mb (SNET_WORKER_MAX_FRAME_MB, or "
    "max_frame_mb in [worker]) at least 2"
)


def test_the_window_is_renewed_only_by_a_steady_session() -> None:
    now = [100.0]
    window = RetryWindow(10.0, clock=lambda: now[0])
    window.joined()
    now[0] += 0.01
    window.session_ended()  # the first loss opens the window, joined or not
    assert window.deadline == 100.01 + 10.0 and window.pause == 0.2
    for pause in (0.4, 0.8, 1.6, 3.2, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS):
        now[0] += 2.0
        window.joined()  # joined, and dropped at once: not back with the server
        now[0] += 0.01
        window.session_ended()
        assert window.deadline == 110.01 and window.pause == pause
    assert window.expired()
    window.joined()
    now[0] += STEADY_SECONDS
    window.session_ended()  # a session that held: a new outage, a window of its own
    assert window.deadline == now[0] + 10.0 and window.pause == 0.1
    assert not window.expired()


def test_the_window_from_the_start_ends_when_the_server_answers() -> None:
    """A worker has its window to reach the server at all from its start; once the server
    has said hello, a loss opens a window of its own (one that took longer than the
    window to load its data, then was lost, gave up at once)."""
    now = [100.0]
    window = RetryWindow(10.0, clock=lambda: now[0])
    window.start()
    assert window.deadline == 110.0
    now[0] += 4.0
    window.start()  # once only
    assert window.deadline == 110.0
    window.answered()
    now[0] += 20.0  # loading its data, past the start's window
    window.joined()
    now[0] += 0.5
    window.session_ended()  # lost before it was steady: a window from the loss
    assert window.deadline == now[0] + 10.0 and not window.expired()
    window.answered()  # a later hello changes nothing
    assert window.deadline == now[0] + 10.0


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

    async def trains() -> bool:  # joined, took the weights, and its updates are stepped
        return int((await server.status())["updates_applied"]) >= 3

    await wait_until(trains, 60, "the worker with the limit the line gave to train")
    big.stop("test over")
    assert await big.wait(30) == 0 and "broke the protocol" not in lab.log("big")
    server.stop("test over")
    assert await server.wait(30) == "test over"


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


@contextlib.asynccontextmanager
async def dropping_proxy(
    server: LabServer, drop_when: asyncio.Event | None = None
) -> AsyncIterator[int]:
    """A port in front of ``server`` that passes everything but the first weights: it
    drops the connection there, as a broken server would drop every worker it welcomed.
    ``drop_when``: drop once it is set (the worker's session has reached what a test
    waits for), rather than 50 ms after the weights came."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def to_worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                prefix = await reader.readexactly(PREFIX.size)
                _, _, _, header_len, payload_len = PREFIX.unpack(prefix)
                header = await reader.readexactly(header_len)
                if msgpack.unpackb(header)["type"] == "weights":
                    if drop_when is None:
                        await asyncio.sleep(0.05)  # the worker has joined, and waits for them
                    else:
                        await asyncio.wait_for(drop_when.wait(), 10)
                    return  # dropped before it had anything to train on
                writer.write(prefix + header + await reader.readexactly(payload_len))
                await writer.drain()

    async def serve(worker_r: asyncio.StreamReader, worker_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", server.port)
        upstream = asyncio.ensure_future(pump(worker_r, server_w))
        await to_worker(server_r, worker_w)
        upstream.cancel()
        await asyncio.wait([upstream])
        for writer in (worker_w, server_w):
            writer.transport.abort()

    proxy = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with proxy:
        yield proxy.sockets[0].getsockname()[1]


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: the subject is time
async def test_a_server_that_drops_joined_workers_does_not_keep_one_past_its_window(
    lab: Lab,
) -> None:
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB)
    window = 0.5  # seconds: the worker's retry window
    async with dropping_proxy(server) as port:
        started = asyncio.get_running_loop().time()
        flags = ("--server", f"127.0.0.1:{port}", "--retry-seconds", str(window))
        worker = lab.worker(server, "w", *flags)
        assert await worker.wait(15) == 3  # unreachable: it looped for ever before
        took = asyncio.get_running_loop().time() - started
    log = lab.log("w")
    said = re.search(r"gave up after ([0-9.]+) s \(--retry-seconds 0.5\)", log)
    assert said is not None and window <= float(said.group(1)) <= took
    assert took < window + MAX_BACKOFF_SECONDS + 3
    # Backing off (0.2, 0.4, 0.8 s ...: the pause doubles after each session that was not
    # steady) rather than joining ten times a second: the first join, and one more after
    # each session that ended inside the window (at 0 and 0.2 s at the earliest).
    assert "joined snet" in log  # the proxy lets the welcome through: it did join
    pauses = [FIRST_PAUSE_SECONDS * 2 ** (n + 1) for n in range(8)]
    most = 1 + sum(1 for n in range(len(pauses)) if sum(pauses[:n]) < window)
    assert most == 3 and log.count("joined snet") <= most, log  # the bound is the point


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_stop_that_comes_while_a_session_ends_is_not_lost(lab: Lab) -> None:
    """The first SIGTERM of a worker in a reconnect loop was sometimes ignored: it came
    while the session's heartbeat task was awaited with its cancellation suppressed,
    which suppressed the worker's own. Here it comes exactly then, every time."""
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB)
    # dropped only once the session's heartbeat runs: a drop before it (the worker still
    # setting up on a loaded machine) ended that session with no heartbeat to cancel,
    # and the test saw the worker join twice
    beating = asyncio.Event()
    async with dropping_proxy(server, beating) as port:
        worker = lab.worker(server, "w", "--server", f"127.0.0.1:{port}", "--retry-seconds", "30")

        async def heartbeat(connection: object) -> None:
            beating.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:  # the session is ending: a SIGTERM now
                worker.stop("signal SIGTERM")
                raise

        worker.worker.reports.heartbeat = heartbeat  # type: ignore[method-assign]
        assert await worker.wait(10) == 0
    log = lab.log("w")
    assert log.count("joined snet") == 1, log  # no second session after the stop
    assert "stopped (signal SIGTERM)" in log


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


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_hello_the_server_found_too_late_is_a_drop_not_a_refusal(lab: Lab) -> None:
    """A server that timed out the worker's hello (a loaded machine; 17 of a 200-worker
    demo's) says ``timeout``: the worker took it for a refusal and exited 4, for good
    (found by a probe). It connects again, and gives up only at its retry window (3)."""
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB)

    async def too_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_bytes(ServerHello(PROTOCOL_VERSION, "slow", b"n" * 32, False)))
        await reader.read(1)  # its hello, on its way
        writer.write(encode_bytes(ErrorMessage(TIMEOUT, "no hello in 10 s", True)))
        writer.close()

    timing_out = await asyncio.start_server(too_late, "127.0.0.1", 0)
    port = timing_out.sockets[0].getsockname()[1]
    try:
        worker = lab.worker(server, "w", "--server", f"127.0.0.1:{port}", "--retry-seconds", "1")
        assert await worker.wait(15) == 3
    finally:
        timing_out.close()
    log = lab.log("w")
    assert "dropped during the handshake: no hello in 10 s" in log and "refused" not in log
