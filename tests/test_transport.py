"""The shared transport (transport/stream.py) and the fault switch (transport/faults.py) at
work, in one process: real sockets on 127.0.0.1, on asyncio's loop and on uvloop's. The
switch's rules themselves: test_fault_rules.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from snet.protocol.conversation import Conversation, Role
from snet.protocol.decoder import Decoded
from snet.protocol.errors import ConnectionLost, ProtocolError
from snet.protocol.framing import FrameLimits, encode_bytes
from snet.protocol.messages import (
    DataInfo,
    ErrorMessage,
    Goodbye,
    Heartbeat,
    Hello,
    Lease,
    Message,
    ServerHello,
    Welcome,
)
from snet.transport.faults import FaultSwitch
from snet.transport.stream import FrameStream

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None

LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])

# ---------------------------------------------------------------- streams on real sockets


class Recorder:
    """A ``StreamHandler`` that keeps what happens."""

    def __init__(self) -> None:
        self.stream: FrameStream | None = None
        self.messages: list[Message] = []
        self.refused: list[ProtocolError] = []
        self.lost = asyncio.get_running_loop().create_future()

    def stream_opened(self, stream: FrameStream) -> None:
        self.stream = stream

    def stream_received(self, decoded: Decoded) -> None:
        self.messages.append(decoded.message)

    def stream_refused(self, error: ProtocolError) -> None:
        self.refused.append(error)

    def stream_lost(self, error: ConnectionLost | None) -> None:
        if not self.lost.done():
            self.lost.set_result(error)

    def stream_drained(self) -> None:
        pass

    async def until(self, count: int, timeout: float = 5.0) -> list[Message]:
        async with asyncio.timeout(timeout):
            while len(self.messages) < count:
                await asyncio.sleep(0.005)
        return self.messages


Pair = tuple[Recorder, Recorder]


def run_pair(
    loop_name: str,
    body: Callable[[Pair], Awaitable[None]],
    server_faults: str = "",
    worker_faults: str = "",
) -> None:
    """Run ``body`` with a connected (server end, worker end) pair of streams."""

    async def main() -> None:
        limits = FrameLimits()
        server_end, worker_end = Recorder(), Recorder()
        switch = FaultSwitch.from_text(server_faults, Role.SERVER)
        tcp = await asyncio.get_running_loop().create_server(
            lambda: FrameStream(server_end, Conversation(Role.SERVER), limits, faults=switch),
            "127.0.0.1",
            0,
        )
        port = tcp.sockets[0].getsockname()[1]
        worker_switch = FaultSwitch.from_text(worker_faults, Role.WORKER)
        await asyncio.get_running_loop().create_connection(
            lambda: FrameStream(
                worker_end, Conversation(Role.WORKER), limits, faults=worker_switch
            ),
            "127.0.0.1",
            port,
        )
        async with asyncio.timeout(5):
            while server_end.stream is None or worker_end.stream is None:
                await asyncio.sleep(0.005)
        try:
            await body((server_end, worker_end))
        finally:
            for end in (server_end, worker_end):
                assert end.stream is not None
                end.stream.abort()
            tcp.close()
            await tcp.wait_closed()

    factory: Any = uvloop.new_event_loop if loop_name == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def streams(pair: Pair) -> tuple[FrameStream, FrameStream]:
    server_end, worker_end = pair
    assert server_end.stream is not None and worker_end.stream is not None
    return server_end.stream, worker_end.stream


SERVER_HELLO = ServerHello(1, "s", b"n" * 32, False)
HELLO = Hello(1, "w", "numpy", (), b"")


async def join(pair: Pair) -> None:
    """The handshake, up to where both sides train."""
    server, worker = streams(pair)
    server.send(SERVER_HELLO)
    await pair[1].until(1)
    worker.send(HELLO)
    await pair[0].until(1)
    server.send(Welcome(1, {}))
    server.send(DataInfo(3, 10))
    await pair[1].until(3)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_sending_to_a_peer_that_is_gone_never_raises(loop_name: str) -> None:
    async def body(pair: Pair) -> None:
        await join(pair)
        server, worker = streams(pair)
        worker.abort()  # the worker's process dies
        await asyncio.wait_for(pair[0].lost, 5)  # EOF or a reset: gone either way
        assert server.lost and not server.open
        for _ in range(3):  # what the step task does after every step
            assert server.send(Heartbeat(1.0)) is False
        assert server.sends_dropped == 3
        server.close()  # closing twice, or after the loss, is harmless
        server.close()
        assert server.send(Goodbye("late")) is False

    run_pair(loop_name, body)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_nothing_is_sent_after_our_own_goodbye_or_close(loop_name: str) -> None:
    async def body(pair: Pair) -> None:
        await join(pair)
        server, _ = streams(pair)
        assert server.send(Goodbye("training complete"))
        assert server.send(Heartbeat(1.0)) is False  # the conversation is closed for us
        server.close()
        assert server.send(Heartbeat(2.0)) is False
        assert server.sends_dropped == 2
        assert await asyncio.wait_for(pair[1].lost, 5) is None  # closed cleanly
        assert [m.TYPE for m in pair[1].messages][-1] == "goodbye"

    run_pair(loop_name, body)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_message_out_of_turn_closes_with_the_protocol_code(loop_name: str) -> None:
    async def body(pair: Pair) -> None:
        server, worker = streams(pair)
        server.send(SERVER_HELLO)
        await pair[1].until(1)
        assert worker.transport is not None
        worker.transport.write(encode_bytes(Lease(1, 0)))  # a server's message, by hand
        await asyncio.wait_for(pair[0].lost, 5)
        assert [e.code for e in pair[0].refused] == ["protocol"]
        refusal = (await pair[1].until(2))[1]
        assert isinstance(refusal, ErrorMessage) and refusal.fatal
        assert refusal.code == "protocol" and "lease" in refusal.text

    run_pair(loop_name, body)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_refusal_reaches_a_peer_still_sending(loop_name: str) -> None:
    """The worker refuses a damaged frame while the server's frames keep coming: closed at
    once with them unread, its socket was reset and the server lost the error frame
    (a fault test saw "connection reset by peer" where malformed_frame was due). Now it
    stops writing, drops what comes in, and closes when the server does."""

    async def body(pair: Pair) -> None:
        await join(pair)
        server, _ = streams(pair)
        assert server.transport is not None
        beats = b"".join(encode_bytes(Heartbeat(float(n))) for n in range(20000))
        server.transport.write(b"XX" + b"\0" * 30 + beats)  # a bad frame, then many more
        error = await pair[0].until(2)  # the hello, then the worker's error frame
        assert isinstance(error[1], ErrorMessage) and error[1].code == "malformed_frame"
        assert [e.code for e in pair[1].refused] == ["malformed_frame"]
        # the worker ends its side; the server sees an end of stream, not a reset
        assert await asyncio.wait_for(pair[0].lost, 5) is None
        assert await asyncio.wait_for(pair[1].lost, 5) is None

    run_pair(loop_name, body)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_faults_on_send(loop_name: str) -> None:
    async def body(pair: Pair) -> None:
        await join(pair)
        server, _ = streams(pair)
        for n in range(1, 6):
            server.send(Lease(n, 0))
        leases = [m for m in await pair[1].until(3 + 5) if isinstance(m, Lease)]
        # the 2nd never arrives, the 3rd arrives twice, the 4th comes late, after 0.05 s,
        # and holds up the 5th behind it (TCP keeps order)
        assert [m.lease_id for m in leases] == [1, 3, 3, 4, 5]
        server.send(Lease(6, 0))  # the 6th is damaged: the worker refuses it and closes
        await asyncio.wait_for(pair[0].lost, 5)
        assert [e.code for e in pair[1].refused] == ["malformed_frame"]
        assert isinstance(pair[0].messages[-1], ErrorMessage)
        assert pair[0].messages[-1].code == "malformed_frame"

    faults = "drop:lease:2;duplicate:lease:3;delay:lease:4:0.05;corrupt:lease:6"
    run_pair(loop_name, body, server_faults=faults)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_faults_on_receive(loop_name: str) -> None:
    async def body(pair: Pair) -> None:
        await join(pair)
        server, worker = streams(pair)
        for n in range(1, 6):
            server.send(Lease(n, 0))
        await pair[1].until(3 + 3)  # the 4th is held for 0.3 s, and the 5th behind it
        assert [m.lease_id for m in pair[1].messages if isinstance(m, Lease)] == [1, 2, 2]
        leases = [m for m in await pair[1].until(3 + 5) if isinstance(m, Lease)]
        assert [m.lease_id for m in leases] == [1, 2, 2, 4, 5]
        worker.send(Heartbeat(1.0))
        worker.send(Heartbeat(2.0))  # the worker process cuts after the 1st byte of this
        await asyncio.wait_for(pair[0].lost, 5)  # cut: aborted mid-frame
        assert [m for m in pair[0].messages if isinstance(m, Heartbeat)] == [Heartbeat(1.0)]

    run_pair(
        loop_name,
        body,
        worker_faults="duplicate:lease:2;drop:lease:3;delay:lease:4:0.3;"
        f"cut:send:{len(encode_bytes(HELLO)) + 58}",
    )


class RefusingTransport(asyncio.Transport):
    """A transport whose socket is gone under it: every write raises, as uvloop's do."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: Any) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    def abort(self) -> None:
        self.aborted = True


def test_a_write_the_transport_refuses_drops_the_connection_quietly() -> None:
    async def main() -> None:
        end = Recorder()
        stream = FrameStream(end, Conversation(Role.SERVER), FrameLimits())
        transport = RefusingTransport()
        stream.connection_made(transport)
        assert stream.send(SERVER_HELLO)  # handed on; the write fails below, not here
        assert transport.aborted and stream.writes_dropped == 1
        assert stream.send(Goodbye("x")) is False and stream.sends_dropped == 1

    asyncio.run(main())


class ReadingTransport(RefusingTransport):
    """One that takes writes and says whether it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reading, self.eof_written = True, False

    def write(self, data: Any) -> None:
        pass

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True


def test_a_lingering_close_is_not_paused_by_a_full_pool() -> None:
    """A connection closing lingers, reading and dropping until the peer closes; the
    element pool's watch pausing every connection's reading paused it too, and the peer's
    close went unread until the linger ran out (the server's exit waits for it)."""

    async def main() -> None:
        stream = FrameStream(Recorder(), Conversation(Role.SERVER), FrameLimits())
        transport = ReadingTransport()
        stream.connection_made(transport)
        stream.pause_reading()  # a full pool, before the close: paused
        assert not transport.reading
        stream.close_lingering()
        assert transport.reading and transport.eof_written  # reads to drop
        stream.pause_reading()  # the pool again
        assert transport.reading
        transport.abort()

    asyncio.run(main())


# ---------------------------------------------------------------- connecting


def test_a_cancel_that_races_a_failed_connect_is_not_lost(monkeypatch: Any) -> None:
    """A worker stopped (SIGTERM) just as a connection attempt is refused: Python 3.11's
    ``wait_for`` raises the refusal and drops the cancel; ``connect_with_backoff`` must
    still end with it, not retry until its deadline (``snet demo``'s Ctrl-C met this
    when its server, stopped by the same signal, had just closed its port). On 3.12 and
    later ``wait_for`` keeps the cancel itself, and this passes without the fix."""
    from snet.transport.dial import connect_with_backoff

    async def main() -> None:
        loop = asyncio.get_running_loop()
        dialing: list[asyncio.Task[Any]] = []

        async def refused(*args: Any, **kwargs: Any) -> Any:
            dialing[0].cancel()  # the stop lands while the attempt fails
            raise ConnectionRefusedError(111, "Connection refused")

        monkeypatch.setattr(loop, "create_connection", refused)
        dialing.append(loop.create_task(connect_with_backoff("127.0.0.1", 9, object, 30)))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(dialing[0]), 5)

    asyncio.run(main())


def test_connect_timeouts_of_a_tls_worker_are_no_refusal_of_its_certificate(
    monkeypatch: Any,
) -> None:
    """A timeout has no strerror, as a cut handshake has: a TLS worker without a
    certificate of its own took three timeouts (a host down, firewalled) for the server's
    refusal of it and exited 4, where it should retry for its window (a review)."""
    import ssl

    from snet.protocol.errors import ServerUnreachable
    from snet.transport.dial import connect_with_backoff

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def silent(*args: Any, **kwargs: Any) -> Any:
            raise TimeoutError

        monkeypatch.setattr(loop, "create_connection", silent)
        context = ssl.create_default_context()
        with pytest.raises(ServerUnreachable, match="no answer in"):
            await connect_with_backoff("127.0.0.1", 9, object, 1.5, context, client_cert=False)

    asyncio.run(main())


def test_a_handler_that_raises_does_not_keep_the_rest_of_its_batch() -> None:
    """A bug in a handler raises out of the transport; the frames decoded after the one it
    was given never reach anyone, so their pooled elements go back (server/pool.py)."""

    class Token:
        released = 0

        def release(self) -> None:
            self.released += 1

    class Failing:
        def stream_received(self, decoded: Decoded) -> None:
            raise RuntimeError("a bug")

    tokens = [Token(), Token(), Token()]
    stream = FrameStream(Failing(), Conversation(Role.SERVER), FrameLimits())  # type: ignore[arg-type]
    batch = [Decoded(Heartbeat(0.0), token) for token in tokens]
    with pytest.raises(RuntimeError, match="a bug"):
        stream._deliver_all(batch)
    assert [token.released for token in tokens] == [0, 1, 1]  # the first is the handler's
