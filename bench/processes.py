"""Real snet processes on 127.0.0.1 for benchmarks, and the synthetic data they train on.

``LocalCluster`` starts a server and workers as separate processes (``python -m
snet.cli``), logs each to a file, and stops every process it started when it leaves its
``with`` block, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from snet.protocol.network import NetworkSpec
from snet.transport.cpu_time import own_cpu_seconds

START_SECONDS = 60.0
WARMUP_STEPS = 5  # steps trained before measuring starts
UTTERANCE_FRAMES = 1000


def synthetic_corpus(
    path: Path, network: NetworkSpec, frames: int = 500_000, seed: int = 0
) -> tuple[Path, int]:
    """Write random frames for ``network`` to ``path``; return it with the context to use.

    A pattern is a window of 2 * context + 1 frames; as in Quicknet's usual set-up (39
    features, 9 frames for 351 inputs) the window is the largest odd divisor of the input
    size up to 9, because a wide window makes the worker's data checks costly per lease.
    """
    inputs = network.input_size
    window = max(w for w in (1, 3, 5, 7, 9) if inputs % w == 0)
    rng = np.random.default_rng(seed)
    utterances = max(frames // UTTERANCE_FRAMES, 20)
    lengths = np.full(utterances, UTTERANCE_FRAMES, dtype=np.int64)
    x = rng.standard_normal((utterances * UTTERANCE_FRAMES, inputs // window), dtype=np.float32)
    # a label per frame, every class present (the data must have as many classes as the
    # network has outputs)
    y = rng.permutation(np.arange(len(x)) % network.output_size)
    np.savez(path, X=x, y=y, lengths=lengths)
    return path, (window - 1) // 2


def cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float | None:
    """CPU time (user + system) the processes have used, or None without /proc."""
    total = 0.0
    for process in processes:
        seconds = own_cpu_seconds(process.pid)
        if seconds is None:
            return None
        total += seconds
    return total


@dataclass
class ServerHandle:
    process: subprocess.Popen[bytes]
    port: int
    http_port: int
    log: Path

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            document: dict[str, Any] = json.loads(response.read())
            return document


class LocalCluster:
    """A server and workers as processes on 127.0.0.1, all stopped on exit."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.processes: list[subprocess.Popen[bytes]] = []
        self.server_handle: ServerHandle | None = None

    def __enter__(self) -> LocalCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.directory / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "snet.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.directory,
            )
        self.processes.append(process)
        return process

    def server(self, job_flags: list[str]) -> ServerHandle:
        """Start a server on free ports and wait for its ready file."""
        ready = self.directory / "server.ready"
        args = ["server", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"]
        args += ["--ready-file", str(ready), "--out-dir", str(self.directory / "out")]
        process = self._spawn([*args, "--log-level", "warning", *job_flags], "server")
        log = self.directory / "server.log"

        def started() -> dict[str, Any] | None:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited early:\n{log.read_text()[-3000:]}")
            return json.loads(ready.read_text()) if ready.exists() else None

        info = self.wait_for(started, START_SECONDS, "the server's ready file")
        self.server_handle = ServerHandle(process, info["port"], info["http_port"], log)
        return self.server_handle

    def worker(self, server: ServerHandle, name: str, flags: list[str]) -> None:
        args = ["worker", "--server", f"127.0.0.1:{server.port}", "--name", name]
        self._spawn([*args, "--log-level", "warning", "--retry-seconds", "10", *flags], name)

    def spert(self, server: ServerHandle, name: str, flags: list[str]) -> subprocess.Popen[bytes]:
        """An emulated Spert-II board (``snet spert``) as a worker process."""
        args = ["spert", "--server", f"127.0.0.1:{server.port}", "--name", name]
        return self._spawn([*args, "--log-level", "info", "--retry-seconds", "10", *flags], name)

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() not in (None, 0):
                    raise RuntimeError(f"a process exited with {process.returncode}: {what}")
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    def close(self) -> None:
        """SIGTERM the server (workers get a goodbye), then the workers (a server that
        stops is one to wait for, so they would retry), then kill whatever is left."""
        if self.server_handle is not None and self.server_handle.process.poll() is None:
            self.server_handle.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server_handle.process.wait(10)
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for process in self.processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def sample_patterns(
    server: ServerHandle, seconds: float, interval: float = 0.05
) -> list[tuple[float, int]]:
    """(time, patterns applied) whenever /status shows a new count, for ``seconds``."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + seconds
    while (asked := time.monotonic()) < deadline:
        patterns = server.status()["patterns_processed"]
        if not samples or patterns != samples[-1][1]:
            # the count is of some moment between the request and the answer
            samples.append(((asked + time.monotonic()) / 2, patterns))
        time.sleep(interval)
    return samples


def best_rate(samples: list[tuple[float, int]], min_span: float) -> tuple[float, float]:
    """(best, mean) patterns per second: the best over windows of at least ``min_span``
    seconds between two readings that showed a new count, and the mean over them all.

    Other processes on a shared machine only ever slow training down, so the best window
    is the closest to the undisturbed rate the model predicts; starting and ending windows
    where the count changed keeps the error of a window within one polling interval.
    """
    if len(samples) < 2:
        raise RuntimeError("training made no progress while it was measured")
    (t0, p0), (t1, p1) = samples[0], samples[-1]
    mean = (p1 - p0) / (t1 - t0)
    best = mean
    for i, (ti, pi) in enumerate(samples):
        for tj, pj in samples[i + 1 :]:
            if tj - ti >= min_span:
                best = max(best, (pj - pi) / (tj - ti))
    return best, mean


def modelled_env(cu_seconds: float, time_scale: float) -> dict[str, str]:
    """This process's environment with the modelled backend's parameters set."""
    env = dict(os.environ)
    env["SNET_MODELLED_CU_SECONDS"] = repr(cu_seconds)
    env["SNET_MODELLED_TIME_SCALE"] = repr(time_scale)
    env.pop("SNET_MODELLED_C1", None)
    env.pop("SNET_MODELLED_C2", None)
    return env


def _cpu_pair(
    server: subprocess.Popen[bytes], workers: list[subprocess.Popen[bytes]]
) -> tuple[float | None, float | None]:
    return cpu_seconds([server]), cpu_seconds(workers)


def train_modelled(
    directory: Path,
    env: dict[str, str],
    job_flags: list[str],
    workers: int,
    seconds: float,
) -> dict[str, Any]:
    """Train with ``workers`` modelled workers; patterns per second over ``seconds``.

    Returns the best and mean rate (``best_rate``), the samples' span, the steps taken,
    the server's and the workers' CPU seconds over it (None where /proc is missing), and
    the last /status.
    """
    with LocalCluster(directory, env) as cluster:
        server = cluster.server(job_flags)
        for index in range(workers):
            cluster.worker(server, f"w{index}", ["--backend", "modelled"])
        cluster.wait_for(
            lambda: server.status()["workers_live"] == workers, START_SECONDS, "the workers"
        )
        base = server.status()["weight_version"]
        cluster.wait_for(
            lambda: server.status()["weight_version"] >= base + WARMUP_STEPS,
            START_SECONDS,
            "the first steps",
        )
        others = [p for p in cluster.processes if p is not server.process]
        first, cpu_first = server.status(), _cpu_pair(server.process, others)
        samples = sample_patterns(server, seconds)
        last, cpu_last = server.status(), _cpu_pair(server.process, others)
    best, mean = best_rate(samples, seconds / 2)
    pairs = zip(cpu_first, cpu_last, strict=True)
    cpu = [None if a is None or b is None else b - a for a, b in pairs]
    return {
        "best": best,
        "mean": mean,
        "seconds": samples[-1][0] - samples[0][0],
        "patterns": samples[-1][1] - samples[0][1],
        "steps": last["steps"] - first["steps"],
        "server_cpu_seconds": cpu[0],
        "workers_cpu_seconds": cpu[1],
        "status": last,
    }


def job_flags(
    mode: str, network: NetworkSpec, bunch: int, data: Path, context: int, chunk_bunches: int = 4
) -> list[str]:
    """The server's job: many epochs of the synthetic corpus, chunks of ``chunk_bunches``."""
    flags = {
        "--mode": mode,
        "--network": network.describe(),
        "--bunch-size": str(bunch),
        "--chunk-frames": str(chunk_bunches * bunch),
        "--epochs": "1000",
        "--data": str(data),
        "--context": str(context),
    }
    return [item for pair in flags.items() for item in pair]
