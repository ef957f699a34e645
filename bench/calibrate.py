"""Measure the performance model's constants on this machine.

- ``cu_seconds``: the numpy backend's real training step (forward, backward, weight
  gradient) on the network, one thread, denormals flushed;
- ``apply_seconds_per_byte``: the server's own update rule over 1 and 4 update
  elements (the slope per update);
- ``link_seconds_per_byte``, ``worker_seconds_per_byte``, ``message_seconds``,
  ``latency_seconds``, ``step_seconds_per_byte`` and ``step_fixed_seconds``: snet itself
  (``measure_snet_rounds``: synchronous rounds of 1 and 4 compute-free workers, on the
  network and on a one-unit network, so that the costs are what a real server and worker
  pay: framing, the event loops, the compute threads), split into the server's CPU time
  and the rest;
- for comparison, the limit of the link: a plain socket between this process and a child
  over 127.0.0.1 (``measure_loopback``: 2 MB and 64-byte messages, each answered by a
  one-byte acknowledgement).

The scaling benchmark calls ``calibrate``; ``snet plan --calibrate`` runs
``python -m bench.calibrate --constants NETWORK BUNCH``, which prints them as JSON;
``snet bench`` records them in docs/benchmarks.json, which ``snet plan --constants`` reads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snet.cli.runtime import blas_thread_env
from snet.client.network import BunchNetwork
from snet.perf.model import Constants
from snet.protocol.fpu import flush_denormals
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights
from snet.server.update_rule import UpdateRule

from . import child_env
from .processes import job_flags, modelled_env, synthetic_corpus, train_modelled
from .timing import seconds_per_call

BIG_MESSAGE = 2 * 1024 * 1024
SMALL_MESSAGE = 64
ROUND_SECONDS = 3.0  # measured seconds of each calibration run through snet
MORE_WORKERS = 4  # the second worker count of the calibration runs (the first is 1)


def _compute_seconds(network: NetworkSpec, bunch: int) -> float:
    """Seconds per connection update of the numpy training step, in its own thread."""
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


def measure_compute(network: NetworkSpec, bunch: int) -> float:
    """Seconds per connection update of one worker: the numpy step with one BLAS thread.

    Measured in a child process, because BLAS fixes its thread count when numpy is
    first imported, and this process may use more (a worker uses one unless told).
    """
    env = child_env(blas_thread_env(1))
    command = [sys.executable, "-m", "bench.calibrate", network.describe(), str(bunch)]
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if output.returncode != 0:
        raise RuntimeError(
            f"measuring the compute constant failed (exit {output.returncode}): "
            f"{output.stderr.strip()[-2000:]}"
        )
    return float(output.stdout.strip().splitlines()[-1])


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


def measure_apply(network: NetworkSpec) -> float:
    """Seconds per byte of adding one more update into the server's step (CPU time)."""
    layout = ElementLayout.for_network(network)
    rule = UpdateRule(layout.allocate(), momentum=0.9)
    updates = [layout.allocate() for _ in range(4)]

    def step(count: int) -> Callable[[], object]:
        return lambda: rule.step(updates[:count], 1000, 0.1)

    one, four = cpu_seconds_per_call(step(1)), cpu_seconds_per_call(step(4))
    element = layout.nbytes
    return max(four - one, 0.0) / 3 / element


@dataclass(frozen=True)
class LinkCosts:
    """What a transfer and a step cost in snet: at the server (its CPU time) and
    everywhere else."""

    server_per_byte: float
    worker_per_byte: float
    server_per_message: float
    latency_per_message: float
    step_per_byte: float
    step_fixed: float


@dataclass(frozen=True)
class RoundCosts:
    """One short synchronous run of compute-free workers: seconds per round."""

    wall: float
    server: float  # the server's CPU time
    workers: float  # the workers' CPU time, all of them


def _sync_rounds(directory: Path, network: NetworkSpec, bunch: int, workers: int) -> RoundCosts:
    env = modelled_env(cu_seconds=0.0, time_scale=1.0)
    corpus = synthetic_corpus(directory / f"{network.describe()}.npz", network, 200_000)
    flags = job_flags("sync", network, bunch, *corpus)
    run = train_modelled(
        directory / f"{network.describe()}-{workers}", env, flags, workers, ROUND_SECONDS
    )
    if run["steps"] <= 0:  # CPU time per round would be meaningless
        raise RuntimeError(
            f"calibration: {workers} worker(s) on {network.describe()} took no step in "
            f"{ROUND_SECONDS} s of sync training"
        )
    wall, steps = bunch * workers / run["best"], run["steps"]
    server, others = run["server_cpu_seconds"], run["workers_cpu_seconds"]
    if server is None or others is None:  # no /proc: each side taken as half of the time
        return RoundCosts(wall, wall / 2, wall / 2)
    return RoundCosts(wall, server / steps, others / steps)


def measure_snet_rounds(network: NetworkSpec, bunch: int, apply: float) -> LinkCosts:
    """The link's and the step's costs as snet pays them, from short synchronous runs.

    Compute-free workers train, so a round is each worker's two messages (its update,
    the new weights) and the server's step; the server's and the workers' CPU time per
    round are read from /proc. Each network is run with one and with ``MORE_WORKERS``
    workers: the growth of the server's time per round with the workers is T_d, what
    every further worker costs it (what the model's P workers queue for), and the rest
    is its step (T_h). On a one-unit network that is all per-message and per-step cost;
    on ``network`` the growth over it is two elements' bytes per worker (less ``apply``,
    adding an update up) and one element's per step. With one worker, the rest of a
    one-unit round's wall time (the worker's work and the wake-ups between the two
    messages) is the latency, and the growth of the worker's CPU time over it the bytes
    at the worker's end. CPU time is what a busy machine does not inflate; only the
    latency is read off a clock. Without /proc each side is taken as half of a round's
    wall time.
    """
    tiny = NetworkSpec.parse("1:1:1")
    with tempfile.TemporaryDirectory(prefix="snet-calibrate-") as tmp:
        runs = {
            (spec, count): _sync_rounds(Path(tmp), spec, bunch, count)
            for spec in (tiny, network)
            for count in (1, MORE_WORKERS)
        }

    def per_worker(spec: NetworkSpec) -> float:  # T_d
        return (runs[spec, MORE_WORKERS].server - runs[spec, 1].server) / (MORE_WORKERS - 1)

    def per_step(spec: NetworkSpec) -> float:  # T_h
        return runs[spec, 1].server - per_worker(spec)

    element = ElementLayout.for_network(network).nbytes
    one_tiny, one_full = runs[tiny, 1], runs[network, 1]
    transfer_bytes = per_worker(network) - per_worker(tiny) - element * apply
    return LinkCosts(
        server_per_byte=max(transfer_bytes, 0.0) / (2 * element),
        worker_per_byte=max(one_full.workers - one_tiny.workers, 0.0) / (2 * element),
        server_per_message=max(per_worker(tiny), 0.0) / 2,
        latency_per_message=max(one_tiny.wall - one_tiny.server, 0.0) / 2,
        step_per_byte=max(per_step(network) - per_step(tiny), 0.0) / element,
        step_fixed=max(per_step(tiny), 0.0),
    )


def calibrate(network: NetworkSpec | None = None, bunch: int = 1000) -> Constants:
    """Measure every constant now (about 40 s: four short training runs through snet)."""
    network = network or NetworkSpec.parse("351:1262:45")
    cu = measure_compute(network, bunch)
    apply = measure_apply(network)
    link = measure_snet_rounds(network, bunch, apply)
    return Constants(
        cu_seconds=cu,
        pattern_seconds=0.0,
        link_seconds_per_byte=link.server_per_byte,
        worker_seconds_per_byte=link.worker_per_byte,
        message_seconds=link.server_per_message,
        latency_seconds=link.latency_per_message,
        apply_seconds_per_byte=apply,
        step_seconds_per_byte=link.step_per_byte,
        step_fixed_seconds=link.step_fixed,
        source=f"calibrated {time.strftime('%Y-%m-%d %H:%M')} on {network.describe()}",
    )


if __name__ == "__main__":
    if sys.argv[1] == "--constants":  # snet plan --calibrate: every constant, as JSON
        found = calibrate(NetworkSpec.parse(sys.argv[2]), int(sys.argv[3]))
        print(json.dumps(found.to_dict()))
    else:  # the child of ``measure_compute``: NETWORK BUNCH
        print(repr(_compute_seconds(NetworkSpec.parse(sys.argv[1]), int(sys.argv[2]))))
