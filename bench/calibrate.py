"""Measure the performance model's constants on this machine.

- ``cu_seconds``: the numpy backend's real training step (forward, backward, weight
  gradient) on the network, one thread, denormals flushed;
- ``apply_seconds_per_byte`` and ``step_seconds_per_byte``: the server's own update rule
  over 1 and 4 update elements (the slope per update, and the rest);
- ``link_seconds_per_byte``, ``worker_seconds_per_byte``, ``message_seconds`` and
  ``latency_seconds``: snet itself
  (``measure_snet_rounds``: synchronous rounds of one compute-free worker, on the network
  and on a one-unit network, so that the costs are what a real server and worker pay:
  framing, the event loops, the compute threads), split into the server's CPU time and
  the rest;
- for comparison, the limit of the link: a plain socket between this process and a child
  over 127.0.0.1 (``measure_loopback``: 2 MB and 64-byte messages, each answered by a
  one-byte acknowledgement).

``snet plan --calibrate`` and the scaling benchmark call ``calibrate``; ``snet bench``
records the constants in docs/benchmarks.json, which ``snet plan --constants`` reads.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snet.cli.perfmodel import Constants
from snet.client.network import BunchNetwork
from snet.protocol.fpu import flush_denormals
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights
from snet.server.update_rule import UpdateRule

from .processes import job_flags, modelled_env, synthetic_corpus, train_modelled
from .timing import seconds_per_call

BIG_MESSAGE = 2 * 1024 * 1024
SMALL_MESSAGE = 64
ROUND_SECONDS = 3.0  # measured seconds of each calibration run through snet


def measure_compute(network: NetworkSpec, bunch: int) -> float:
    """Seconds per connection update of the numpy training step (its own thread)."""
    result: list[float] = []

    def run() -> None:
        flush_denormals()
        model = BunchNetwork(network, bunch)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((bunch, network.input_size), dtype=np.float32)
        labels = rng.integers(0, network.output_size, bunch)
        weights = initial_weights(network, 0)
        out = ElementLayout.for_network(network).allocate()
        result.append(seconds_per_call(lambda: model.gradient(weights, x, labels, out)))

    thread = threading.Thread(target=run, name="snet-calibrate")  # FTZ is per thread
    thread.start()
    thread.join()
    return result[0] / (network.connections * bunch)


def _echo_child(sock: socket.socket) -> None:
    buffer = bytearray(BIG_MESSAGE)
    view = memoryview(buffer)
    while True:
        header = sock.recv(4)
        if len(header) < 4:
            return
        size, got = int.from_bytes(header, "little"), 0
        while got < size:
            received = sock.recv_into(view[got:size])
            if not received:
                return
            got += received
        sock.sendall(b"k")


def _round_trip(sock: socket.socket, size: int) -> float:
    """Seconds to send ``size`` bytes (a 4-byte length first) and get the 1-byte answer."""
    header, payload = size.to_bytes(4, "little"), bytes(size)

    def exchange() -> None:
        sock.sendall(header)
        sock.sendall(payload)
        sock.recv(1)

    return seconds_per_call(exchange)


def measure_loopback() -> tuple[float, float]:
    """(seconds per byte, seconds per message) over 127.0.0.1 to a child process."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the child: accept one connection and echo acknowledgements
        try:
            conn, _ = listener.accept()
            _echo_child(conn)
        finally:
            os._exit(0)
    listener.close()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            small = _round_trip(sock, SMALL_MESSAGE)
            big = _round_trip(sock, BIG_MESSAGE)
    finally:
        os.waitpid(pid, 0)
    # A round trip is one message each way; the small one is all latency.
    message = small / 2
    per_byte = max(big - small, 0.0) / (BIG_MESSAGE - SMALL_MESSAGE)
    return per_byte, message


def cpu_seconds_per_call(function: Callable[[], object], calls: int = 20) -> float:
    """The best of three means of ``function``'s CPU time in this thread: what it costs,
    however busy the machine (which only adds waiting, not CPU time)."""
    function()
    means = []
    for _ in range(3):
        started = time.thread_time()
        for _ in range(calls):
            function()
        means.append((time.thread_time() - started) / calls)
    return min(means)


def measure_apply(network: NetworkSpec) -> tuple[float, float]:
    """(seconds per byte per update, seconds per byte per step) of the server's step, in
    CPU time, as the server's share of a round is measured (``measure_snet_rounds``)."""
    layout = ElementLayout.for_network(network)
    rule = UpdateRule(layout.allocate(), momentum=0.9)
    updates = [layout.allocate() for _ in range(4)]

    def step(count: int) -> Callable[[], object]:
        return lambda: rule.step(updates[:count], 1000, 0.1)

    one, four = cpu_seconds_per_call(step(1)), cpu_seconds_per_call(step(4))
    element = layout.nbytes
    per_update = max(four - one, 0.0) / 3
    return per_update / element, max(one - per_update, 0.0) / element


@dataclass(frozen=True)
class LinkCosts:
    """What a transfer costs in snet: at the server (its CPU time) and everywhere else."""

    server_per_byte: float
    worker_per_byte: float
    server_per_message: float
    latency_per_message: float


def measure_snet_rounds(network: NetworkSpec, bunch: int, apply: float, step: float) -> LinkCosts:
    """The link's costs as snet pays them, from two short synchronous training runs.

    One compute-free worker trains, so a round is two messages (the update and the new
    weights) and the server's step; the server's and the worker's CPU time per round are
    read from /proc. On a one-unit network a round is all per-message cost: the server's
    CPU share of it is what P workers queue for, the rest of its wall time (the worker's
    work and the wake-ups between the two) is the latency they pay side by side. On
    ``network`` the growth of each side's CPU time is the bytes of two elements, at that
    end (the server's step, ``apply`` and ``step`` per byte, taken off). CPU time is what
    a busy machine does not inflate; only the latency is read off a clock. Without /proc
    each side is taken as half of the wall time.
    """
    tiny = NetworkSpec.parse("1:1:1")
    env = modelled_env(cu_seconds=0.0, time_scale=1.0)
    rounds: dict[NetworkSpec, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="snet-calibrate-") as tmp:
        for spec in (tiny, network):
            corpus = synthetic_corpus(Path(tmp) / f"{spec.describe()}.npz", spec, 200_000)
            flags = job_flags("sync", spec, bunch, *corpus)
            run = train_modelled(Path(tmp) / spec.describe(), env, flags, 1, ROUND_SECONDS)
            wall, steps = bunch / run["best"], max(run["steps"], 1)
            server, workers = run["server_cpu_seconds"], run["workers_cpu_seconds"]
            if server is None or workers is None:
                rounds[spec] = (wall, wall / 2, wall / 2)
            else:
                rounds[spec] = (wall, server / steps, workers / steps)
    (wall_tiny, server_tiny, _), (_, server_full, worker_full) = rounds[tiny], rounds[network]
    worker_tiny = rounds[tiny][2]
    twice = 2 * ElementLayout.for_network(network).nbytes
    server_bytes = server_full - server_tiny - twice / 2 * (apply + step)
    return LinkCosts(
        server_per_byte=max(server_bytes, 0.0) / twice,
        worker_per_byte=max(worker_full - worker_tiny, 0.0) / twice,
        server_per_message=server_tiny / 2,
        latency_per_message=max(wall_tiny - server_tiny, 0.0) / 2,
    )


def calibrate(network: NetworkSpec | None = None, bunch: int = 1000) -> Constants:
    """Measure every constant now (about 20 s: two short training runs through snet)."""
    network = network or NetworkSpec.parse("351:1262:45")
    cu = measure_compute(network, bunch)
    apply, step = measure_apply(network)
    link = measure_snet_rounds(network, bunch, apply, step)
    return Constants(
        cu_seconds=cu,
        pattern_seconds=0.0,
        link_seconds_per_byte=link.server_per_byte,
        worker_seconds_per_byte=link.worker_per_byte,
        message_seconds=link.server_per_message,
        latency_seconds=link.latency_per_message,
        apply_seconds_per_byte=apply,
        step_seconds_per_byte=step,
        source=f"calibrated {time.strftime('%Y-%m-%d %H:%M')} on {network.describe()}",
    )
