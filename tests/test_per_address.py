"""One address cannot take every connection slot of a port: at most
``http_connections_per_address`` of the HTTP port's connections, and at most
``max_handshakes_per_address`` of the worker port's handshakes in progress, come from
one address. In process (the fast ring): a real server's listeners on 127.0.0.1, raw
sockets as the peers, from 127.0.0.1 (the hog) and 127.0.0.2 (everyone else: Linux
routes the whole of 127.0.0.0/8 to loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from pathlib import Path

import pytest

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.errors import ConfigError
from snet.protocol.messages import ErrorMessage, Hello, ServerHello
from snet.server.config import ServerConfig
from snet.transport.addresses import peer_address, peer_text
from snet.transport.tls import client_context

from async_raw import AsyncRawClient
from helpers import SMALL_JOB
from inprocess import Lab
from inprocess import wait_until as wait_in_lab

# the HTTP tests run on both loops (the admitted connection is handed over to aiohttp's
# handler with set_protocol, which each loop implements itself); the worker port's on one
ONE_LOOP = pytest.mark.parametrize("lab", ["uvloop"], indirect=True)

HOG, OTHER = "127.0.0.1", "127.0.0.2"

Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(port: int, source: str, tls: ssl.SSLContext | None = None) -> Peer:
    return await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), ssl=tls), 10
    )


async def _raw(port: int, source: str, name: str) -> AsyncRawClient:
    reader, writer = await _connect(port, source)
    return AsyncRawClient(reader, writer, name)


async def _get(port: int, source: str, path: str, tls: ssl.SSLContext | None = None) -> bytes:
    """The whole answer to GET ``path`` from ``source`` (the lab's client is the hog's
    address: it would be refused too)."""
    reader, writer = await _connect(port, source, tls)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    await _close([(reader, writer)])
    return answer


async def _close(peers: list[Peer]) -> None:
    for _, writer in peers:
        writer.close()
    for _, writer in peers:
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), 10)


async def test_one_address_holding_http_connections_leaves_room_for_the_others(
    lab: Lab,
) -> None:
    """At the defaults (64 connections, 16 per address): the hog opens 64 and sends
    part of a request line on each (a slowloris); before, it held all 64 and everyone
    else was answered 503."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    port = server.server.http_port
    listener = server.server.http_listener
    assert listener is not None and listener.per_address == 16
    hog = [await _connect(port, HOG) for _ in range(64)]
    for _, writer in hog:
        writer.write(b"GET /sta")
    await wait_in_lab(
        lambda: listener.refused_per_address == 64 - 16, 10, "the hog's extra connections refused"
    )
    answers = await asyncio.gather(
        *(asyncio.wait_for(reader.read(1 << 16), 10) for reader, _ in hog[16:])
    )
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer[:80]
        assert b"Retry-After: 1" in answer and b"from this address" in answer
    assert listener.open_connections == 16

    answer = await _get(port, OTHER, "/status")  # anyone else is served
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:80]
    status = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert status["http_connections_refused_per_address"] == 48
    assert status["http_connections_refused"] == 0  # the total was never reached
    metrics = (await _get(port, OTHER, "/metrics")).decode()
    assert "snet_http_connections_refused_per_address_total 48" in metrics
    assert "HTTP connection from 127.0.0.1 refused (16 open from it" in lab.log("server")
    await _close(hog)


async def test_the_http_bound_per_address_can_be_set_and_disabled(lab: Lab) -> None:
    server = await lab.server(
        "--http-connections", "4", "--http-connections-per-address", "0", "--min-workers", "9",
        *SMALL_JOB,
    )  # fmt: skip
    port = server.server.http_port
    listener = server.server.http_listener
    assert listener is not None
    held = [await _connect(port, HOG) for _ in range(4)]  # behind a proxy: one address
    await wait_in_lab(lambda: listener.open_connections == 4, 10, "all four to be open")
    reader, writer = await _connect(port, OTHER)  # the total still holds
    answer = await asyncio.wait_for(reader.read(1 << 16), 10)
    assert answer.startswith(b"HTTP/1.1 503") and b"too many HTTP connections open;" in answer
    await _close([*held, (reader, writer)])
    await wait_in_lab(lambda: listener.open_connections == 0, 10, "the held ones to close")
    status = await server.status()
    assert status["http_connections_refused"] == 1
    assert status["http_connections_refused_per_address"] == 0


async def test_the_http_bound_per_address_holds_behind_tls(lab: Lab, tmp_path: Path) -> None:
    """Behind TLS the connection is counted once its TLS handshake is done, and the
    admitted one handed over to aiohttp's handler on the TLS transport."""
    certificates = pytest.importorskip("snet.transport.certificates")
    pki = tmp_path / "pki"
    certificates.make_cluster_certificates(pki, ["127.0.0.1"])
    server = await lab.server(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--http-connections-per-address", "1", "--min-workers", "9", *SMALL_JOB,
    )  # fmt: skip
    port, tls = server.server.http_port, client_context(str(pki / "ca.pem"))
    listener = server.server.http_listener
    assert listener is not None
    held = await _connect(port, HOG, tls)
    await wait_in_lab(lambda: listener.open_connections == 1, 10, "the first to be open")
    refused = await _get(port, HOG, "/healthz", tls)
    assert refused.startswith(b"HTTP/1.1 503") and b"from this address" in refused
    served = await _get(port, OTHER, "/healthz", tls)
    assert served.startswith(b"HTTP/1.1 200 OK\r\n"), served[:80]
    assert listener.refused_per_address == 1
    await _close([held])


@ONE_LOOP
async def test_one_address_cannot_take_every_handshake_slot(lab: Lab) -> None:
    """At the defaults (128 handshakes, 64 per address): before, the hog's 128 silent
    connections turned every other worker away (too_many_handshakes) until they timed out."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    hog = [await _raw(server.port, HOG, f"hog{i}") for i in range(65)]
    for peer in hog[:64]:
        await peer.receive(ServerHello)
    refusal: ErrorMessage = await hog[64].receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "too_many_handshakes", refusal
    assert "from 127.0.0.1" in refusal.text and "max_handshakes_per_address" in refusal.text
    assert "try again" in refusal.text  # a worker takes it as busy and retries
    assert await hog[64].closed_by_peer()

    worker = await _raw(server.port, OTHER, "worker")  # another address is greeted
    await worker.receive(ServerHello)
    await worker.send(Hello(PROTOCOL_VERSION, "honest", "raw", (), b""))
    await wait_in_lab(lambda: len(server.server.coordinator.sessions) == 1, 10, "the welcome")
    status = await server.status()
    assert status["handshakes_turned_away_per_address"] == 1
    assert status["handshakes_turned_away"] == 0
    metrics = (await server.get("/metrics")).decode()
    assert "snet_handshakes_turned_away_per_address_total 1" in metrics
    assert "too_many_handshakes: 64 handshakes from 127.0.0.1" in lab.log("server")
    for peer in (*hog, worker):
        await peer.close()


@ONE_LOOP
async def test_welcomed_workers_from_one_address_are_not_bounded_per_address(
    lab: Lab,
) -> None:
    """One machine runs many workers (snet worker --processes N): only its handshakes in
    progress are bounded, one at a time here, not how many of them have joined."""
    server = await lab.server("--max-handshakes-per-address", "1", "--min-workers", "9",
                              *SMALL_JOB)  # fmt: skip
    joined = []
    for i in range(4):
        peer = await _raw(server.port, HOG, f"w{i}")
        await peer.receive(ServerHello)
        await peer.send(Hello(PROTOCOL_VERSION, f"w{i}", "raw", (), b""))
        await wait_in_lab(
            lambda n=i + 1: len(server.server.coordinator.sessions) == n, 10, "the welcome"
        )
        joined.append(peer)
    pending = await _raw(server.port, HOG, "pending")
    await pending.receive(ServerHello)
    late = await _raw(server.port, HOG, "late")  # a second handshake from the address
    refusal: ErrorMessage = await late.receive(ErrorMessage)
    assert refusal.code == "too_many_handshakes" and "per address" in refusal.text
    status = await server.status()
    assert status["connections_open"] == 5 and status["handshakes_turned_away_per_address"] == 1
    for peer in (*joined, pending, late):
        await peer.close()


@ONE_LOOP
@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no IPv6 on this machine")
async def test_a_server_on_every_address_takes_ipv4_and_ipv6_peers(lab: Lab) -> None:
    """``--host ::``: asyncio sets IPV6_V6ONLY on the sockets it makes, so each IPv4
    worker and browser was refused; both ports are one dual-stack socket now, and an
    IPv4 peer is known by its IPv4 address (one key for the bounds, loopback for /control)."""
    server = await lab.server("--host", "::", "--insecure", "--min-workers", "9", *SMALL_JOB)
    peers = []
    for n, host in enumerate(("127.0.0.1", "::1"), start=1):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, server.port), 10)
        peer = AsyncRawClient(reader, writer, host)
        await peer.receive(ServerHello)
        await peer.send(Hello(PROTOCOL_VERSION, f"from {host}", "raw", (), b""))
        await wait_in_lab(
            lambda n=n: len(server.server.coordinator.sessions) == n, 10, "the welcome"
        )
        peers.append(peer)
        http_reader, http_writer = await asyncio.wait_for(
            asyncio.open_connection(host, server.server.http_port), 10
        )
        http_writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(http_reader.read(), 10)
        await _close([(http_reader, http_writer)])
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    status = await server.status()
    hosts = {w["address"].rsplit(":", 1)[0] for w in status["workers"]}
    assert hosts == {"127.0.0.1", "[::1]"}, status["workers"]
    for peer in peers:
        await peer.close()


def test_peer_addresses_are_one_key_per_host() -> None:
    assert peer_address(("::ffff:10.1.2.3", 7000, 0, 0)) == "10.1.2.3"  # dual-stack IPv4
    assert peer_address(("2001:DB8:0:0::1", 7000, 0, 0)) == "2001:db8::1"
    assert peer_address(("2001:db8::2", 7000, 0, 0)) != peer_address(("2001:db8::1", 1, 0, 0))
    assert peer_address(("10.1.2.3", 7000)) == "10.1.2.3"
    assert peer_address(None) == "?"
    assert peer_text(("::ffff:10.1.2.3", 7000, 0, 0)) == "10.1.2.3:7000"
    assert peer_text(("2001:db8::1", 7000, 0, 0)) == "[2001:db8::1]:7000"
    assert peer_text(("10.1.2.3", 7000)) == "10.1.2.3:7000" and peer_text(None) == "?"


def test_the_bounds_per_address_are_checked() -> None:
    defaults = ServerConfig()
    assert (defaults.http_per_address, defaults.handshakes_per_address) == (16, 64)
    small = ServerConfig(http_connections=2, max_handshakes=1)
    assert (small.http_per_address, small.handshakes_per_address) == (1, 1)
    assert ServerConfig(http_connections_per_address=0).http_per_address == 0
    assert ServerConfig(max_handshakes_per_address=128).handshakes_per_address == 128
    for bad in (
        {"http_connections_per_address": 65},
        {"http_connections_per_address": -2},
        {"max_handshakes_per_address": 129},
        {"max_handshakes": 4, "max_handshakes_per_address": 5},
    ):
        with pytest.raises(ConfigError, match="per_address"):
            ServerConfig(**bad)  # type: ignore[arg-type]
