"""A synchronous round beside an all-reduce: the cost of one data-parallel step's traffic.

snet: a sync-mode server and 2 clients; each round both push a 2 MB update, the server
sums them, steps and sends the new weights back, and both wait for them.
gloo: 2 ``torch.distributed`` processes all-reduce a tensor of the same size over
127.0.0.1 (what PyTorch's DistributedDataParallel does each step).
The figure is rounds (all-reduces) per second of each; snet wins when its rounds are
no slower.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import child_env
from .server_throughput import _elements, _status, start_bench_server

NETWORK = "351:1262:45"


def snet_rounds_per_second(seconds: float, workdir: Path) -> float:
    # both clients join before the first lease, so no round starts with one of them alone
    server, ports = start_bench_server(
        workdir, NETWORK, "round", ["--mode", "sync", "--min-workers", "2"]
    )
    try:
        clients = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.push_client",
                    "--target",
                    "snet",
                    "--sync",
                    "--port",
                    str(ports["port"]),
                    "--seconds",
                    str(seconds + 2),
                    "--elements",
                    str(_elements(NETWORK)),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=child_env(),
            )
            for _ in range(2)
        ]
        time.sleep(1.0)
        first, t0 = _status(ports["http_port"])["steps"], time.perf_counter()
        time.sleep(seconds)
        last, t1 = _status(ports["http_port"])["steps"], time.perf_counter()
        for client in clients:
            client.wait(60)
        return float(last - first) / (t1 - t0)
    finally:
        server.terminate()
        server.wait(30)


_GLOO_WORKER = """
import sys, time, torch, torch.distributed as dist
rank, port, elements, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
tensor = torch.ones(elements)
for _ in range(5):
    dist.all_reduce(tensor)
count = torch.zeros(1)
started = time.perf_counter()
rounds = 0
while True:
    dist.all_reduce(tensor)
    rounds += 1
    count[0] = float(time.perf_counter() - started >= seconds)
    dist.all_reduce(count)  # both stop after the same round
    if count[0] > 0:
        break
if rank == 0:
    print(rounds / (time.perf_counter() - started))
dist.destroy_process_group()
"""


def gloo_rounds_per_second(seconds: float) -> float | None:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _GLOO_WORKER,
                str(rank),
                str(port),
                str(_elements(NETWORK)),
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    rate: float = float(outputs[0].strip().splitlines()[-1])
    return rate


def run_round_bench(seconds: float = 3.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="snet-round-") as tmp:
        snet = snet_rounds_per_second(seconds, Path(tmp))
    gloo = gloo_rounds_per_second(seconds)
    return {
        "network": NETWORK,
        "element_mb": round(_elements(NETWORK) * 4 / 1e6, 2),
        "snet_rounds_per_s": round(snet, 1),
        "gloo_allreduce_per_s": None if gloo is None else round(gloo, 1),
        "ratio": None if gloo is None else round(snet / gloo, 3),
    }


if __name__ == "__main__":
    print(json.dumps(run_round_bench(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)))
