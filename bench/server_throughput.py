"""Server throughput: update elements pushed by 1, 2 and 4 clients on 127.0.0.1.

For each element size, the same clients push the same elements (a) through a real
``snet server`` (async mode, one step per N updates, the new weights sent back to every
client after each step) and (b) into ``plain_sink``, a thread per connection doing
nothing but ``recv_into``. The figure is (a)/(b): how close the server's receive path
(BufferedProtocol into pooled elements, validation, the update rule, the broadcast) comes
to the socket's own limit. The server always has a backlog here, so it fuses the steps
queued behind a running one (``steps_per_pass`` says how many, on average).

Each side's CPU time per element is measured too: the server's (from /proc) or the
sink's, and the clients' (their own process time). The clients, the server and the sink
all share this machine's cores, so ``cores / (CPU per element)`` is the most elements per
second snet could carry here however well it overlapped its work; over the plain figure
that is ``cpu_bound_ratio``, the best ratio the measured CPU cost allows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snet.protocol.network import NetworkSpec

from . import child_env
from .processes import cpu_seconds, synthetic_corpus

SIZES = {"164kB": "39:500:42", "2MB": "351:1262:45"}
WARMUP_SECONDS = 1.0


def synthetic_data(workdir: Path, network: str) -> tuple[Path, int]:
    """Random frames for ``network`` (written once per network); returns path and context."""
    path = workdir / f"frames-{network.replace(':', '-')}.npz"
    context_file = path.with_suffix(".context")
    if not path.exists():
        _, context = synthetic_corpus(path, NetworkSpec.parse(network), frames=300_000)
        context_file.write_text(str(context))
    return path, int(context_file.read_text())


def _elements(network: str) -> int:
    return NetworkSpec.parse(network).connections


def _status(http_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=10) as reply:
        document: dict[str, Any] = json.load(reply)
        return document


def _start_clients(
    target: str, port: int, clients: int, seconds: float, elements: int
) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.push_client",
                "--target",
                target,
                "--port",
                str(port),
                "--seconds",
                str(seconds),
                "--elements",
                str(elements),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for _ in range(clients)
    ]


def start_bench_server(
    workdir: Path, network: str, name: str, job_flags: list[str]
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """A ``snet server`` on synthetic frames for ``network``; returns it and its ports."""
    data, context = synthetic_data(workdir, network)
    ready = workdir / f"ready-{name}"
    server = subprocess.Popen(
        [sys.executable, "-m", "snet.cli", "server", "--port", "0", "--http-port", "0",
         "--ready-file", str(ready), "--out-dir", str(workdir / "out"),
         "--log-level", "warning", "--data", str(data), "--context", str(context),
         "--network", network, "--epochs", "1000", "--bunch-size", "1",
         "--chunk-frames", "20000", *job_flags],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists():
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return server, json.loads(ready.read_text())


def through_server(network: str, clients: int, seconds: float, workdir: Path) -> dict[str, float]:
    server, ports = start_bench_server(
        workdir, network, f"{network.replace(':', '-')}-{clients}",
        ["--mode", "async", "--updates-per-step", str(clients)],
    )  # fmt: skip
    try:
        elements = _elements(network)
        pushers = _start_clients(
            "snet", ports["port"], clients, seconds + 2 * WARMUP_SECONDS, elements
        )
        time.sleep(WARMUP_SECONDS)
        first, t0, cpu0 = _status(ports["http_port"]), time.perf_counter(), cpu_seconds([server])
        time.sleep(seconds)
        last, t1, cpu1 = _status(ports["http_port"]), time.perf_counter(), cpu_seconds([server])
        sent = _client_results(pushers)
        applied = last["updates_applied"] - first["updates_applied"]
        per_second = applied / (t1 - t0)
        passes = max(last["step_passes"] - first["step_passes"], 1)
        return {
            "elements_per_s": per_second,
            "gb_per_s": per_second * elements * 4 / 1e9,
            "steps_per_pass": (last["steps"] - first["steps"]) / passes,
            "receiver_ms": _per_element(cpu0, cpu1, applied),
            "senders_ms": _senders_ms(sent),
        }
    finally:
        server.terminate()
        server.wait(30)


def through_plain_socket(network: str, clients: int, seconds: float) -> dict[str, float]:
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.plain_sink"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert sink.stdout is not None and sink.stdin is not None
    port = int(sink.stdout.readline())
    elements = _elements(network)
    pushers = _start_clients("plain", port, clients, seconds, elements)
    try:
        sent = _client_results(pushers)
        sink.stdin.close()
        received = json.loads(sink.stdout.readline())
        sink.wait(30)
    finally:  # a failed client must not leave the sink waiting for its stdin
        if sink.poll() is None:
            sink.kill()
            sink.wait(30)
    # Connections overlap in time: the aggregate rate is total bytes over the longest span.
    results = received["connections"]
    total = sum(r["bytes"] for r in results)
    if total == 0:
        raise RuntimeError(f"the plain sink received nothing from {clients} client(s)")
    span = max(r["seconds"] for r in results)
    return {
        "elements_per_s": total / (elements * 4) / span,
        "gb_per_s": total / span / 1e9,
        "receiver_ms": received["cpu_seconds"] * 1e3 / (total / (elements * 4)),
        "senders_ms": _senders_ms(sent),
    }


def _client_results(pushers: list[subprocess.Popen[str]]) -> list[dict[str, float]]:
    """Each pushing client's JSON line; a client that failed is a clear error."""
    results = []
    for pusher in pushers:
        output = pusher.communicate(timeout=60)[0]
        if pusher.returncode != 0 or not output.strip():
            raise RuntimeError(f"a push client failed (exit {pusher.returncode}); see above")
        results.append(json.loads(output))
    return results


def _per_element(cpu_before: float | None, cpu_after: float | None, count: int) -> float | None:
    """Milliseconds of CPU per element, or None without /proc."""
    if cpu_before is None or cpu_after is None or count <= 0:
        return None
    return (cpu_after - cpu_before) * 1e3 / count


def _senders_ms(sent: list[dict[str, float]]) -> float:
    """The pushing clients' CPU per element sent, in milliseconds."""
    return sum(r["cpu_seconds"] for r in sent) * 1e3 / max(sum(r["sent"] for r in sent), 1)


def usable_cores() -> int:
    """The CPUs this process may run on (a container's or a taskset's share, not the
    machine's count), which the server, the sink and the clients all share."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_bound(row: Mapping[str, float | None], cores: int) -> float | None:
    """Elements per second that ``cores`` fully busy could carry at the measured CPU per
    element of the receiver and the senders together (everything here shares them)."""
    receiver, senders = row.get("receiver_ms"), row.get("senders_ms")
    if receiver is None or senders is None or receiver + senders <= 0:
        return None
    return cores * 1e3 / (receiver + senders)


def run_server_bench(
    seconds: float = 3.0, client_counts: tuple[int, ...] = (1, 2, 4)
) -> list[dict[str, Any]]:
    """Rows of {size, clients, snet GB/s, plain GB/s, ratio}."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="snet-bench-") as tmp:
        for label, network in SIZES.items():
            for clients in client_counts:
                snet = through_server(network, clients, seconds, Path(tmp))
                plain = through_plain_socket(network, clients, seconds)
                cores = usable_cores()
                snet_bound = cpu_bound(snet, cores)
                rows.append(
                    {
                        "element": label,
                        "network": network,
                        "clients": clients,
                        "snet_elements_per_s": round(snet["elements_per_s"], 1),
                        "steps_per_pass": round(snet["steps_per_pass"], 2),
                        "snet_gb_per_s": round(snet["gb_per_s"], 3),
                        "plain_gb_per_s": round(plain["gb_per_s"], 3),
                        "ratio": round(snet["gb_per_s"] / plain["gb_per_s"], 3),
                        # CPU per element (ms): the server or sink, and all the clients
                        "snet_cpu_ms": _rounded(snet["receiver_ms"], snet["senders_ms"]),
                        "plain_cpu_ms": _rounded(plain["receiver_ms"], plain["senders_ms"]),
                        # the best ratio this machine's cores allow at snet's CPU cost
                        "cpu_bound_ratio": None
                        if snet_bound is None
                        else round(snet_bound / plain["elements_per_s"], 3),
                    }
                )
    return rows


def _rounded(*values: float | None) -> list[float | None]:
    return [None if v is None else round(v, 3) for v in values]


if __name__ == "__main__":
    for row in run_server_bench(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0):
        print(json.dumps(row), flush=True)
