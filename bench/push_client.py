"""A load generator: pushes update elements at a server as fast as the socket allows.

``--target snet``: a protocol-speaking worker without arithmetic: it handshakes, then
sends valid updates (one pattern each, on the leases it is given) back to back, while a
reader thread drains the weights the server sends (into one reused buffer).
``--target plain``: the same bytes over a plain TCP connection to ``plain_sink``.
Prints a JSON line with what it sent, in how long, and the CPU time (all its threads)
that took.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections import deque
from functools import partial

import numpy as np

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import ArrayInfo, encode
from snet.protocol.messages import Hello, Lease, ServerHello, Update, Weights, Welcome


class _ReusedBuffer:
    """A PayloadSink that receives every payload into the same buffer (content unused)."""

    def __init__(self) -> None:
        self.buffer = bytearray(0)

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None:
        if message_type != "weights":
            return None
        if len(self.buffer) != payload_bytes:
            self.buffer = bytearray(payload_bytes)
        return memoryview(self.buffer), None


class _Reader(threading.Thread):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.decoder = FrameDecoder(sink=_ReusedBuffer())
        self.leases: deque[Lease] = deque()
        self.version = 0
        self.welcome = threading.Event()
        self.lease_ready = threading.Event()
        self.hello: ServerHello | None = None
        self.hello_ready = threading.Event()
        self.changed = threading.Condition()
        self.stop = False

    def run(self) -> None:
        # Receive the way a worker does: straight into the buffer the decoder asks for
        # (the weights payload lands in place, with no copy after the socket's own).
        while not self.stop:
            try:
                n = self.sock.recv_into(self.decoder.get_buffer())
            except OSError:
                return
            if n == 0:
                return
            self.decoder.buffer_updated(n)
            for message in self.decoder.messages():
                if isinstance(message, ServerHello):
                    self.hello = message
                    self.hello_ready.set()
                elif isinstance(message, Welcome):
                    self.welcome.set()
                elif isinstance(message, Weights):
                    with self.changed:
                        self.version = message.version
                        self.changed.notify_all()
                elif isinstance(message, Lease):
                    self.leases.append(message)
                    self.lease_ready.set()


def _newer(reader: _Reader, base: int) -> bool:
    return reader.version > base


def send_frame(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """Send a frame's buffers whole (``sendmsg`` may stop early, e.g. on a signal)."""
    views = [memoryview(part).cast("B") for part in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def push_snet(port: int, seconds: float, elements: int, sync: bool = False) -> dict[str, float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _Reader(sock)
    reader.start()
    if not reader.hello_ready.wait(30):
        raise SystemExit("no server hello")
    send_frame(sock, encode(Hello(PROTOCOL_VERSION, "push", "bench", (), b"")))
    if not reader.welcome.wait(30) or not reader.lease_ready.wait(30):
        raise SystemExit("no welcome or lease")
    # a tiny constant: the server refuses all-zero updates as implausible
    element = np.full(elements, 1e-6, dtype=np.float32)
    sent, started, cpu = 0, time.perf_counter(), time.process_time()
    lease, offset = reader.leases.popleft(), 0
    while time.perf_counter() - started < seconds:
        if offset >= len(lease.indices):
            while not reader.leases:
                time.sleep(0.001)
            lease, offset = reader.leases.popleft(), 0
        update = Update(reader.version, lease.lease_id, offset, 1, 0.0, 0, 0.0, element)
        send_frame(sock, encode(update))
        offset += 1
        sent += 1
        if sync:  # a synchronous worker waits for the weights of the next version
            base = update.base_version
            with reader.changed:
                reader.changed.wait_for(partial(_newer, reader, base), timeout=10)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    reader.stop = True
    sock.close()
    return {"sent": sent, "seconds": elapsed, "cpu_seconds": cpu}


def push_plain(port: int, seconds: float, elements: int) -> dict[str, float]:
    sock = socket.create_connection(("127.0.0.1", port))
    payload = np.zeros(elements, dtype=np.float32).data.cast("B")
    sent, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        sock.sendall(payload)
        sent += 1
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    sock.close()
    return {"sent": sent, "seconds": elapsed, "cpu_seconds": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", choices=("snet", "plain"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--elements", type=int, required=True, help="float32 values per element")
    parser.add_argument("--sync", action="store_true", help="wait for new weights after each")
    args = parser.parse_args()
    if args.target == "snet":
        result = push_snet(args.port, args.seconds, args.elements, args.sync)
    else:
        result = push_plain(args.port, args.seconds, args.elements)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
