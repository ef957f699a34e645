"""Bounded before trust (issue 12): connection and handshake limits on the worker port,
slow and numerous clients on the HTTP port. In process (the fast ring): a real server's
listeners on 127.0.0.1, raw sockets as the peers."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.framing import MAGIC, PREFIX
from snet.protocol.messages import ErrorMessage, Hello, ServerHello

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab
from inprocess import wait_until as wait_in_lab
from short_data import short_job

pytestmark = pytest.mark.parametrize("lab", ["uvloop"], indirect=True)


async def _refused_with(port: int, code: str) -> None:
    """A new connection is told ``code`` instead of a greeting, and closed."""
    peer = await AsyncRawClient.connect(port, "late")
    refusal: ErrorMessage = await peer.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == code and "try again" in refusal.text
    assert not any(isinstance(m, ServerHello) for m in peer.inbox)
    assert await peer.closed_by_peer()
    await peer.close()


async def test_connections_and_handshakes_are_limited_and_each_refused_clearly(
    lab: Lab,
) -> None:
    server = await lab.server(  # the totals: every peer is 127.0.0.1 (test_per_address.py)
        "--max-connections", "3", "--max-handshakes", "2", "--handshake-seconds", "30",
        "--max-handshakes-per-address", "0", "--min-workers", "9", *SMALL_JOB,
    )  # fmt: skip
    pending = [await AsyncRawClient.connect(server.port, f"p{i}") for i in range(2)]
    for peer in pending:
        await peer.receive(ServerHello)
    await _refused_with(server.port, "too_many_handshakes")
    await pending[0].send(Hello(PROTOCOL_VERSION, "joined", "raw", (), b""))
    await wait_in_lab(lambda: len(server.server.coordinator.sessions) == 1, 10, "the welcome")
    third = await AsyncRawClient.connect(server.port, "third")  # one handshake pending again
    await third.receive(ServerHello)
    await _refused_with(server.port, "too_many_connections")

    status = await server.status()
    assert status["handshakes_turned_away"] == 1 and status["connections_refused"] == 1
    assert status["connections_open"] == 3
    metrics = (await server.get("/metrics")).decode()
    assert "snet_connections_refused_total 1" in metrics
    assert "snet_handshakes_turned_away_total 1" in metrics
    assert "turned away or timed out 1 connection(s)" in lab.log("server")
    for peer in (*pending, third):
        await peer.close()


async def test_a_handshake_not_completed_in_time_is_closed(lab: Lab) -> None:
    server = await lab.server("--handshake-seconds", "0.25", "--min-workers", "9", *SMALL_JOB)
    silent = await AsyncRawClient.connect(server.port, "silent")
    dripping = await AsyncRawClient.connect(server.port, "dripping")
    started = time.monotonic()
    await dripping.send_bytes(b"SN")  # the start of a frame, never finished
    for peer in (silent, dripping):
        assert await peer.closed_by_peer(timeout=5)
        closing: ErrorMessage = await peer.receive(ErrorMessage)
        assert closing.fatal and closing.code == "timeout" and "no hello" in closing.text
    assert time.monotonic() - started < 0.25 + 1.5  # the bound, the check's period, lateness
    assert (await server.status())["handshakes_timed_out"] == 2
    for peer in (silent, dripping):
        await peer.close()


async def test_a_worker_turned_away_as_busy_tries_again_and_trains(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--max-connections", "1", "--linger-seconds",
        "30", *short_job(),
    )  # fmt: skip
    squatter = await AsyncRawClient.connect(server.port, "squatter")
    await squatter.receive(ServerHello)
    worker = lab.worker(server, "w1")

    async def turned_away() -> bool:
        return bool((await server.status())["connections_refused"] >= 1)

    await wait_in_lab(turned_away, 10, "the worker to be turned away")
    await squatter.close()  # the slot frees up: the worker, retrying, gets it

    async def trained() -> bool:
        return bool((await server.status())["state"] == "trained")

    await wait_in_lab(trained, 60, "training to finish")
    assert "the server is busy: too_many_connections" in lab.log("w1")
    assert await worker.wait(15) == 0


# ------------------------------------------------------------------ the HTTP port


async def _http_peer(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)


async def _seconds_until_closed(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closes the connection. A reset is a close too: a peer
    still dripping bytes when the server hangs up has them answered with one (seen under
    load: the dripper's next byte crossed the server's close)."""
    started = time.monotonic()
    with contextlib.suppress(ConnectionResetError):
        while await asyncio.wait_for(reader.read(1 << 16), limit):
            pass  # a response (an error page) may come before the close
    return time.monotonic() - started


async def test_slow_http_clients_are_closed_within_the_bound_while_training_goes_on(
    lab: Lab,
) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1000", "--http-header-seconds", "0.25", *SMALL_JOB
    )  # fmt: skip
    lab.worker(server, "w1")

    async def training() -> bool:
        return bool((await server.status())["weight_version"] > 5)

    await wait_in_lab(training, 30, "training to start")
    before = (await server.status())["weight_version"]
    port = server.server.http_port
    silent = await _http_peer(port)
    partial = await _http_peer(port)
    partial[1].write(b"GET /sta")  # a slowloris: a request line never finished
    dripping = await _http_peer(port)

    async def drip() -> None:
        for byte in b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ":
            dripping[1].write(bytes([byte]))
            await asyncio.sleep(0.1)

    dripper = asyncio.get_running_loop().create_task(drip())
    waits = await asyncio.gather(
        *(_seconds_until_closed(peer[0], 10) for peer in (silent, partial, dripping))
    )
    dripper.cancel()
    assert max(waits) < 0.25 + 1.0, waits  # the bound, and the loop's own lateness
    body = await _http_peer(port)  # a body sent slowly is held to the same bound
    body[1].write(
        b"POST /control HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 30\r\n\r\n{"stal'
    )
    answer = await asyncio.wait_for(body[0].read(1 << 16), 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert (await server.status())["weight_version"] > before  # training went on
    for peer in (silent, partial, dripping, body):
        peer[1].close()


async def test_http_connections_beyond_the_limit_are_answered_503(lab: Lab) -> None:
    server = await lab.server(  # the total: every peer is 127.0.0.1 (test_per_address.py)
        "--http-connections", "2", "--http-connections-per-address", "0", "--min-workers", "9",
        *SMALL_JOB,
    )  # fmt: skip
    port = server.server.http_port
    held = [await _http_peer(port) for _ in range(2)]
    listener = server.server.http_listener
    assert listener is not None
    await wait_in_lab(lambda: listener.open_connections == 2, 10, "both to be open")
    reader, writer = await _http_peer(port)
    answer = await asyncio.wait_for(reader.read(1 << 16), 10)
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"Retry-After: 1" in answer and b"too many HTTP connections" in answer
    writer.close()
    for _, held_writer in held:
        held_writer.close()

    await wait_in_lab(lambda: listener.open_connections == 0, 10, "the held ones to close")
    assert (await server.status())["http_connections_refused"] == 1


async def test_a_welcomed_worker_may_not_declare_a_payload_beyond_its_largest_update(
    lab: Lab,
) -> None:
    """Trusted or not, a frame is bounded by what the conversation can need: an update's
    element (or an encoding of it, at most twice as large), not ``max_frame_mb``."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    peer = await AsyncRawClient.connect(server.port, "greedy")
    await peer.handshake()
    element_bytes = server.server.coordinator.layout.nbytes
    header = b"\x80"  # an empty msgpack map: the payload length is checked first
    declared = 2 * element_bytes + (1 << 20) + 1
    await peer.send_bytes(PREFIX.pack(MAGIC, 1, 0, len(header), declared) + header)
    refusal: ErrorMessage = await peer.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "frame_too_large", refusal
    assert await peer.closed_by_peer()
    await peer.close()


async def _raw_http(port: int, request: bytes) -> bytes:
    reader, writer = await _http_peer(port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(1 << 16), 10)
    finally:
        writer.close()


async def test_a_request_without_host_is_answered_without_a_traceback(lab: Lab) -> None:
    server = await lab.server("--mode", "async", *SMALL_JOB)
    port = server.server.http_port
    for _ in range(3):  # HTTP/1.1 requires Host: aiohttp refuses it before any handler
        answer = await _raw_http(port, b"GET /status HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n"), answer[:80]
    # HTTP/1.0 has no Host: answered (no browser sends it; server/security.py)
    answer = await _raw_http(port, b"GET /status HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n"), answer[:80]
    log = lab.log("server")
    assert "Traceback" not in log and "ERROR" not in log
    refusals = [line for line in log.splitlines() if "malformed HTTP request" in line]
    assert refusals == [
        "WARNING snet.server: malformed HTTP request answered 400: "
        "\"Missing 'Host' header in request.\" (1 so far)"
    ]
