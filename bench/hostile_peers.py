"""The hostile peers of bench/attacks.py: each group of issue 12's attacks as a coroutine
that speaks the wire protocol (protocol/README.md) over raw asyncio sockets to a live
server and returns notes on how the server answered."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import numpy as np

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import MAGIC, PREFIX, encode_bytes
from snet.protocol.messages import (
    ErrorMessage,
    EvalResult,
    Heartbeat,
    Hello,
    Lease,
    Message,
    ServerHello,
    Update,
    Weights,
    WorkerReport,
)
from snet.protocol.network import ElementLayout, NetworkSpec

NETWORK = NetworkSpec.parse("117:512:10")  # the default job's, which the attacked server runs
LAYOUT = ElementLayout.for_network(NETWORK)
CONCURRENCY = 64  # attempts in flight at once


class Peer:
    """One attacking connection: frames out, messages in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()
        self.inbox: list[Message] = []

    @classmethod
    async def connect(cls, port: int) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def receive(self, kind: type, timeout: float = 10.0) -> Message:
        deadline = time.monotonic() + timeout
        while True:
            for index, message in enumerate(self.inbox):
                if isinstance(message, kind):
                    return self.inbox.pop(index)
            data = await asyncio.wait_for(self.reader.read(1 << 20), deadline - time.monotonic())
            if not data:
                raise ConnectionError("closed")
            self.inbox += self.decoder.feed(data)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def join(self, name: str) -> None:
        await self.receive(ServerHello)
        await self.send(encode_bytes(Hello(PROTOCOL_VERSION, name, "attack", (), b"")))

    def close(self) -> None:
        self.writer.close()


async def _bounded(count: int, attempt: Callable[[int], Awaitable[None]]) -> int:
    """Run ``attempt(i)`` for i < count, CONCURRENCY at a time; count the failures."""
    failures = 0
    queue = iter(range(count))

    async def lane() -> None:
        nonlocal failures
        for i in queue:
            try:
                await asyncio.wait_for(attempt(i), 10)
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
                failures += 1

    await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))
    return failures


def _mutated(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data[: rng.randint(1, len(data))]) if rng.random() < 0.3 else bytes(data)


SAMPLE_FRAMES = [
    encode_bytes(Heartbeat(1.0)),
    encode_bytes(Update(0, 1, 0, 64, 1.0, 0, 0.01, np.zeros(LAYOUT.size, np.float32))),
    encode_bytes(WorkerReport(0.0, {"a": [1, 2, {"b": 3}]})),
    encode_bytes(EvalResult(1, 0, 10, 5, 1.0)),
]


async def fuzzed_connections(port: int, count: int) -> list[str]:
    rng = random.Random(1)

    async def attempt(i: int) -> None:
        peer = await Peer.connect(port)
        choice = rng.random()
        if choice < 0.3:
            await peer.send(rng.randbytes(rng.randint(1, 300)))
        elif choice < 0.8:
            await peer.send(_mutated(rng.choice(SAMPLE_FRAMES), rng))
        peer.close()

    failures = await _bounded(count, attempt)
    return [f"{failures} connections refused or timed out"] if failures else []


async def fuzzed_frames(port: int, count: int) -> list[str]:
    rng = random.Random(2)
    sent, connections = 0, 0
    while sent < count:
        peer = await Peer.connect(port)
        connections += 1
        try:
            await peer.join(f"fuzz-{connections}")
            while sent < count:
                await peer.send(_mutated(rng.choice(SAMPLE_FRAMES), rng))
                sent += 1
                if rng.random() < 0.05:
                    await asyncio.sleep(0)
        except (OSError, ConnectionError):
            pass  # closed for a bad frame, as it should be: handshake again
        finally:
            peer.close()
    return [f"{connections} connections needed (each bad frame closes one)"]


async def churned_handshakes(port: int, count: int) -> list[str]:
    async def attempt(i: int) -> None:
        peer = await Peer.connect(port)
        await peer.join(f"churn-{i}")
        await peer.receive(Weights)
        peer.close()

    failures = await _bounded(count, attempt)
    return [f"{failures} failed"] if failures else []


async def _joined(port: int, count: int, prefix: str) -> list[Peer]:
    """``count`` peers past the handshake, named ``prefix-i``."""
    peers = []
    for i in range(count):
        peer = await Peer.connect(port)
        await peer.join(f"{prefix}-{i}")
        peers.append(peer)
    return peers


async def _hold(peers: list[Peer], hold: float) -> None:
    """Keep ``peers`` connected for ``hold`` seconds, each sending a heartbeat a second,
    then close them."""
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        for peer in peers:
            await peer.send(encode_bytes(Heartbeat(time.time())))
        await asyncio.sleep(1.0)
    for peer in peers:
        peer.close()


async def idle_handshakes(port: int, count: int, hold: float) -> list[str]:
    await _hold(await _joined(port, count, "idle"), hold)
    return [f"held {hold:.0f} s, sending heartbeats"]


async def idle_readers(port: int, count: int, hold: float) -> list[str]:
    """Welcomed peers that read all they are sent and never train: each was sent every
    step's weights (30 of them cut a run to 0.38 of its steps a second)."""
    peers = await _joined(port, count, "reader")
    received = [0]

    async def drain(peer: Peer) -> None:
        while data := await peer.reader.read(1 << 20):
            received[0] += len(data)

    readers = [asyncio.create_task(drain(peer)) for peer in peers]
    await _hold(peers, hold)
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    return [f"held {hold:.0f} s reading: {received[0] / 1e6:.1f} MB sent to them"]


async def oversized_prefixes(port: int, count: int, hold: float) -> list[str]:
    peers = []
    header = b"\x80" * 177  # a 177-byte frame head declaring a 512 MiB payload
    for _ in range(count):
        peer = await Peer.connect(port)
        await peer.send(PREFIX.pack(MAGIC, 1, 0, len(header), 512 << 20) + header)
        peers.append(peer)
    await asyncio.sleep(hold)
    closed = sum(1 for peer in peers if peer.reader.at_eof() or peer.writer.is_closing())
    for peer in peers:
        peer.close()
    return [f"{closed} of {count} closed by the server within {hold:.0f} s"]


async def implausible_updates(port: int, count: int) -> list[str]:
    peer = await Peer.connect(port)
    await peer.join("forger")
    weights = await peer.receive(Weights)
    lease = await peer.receive(Lease, timeout=30)
    assert isinstance(weights, Weights) and isinstance(lease, Lease)
    huge = np.full(LAYOUT.size, 1e30, np.float32)
    flipped = np.full(LAYOUT.size, 1e-3, np.float32)
    flipped[5] = 2.0**43
    nan = np.zeros(LAYOUT.size, np.float32)
    nan[9] = np.nan
    zeros = np.zeros(LAYOUT.size, np.float32)
    small = np.full(LAYOUT.size, 1e-3, np.float32)
    forged = [(huge, 0, 1.0), (flipped, 0, 1.0), (nan, 0, 1.0), (zeros, 0, 1.0),
              (small, 7_800_000_000_000_000, 1.0), (small, 0, float("nan"))]  # fmt: skip
    for offset, (element, correct, loss) in enumerate(forged[:count]):
        update = Update(weights.version, lease.lease_id, offset * 64, 64, loss, correct, 0.01,
                        element)  # fmt: skip
        await peer.send(encode_bytes(update))
    await peer.send(encode_bytes(EvalResult(weights.version, 0, 10, 10, 0.0)))  # not asked
    await asyncio.sleep(2.0)
    peer.close()
    return ["1e30, a 2^43 byte flip, NaN, zeros, forged counts and loss, a forged CV result"]


async def connection_flood(port: int, count: int, hold: float) -> list[str]:
    """``count`` connections opened at once that never say hello: how many the server
    greets, turns away (and with which code), and how soon it closes the rest."""
    started = time.monotonic()
    peers = [await Peer.connect(port) for _ in range(count)]

    async def fate(peer: Peer) -> tuple[str, float]:
        try:
            while data := await asyncio.wait_for(peer.reader.read(1 << 16), hold):
                peer.inbox += peer.decoder.feed(data)
        except (OSError, ConnectionError):
            pass
        except TimeoutError:
            return "still open", hold
        codes = [m.code for m in peer.inbox if isinstance(m, ErrorMessage)]
        greeted = any(isinstance(m, ServerHello) for m in peer.inbox)
        return ("greeted, then " if greeted else "") + (codes[0] if codes else "eof"), (
            time.monotonic() - started
        )

    fates = await asyncio.gather(*(fate(peer) for peer in peers))
    for peer in peers:
        peer.close()
    counts: dict[str, int] = {}
    for what, _ in fates:
        counts[what] = counts.get(what, 0) + 1
    greeted = [seconds for what, seconds in fates if what.startswith("greeted")]
    notes = [", ".join(f"{n} {what}" for what, n in sorted(counts.items()))]
    if greeted:
        notes.append(f"the greeted closed by {max(greeted):.1f} s")
    return notes


async def slow_http_clients(http_port: int, count: int, hold: float) -> list[str]:
    """``count`` HTTP connections that send a request line and never finish it: how soon
    the server closes them."""
    started = time.monotonic()
    writers, waits = [], []

    async def slowloris() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        writers.append(writer)
        writer.write(b"GET /stat")
        try:
            while await asyncio.wait_for(reader.read(1 << 16), hold):
                pass
        except (OSError, ConnectionError):
            pass
        except TimeoutError:
            return float("inf")
        return time.monotonic() - started

    waits = await asyncio.gather(*(slowloris() for _ in range(count)))
    for writer in writers:
        writer.close()
    still = sum(1 for wait in waits if wait == float("inf"))
    return [f"closed by the server after at most {max(waits):.1f} s, {still} still open "
            f"after {hold:.0f} s"]  # fmt: skip
