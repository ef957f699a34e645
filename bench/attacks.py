"""Replay issue 12's attacks against a live server while two honest workers train.

Run from the repository root::

    .venv/bin/python -m bench.attacks               # the issue's counts; a table on stdout
    .venv/bin/python -m bench.attacks --scale 0.1   # a tenth of every count
    .venv/bin/python -m bench.attacks --out docs/reliability-attacks.md

A server (async, the default job on the bundled data, many epochs) and two honest worker
processes run on 127.0.0.1; the attacker is this process, speaking the wire protocol from
protocol/README.md over raw sockets. Each group of attacks is timed, and for each the
table gives: whether the server is still up, the longest time no step was taken while the
honest workers trained (the freeze), the server's resident memory growth, and the
training rate (weight versions per second) during the attack beside the quiet rate
measured just before it, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

from .hostile_peers import (
    churned_handshakes,
    connection_flood,
    fuzzed_connections,
    fuzzed_frames,
    idle_handshakes,
    idle_readers,
    implausible_updates,
    oversized_prefixes,
    slow_http_clients,
)
from .processes import LocalCluster, ServerHandle

COUNTS = {  # the figures
    "fuzzed connections": 100_000,
    "fuzzed frames after a handshake": 10_000,
    "churned handshakes": 50_000,
    "idle handshakes": 100,
    "idle readers": 30,
    "oversized prefixes": 4,
    "implausible updates": 6,
    "connection flood": 1_000,  # not in the issue: the limits it asked for (docs/security.md)
    "slow HTTP clients": 60,
}
FIXED = ("implausible updates",)  # counts that do not scale


@dataclass
class Row:
    attack: str
    count: int
    seconds: float = 0.0
    alive: bool = True
    freeze: float = 0.0
    rss_growth_mb: float = 0.0
    rate: float = 0.0
    quiet_rate: float = 0.0
    notes: list[str] = field(default_factory=list)


class Watch:
    """Polls /status in a thread: the longest gap between weight versions, and the rate."""

    def __init__(self, server: ServerHandle) -> None:
        self.server = server
        self.stop = threading.Event()
        self.gap = 0.0
        self.samples: list[tuple[float, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last_version, last_change = -1, time.monotonic()
        while not self.stop.is_set():
            try:
                version = int(self.server.status()["weight_version"])
            except OSError:
                version = last_version
            now = time.monotonic()
            self.samples.append((now, version))
            if version != last_version:
                last_version, last_change = version, now
            self.gap = max(self.gap, now - last_change)
            self.stop.wait(0.2)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def rate(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        return (v1 - v0) / max(t1 - t0, 1e-9)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------- the run


def run(scale: float, directory: Path, only: list[str] | None = None) -> list[Row]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows: list[Row] = []
    with LocalCluster(directory, env) as cluster:
        server = cluster.server(["--mode", "async", "--epochs", "1000", "--min-workers", "2"])
        for name in ("honest-1", "honest-2"):
            cluster.worker(server, name, [])
        cluster.wait_for(lambda: server.status()["weight_version"] > 50, 60, "training")
        pid = server.process.pid
        groups: list[tuple[str, Callable[[int], Coroutine[object, object, list[str]]]]] = [
            ("fuzzed connections", lambda n: fuzzed_connections(server.port, n)),
            ("fuzzed frames after a handshake", lambda n: fuzzed_frames(server.port, n)),
            ("churned handshakes", lambda n: churned_handshakes(server.port, n)),
            ("idle handshakes", lambda n: idle_handshakes(server.port, n, 20.0)),
            ("idle readers", lambda n: idle_readers(server.port, n, 20.0)),
            ("oversized prefixes", lambda n: oversized_prefixes(server.port, n, 10.0)),
            ("implausible updates", lambda n: implausible_updates(server.port, n)),
            ("connection flood", lambda n: connection_flood(server.port, n, 30.0)),
            ("slow HTTP clients", lambda n: slow_http_clients(server.http_port, n, 30.0)),
        ]
        groups = [group for group in groups if only is None or group[0] in only]
        for name, attack in groups:
            count = COUNTS[name] if name in FIXED else max(1, int(COUNTS[name] * scale))
            with Watch(server) as quiet:
                time.sleep(3.0)
            row = Row(name, count, quiet_rate=quiet.rate())
            before = rss_mb(pid)
            started = time.monotonic()
            with Watch(server) as watch:
                row.notes = asyncio.run(attack(count))
            row.seconds = time.monotonic() - started
            row.freeze, row.rate = watch.gap, watch.rate()
            row.alive = server.process.poll() is None
            row.rss_growth_mb = rss_mb(pid) - before if row.alive else float("nan")
            rows.append(row)
            print(_line(row), flush=True)
            if not row.alive:
                break
        status = server.status()
        rows[-1].notes.append(
            f"end: {status['updates_rejected']} updates refused, {status['frames_refused']} "
            f"frames refused, {status['handshakes_refused']} handshakes refused, "
            f"{status['connections_refused']} + {status['handshakes_turned_away']} connections "
            f"turned away (total, pending limits), {status['handshakes_timed_out']} handshakes "
            f"timed out, {status['http_connections_refused']} HTTP connections refused"
        )
    return rows


def _line(row: Row) -> str:
    ratio = row.rate / row.quiet_rate if row.quiet_rate else float("nan")
    return (
        f"| {row.attack} | {row.count:,} | {row.seconds:.1f} s | "
        f"{'yes' if row.alive else '**no**'} | {row.freeze:.1f} s | "
        f"{row.rss_growth_mb:+.1f} MB | {row.rate:.0f} / {row.quiet_rate:.0f} ({ratio:.2f}) | "
        f"{'; '.join(row.notes)} |"
    )


def table(rows: list[Row]) -> str:
    head = (
        "| attack | count | took | server up | longest freeze | RSS growth | "
        "versions/s during / quiet (ratio) | notes |\n|---|---:|---:|---|---:|---:|---:|---|"
    )
    return "\n".join([head, *(_line(row) for row in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each count")
    parser.add_argument("--out", help="write the table (Markdown) here too")
    parser.add_argument("--keep", help="run in this directory and keep the processes' logs")
    parser.add_argument("--only", help="these groups only, comma-separated (their names)")
    args = parser.parse_args()
    only = args.only.split(",") if args.only else None
    if only and set(only) - set(COUNTS):
        parser.error(f"unknown groups {sorted(set(only) - set(COUNTS))}; known: {list(COUNTS)}")
    if args.keep:
        rows = run(args.scale, Path(args.keep), only)
    else:
        with tempfile.TemporaryDirectory(prefix="snet-attacks-") as tmp:
            rows = run(args.scale, Path(tmp), only)
    text = table(rows)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
