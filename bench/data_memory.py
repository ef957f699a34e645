"""Resident memory of N workers on one machine training on the same data.

Starts a server and N numpy workers on 127.0.0.1 and samples each worker's
``/proc/PID/smaps_rollup`` while they train: RSS (every page it maps, shared ones too),
PSS (shared pages divided among the processes that map them: the honest share), private
memory (its own pages alone), each the largest of samples taken every 0.5 s, and the
kernel's high-water mark of RSS (``VmHWM``, transient peaks included). Usage::

    python -m bench.data_memory --workers 4 -- --data train.npz --cv-data test.npz \\
        --context 0 --network 784:256:10 --epochs 1

Everything after ``--`` goes to ``snet server``. Workers use ``--data-cache DIR``
(``--cache`` here; ``none`` turns the shared cache off, for the figures before it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def memory_of(pid: int) -> dict[str, int]:
    """RSS, PSS and private kB of a process (``smaps_rollup``)."""
    figures: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        figures[key] = int(value.split()[0])
    private = figures.get("Private_Clean", 0) + figures.get("Private_Dirty", 0)
    status = Path(f"/proc/{pid}/status").read_text()
    high_water = next(int(line.split()[1]) for line in status.splitlines() if "VmHWM" in line)
    return {
        "rss_kb": figures["Rss"],
        "pss_kb": figures["Pss"],
        "private_kb": private,
        "peak_rss_kb": high_water,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cache", default="", help="the workers' --data-cache")
    parser.add_argument("--seconds", type=float, default=600.0, help="the most to wait")
    parser.add_argument("server_args", nargs="*")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="snet-memory-"))
    snet = [sys.executable, "-m", "snet.cli"]
    ready = work / "ready.json"
    server = subprocess.Popen(
        [*snet, "server", "--port", "0", "--http-port", "0", "--ready-file", str(ready),
         "--out-dir", str(work / "out"), "--min-workers", str(args.workers), *args.server_args],
        stderr=open(work / "server.log", "wb"),  # noqa: SIM115 - lives as long as the server
    )  # fmt: skip
    workers: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + args.seconds
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit((work / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        ports = json.loads(ready.read_text())
        cache = ["--data-cache", args.cache] if args.cache else []
        address = f"127.0.0.1:{ports['port']}"
        for number in range(args.workers):
            command = [*snet, "worker", "--server", address, "--backend", "numpy", *cache]
            log = open(work / f"w{number}.log", "wb")  # noqa: SIM115 - lives with the worker
            workers.append(subprocess.Popen([*command, "--name", f"w{number}"], stderr=log))
        peak: dict[int, dict[str, int]] = {}
        url = f"http://127.0.0.1:{ports['http_port']}/status"
        trained_for = 0
        while server.poll() is None and time.monotonic() < deadline and trained_for < 20:
            for worker in workers:
                if worker.poll() is None:
                    now = memory_of(worker.pid)
                    old = peak.setdefault(worker.pid, now)
                    peak[worker.pid] = {k: max(old[k], now[k]) for k in now}
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    patterns = json.loads(response.read())["patterns_processed"]
            except OSError:
                patterns = 0
            trained_for += patterns > 0  # sample a while once training is under way
            time.sleep(0.5)
        totals = {k: sum(p[k] for p in peak.values()) for k in next(iter(peak.values()))}
        report = {"workers": args.workers, "cache": args.cache, "peak_per_worker": peak,
                  "sum_of_peaks_mb": {k: round(v / 1024) for k, v in totals.items()}}  # fmt: skip
        print(json.dumps(report, indent=1))
    finally:
        for process in [*workers, server]:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in [*workers, server]:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
