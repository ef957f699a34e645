"""Server throughput: update elements pushed by 1, 2 and 4 clients on 127.0.0.1.

For each element size, the same clients push the same elements (a) through a real
``snet server`` (async mode, one step per N updates, the new weights sent back to every
client after each step) and (b) into ``plain_sink``, a thread per connection doing
nothing but ``recv_into``. The figure is (a)/(b): how close the server's receive path
(BufferedProtocol into pooled elements, validation, the update rule, the broadcast) comes
to the socket's own limit. The server always has a backlog here, so it fuses the steps
queued behind a running one (``steps_per_pass`` says how many, on average).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from snet.protocol.network import NetworkSpec

from .processes import synthetic_corpus

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
                "snet.bench.push_client",
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
        first, t0 = _status(ports["http_port"]), time.perf_counter()
        time.sleep(seconds)
        last, t1 = _status(ports["http_port"]), time.perf_counter()
        for pusher in pushers:
            pusher.wait(60)
        per_second = (last["updates_applied"] - first["updates_applied"]) / (t1 - t0)
        passes = max(last["step_passes"] - first["step_passes"], 1)
        return {
            "elements_per_s": per_second,
            "gb_per_s": per_second * elements * 4 / 1e9,
            "steps_per_pass": (last["steps"] - first["steps"]) / passes,
        }
    finally:
        server.terminate()
        server.wait(30)


def through_plain_socket(network: str, clients: int, seconds: float) -> dict[str, float]:
    sink = subprocess.Popen(
        [sys.executable, "-m", "snet.bench.plain_sink"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None and sink.stdin is not None
    port = int(sink.stdout.readline())
    elements = _elements(network)
    pushers = _start_clients("plain", port, clients, seconds, elements)
    for pusher in pushers:
        pusher.wait(60)
    sink.stdin.close()
    results = json.loads(sink.stdout.readline())
    sink.wait(30)
    # Connections overlap in time: the aggregate rate is total bytes over the longest span.
    total = sum(r["bytes"] for r in results)
    span = max(r["seconds"] for r in results)
    return {"elements_per_s": total / (elements * 4) / span, "gb_per_s": total / span / 1e9}


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
                    }
                )
    return rows


if __name__ == "__main__":
    for row in run_server_bench(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0):
        print(json.dumps(row), flush=True)
