"""What TLS costs the server per 2 MB update element, measured in one run.

Run from the repository root::

    .venv/bin/python -m bench.tls_cost            # 3 rounds of 5 s each way; a table
    .venv/bin/python -m bench.tls_cost --rounds 5 --seconds 8

A ``snet server`` (async, one step per update, the new weights sent back after each step,
on synthetic frames for the 2 MB network of bench/server_throughput.py) is pushed updates
by one client as fast as it takes them, over plain TCP and over TLS (a private CA made
with ``snet tls init``'s code), in alternating rounds so that the machine's load falls on
both alike. For each the table gives the updates applied per second, the server's CPU
time per applied update (from /proc: user and system, every thread), and the pushing
client's. Behind TLS the server copies what it receives into its frame buffers and what
it sends out of them (docs/security.md says why); the difference between the two rows is
that copy plus the cipher, both ways (each update in, each new weights out).

The client is this module run as ``--client``: one asyncio connection (plain or TLS
alike, so that only the transport differs) that handshakes, then sends valid one-pattern
updates on the leases it is given, and reads (and discards) whatever the server sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from snet.protocol import PROTOCOL_VERSION
from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import encode_bytes
from snet.protocol.messages import Hello, Lease, ServerHello, Update, Weights, Welcome
from snet.protocol.network import NetworkSpec
from snet.transport.certificates import make_cluster_certificates
from snet.transport.tls import client_context

from . import child_env
from .processes import cpu_seconds
from .server_throughput import SIZES, start_bench_server

NETWORK = SIZES["2MB"]
WARMUP_UPDATES = 20


# ---------------------------------------------------------------- the pushing client


async def push(port: int, seconds: float, ca: str) -> dict[str, float]:
    """Push updates for ``seconds``; returns how many and the CPU time they took."""
    tls = client_context(ca) if ca else None
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls else None
    )
    decoder = FrameDecoder()
    leases: list[Lease] = []
    state = {"version": 0, "welcomed": False, "hello": False}
    arrived = asyncio.Event()

    async def read() -> None:
        while data := await reader.read(1 << 22):
            for message in decoder.feed(data):
                if isinstance(message, ServerHello):
                    state["hello"] = True
                elif isinstance(message, Welcome):
                    state["welcomed"] = True
                elif isinstance(message, Weights):
                    state["version"] = message.version
                elif isinstance(message, Lease):
                    leases.append(message)
            arrived.set()

    async def until(what: str) -> None:
        while not (leases if what == "lease" else state[what]):
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 30)

    reading = asyncio.get_running_loop().create_task(read())
    await until("hello")
    writer.write(encode_bytes(Hello(PROTOCOL_VERSION, "tls-cost", "bench", (), b"")))
    await until("welcomed")
    await until("lease")
    element = np.full(NetworkSpec.parse(NETWORK).connections, 1e-6, np.float32)  # not zeros
    sent, started, cpu = 0, time.perf_counter(), time.process_time()
    lease, offset = leases.pop(0), 0
    while time.perf_counter() - started < seconds:
        if offset >= len(lease.indices):
            await until("lease")
            lease, offset = leases.pop(0), 0
        update = Update(int(state["version"]), lease.lease_id, offset, 1, 0.0, 0, 0.0, element)
        writer.write(encode_bytes(update))
        await writer.drain()
        offset, sent = offset + 1, sent + 1
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    reading.cancel()
    writer.close()
    return {"sent": sent, "seconds": elapsed, "cpu_seconds": cpu}


# ---------------------------------------------------------------- the measurement


def _status(http_port: int, ca: str) -> dict[str, Any]:
    scheme = "https" if ca else "http"
    context = ssl.create_default_context(cafile=ca) if ca else None
    url = f"{scheme}://127.0.0.1:{http_port}/status"
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        document: dict[str, Any] = json.load(reply)
        return document


def _cpu(process: subprocess.Popen[Any]) -> float:
    seconds = cpu_seconds([process])
    if seconds is None:
        raise RuntimeError("no /proc here: CPU time cannot be measured")
    return seconds


def one_round(workdir: Path, certs: Path | None, seconds: float, name: str) -> dict[str, float]:
    """Server CPU per applied update, over TLS when ``certs`` is given."""
    tls_flags = []
    ca = ""
    if certs is not None:
        tls_flags = ["--tls-cert", str(certs / "server.pem"), "--tls-key"]
        tls_flags.append(str(certs / "server.key"))
        ca = str(certs / "ca.pem")
    server, ports = start_bench_server(
        workdir,
        NETWORK,
        name,
        ["--mode", "async", "--updates-per-step", "1", "--fresh", *tls_flags],
    )
    client = subprocess.Popen(
        [sys.executable, "-m", "bench.tls_cost", "--client", "--port", str(ports["port"]),
         "--seconds", "600", "--ca", ca],
        stdout=subprocess.DEVNULL, env=child_env(),
    )  # fmt: skip
    try:
        # Measure from the moment updates flow (a client starting on a busy machine may
        # take seconds), over the same window for both processes.
        deadline = time.monotonic() + 60
        while _status(ports["http_port"], ca)["updates_applied"] < WARMUP_UPDATES:
            if time.monotonic() > deadline or client.poll() is not None:
                raise RuntimeError(f"no updates applied (client exit {client.poll()})")
            time.sleep(0.2)
        first, t0 = _status(ports["http_port"], ca), time.perf_counter()
        cpu0 = _cpu(server), _cpu(client)
        time.sleep(seconds)
        last, t1 = _status(ports["http_port"], ca), time.perf_counter()
        cpu1 = _cpu(server), _cpu(client)
        applied = max(last["updates_applied"] - first["updates_applied"], 1)
        return {
            "updates_per_s": applied / (t1 - t0),
            "server_ms": (cpu1[0] - cpu0[0]) * 1e3 / applied,
            "client_ms": (cpu1[1] - cpu0[1]) * 1e3 / applied,
        }
    finally:
        client.kill()
        client.wait(30)
        server.terminate()
        server.wait(30)


def run(rounds: int, seconds: float) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {"plain": [], "tls": []}
    with tempfile.TemporaryDirectory(prefix="snet-tls-cost-") as tmp:
        workdir = Path(tmp)
        certs = workdir / "certs"
        make_cluster_certificates(certs, ["127.0.0.1", "localhost"])
        for index in range(rounds):
            for kind in ("plain", "tls"):
                # a name of its own: start_bench_server waits for this round's ready file
                row = one_round(workdir, certs if kind == "tls" else None, seconds,
                                f"{kind}-{index}")  # fmt: skip
                results[kind].append(row)
                print(kind, json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    summary: dict[str, Any] = {"network": NETWORK, "rounds": rounds, "seconds": seconds}
    for kind, rows in results.items():
        summary[kind] = {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
    tls_ms, plain_ms = summary["tls"]["server_ms"], summary["plain"]["server_ms"]
    summary["server_ms_ratio"] = round(tls_ms / plain_ms, 2)
    summary["server_ms_added"] = round(tls_ms - plain_ms, 3)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(push(args.port, args.seconds, args.ca))), flush=True)
        return
    print(json.dumps(run(args.rounds, args.seconds), indent=1))


if __name__ == "__main__":
    main()
