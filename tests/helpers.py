"""Helpers that start real snet processes on 127.0.0.1 and always clean them up.

Every process a test starts goes through here (``Cluster`` for servers and workers,
``run_process`` and ``Cluster.run`` for commands that run to their end, ``DrivenProcess``
and ``Cluster.drive`` for one the test drives itself: signals, pipes, a terminal), and
each one's output is scanned for tracebacks when it has stopped (output_checks.py): a
"Traceback (most recent call last)" or "Task exception was never retrieved" fails the test
with the log's excerpt, unless the test said it expects one (``expect_traceback``).
test_rings.py keeps it so: no other test module starts a process itself.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from output_checks import check_output

START_SECONDS = 30.0
SMALL_JOB = ["--network", "117:64:10", "--chunk-frames", "4096"]
# SMALL_JOB in bunches of 512: an epoch in 95 updates rather than 379, for tests whose
# subject is what the server and workers do, not how well the net learns (it still does:
# 67% of the CV frames after one sequential epoch, 75% after two). The in-process ring's
# time goes mostly into the per-update work of the server and workers on one loop.
QUICK_JOB = [*SMALL_JOB, "--bunch-size", "512"]
PROCESSES_ALLOWED = False  # set per test by conftest.py: only the system ring's tests may


def _allowed(argv: Sequence[str]) -> None:
    if not PROCESSES_ALLOWED:
        raise AssertionError(
            f"a test outside the system ring started {' '.join(argv)[:100]}: mark it system"
        )


def run_process(
    argv: Sequence[str], *, expect_traceback: str | None = None, **options: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv)`` with its output captured as text and scanned for
    tracebacks once it has ended; ``options`` as for ``subprocess.run`` (a timeout of 60 s
    unless given; ``stdout`` or ``stderr`` sent elsewhere, e.g. into a pipe whose reader
    has gone, and the other is still captured; ``check`` only after the scan, so that a
    traceback is shown rather than the exit status alone)."""
    _allowed(argv)
    options.setdefault("timeout", 60)
    check = options.pop("check", False)
    if "stdout" in options or "stderr" in options:
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
    else:
        options["capture_output"] = True
    done = subprocess.run(list(argv), text=True, **options)
    output = (done.stdout or "") + (done.stderr or "")
    check_output(" ".join(argv)[:200], output, expect_traceback)
    if check:
        done.check_returncode()
    return done


class _Recorded:
    """A driven process's pipe, keeping what the test reads from it for the scan."""

    def __init__(self, stream: IO[Any], seen: list[str | bytes]) -> None:
        self._stream = stream
        self._seen = seen

    def _keep(self, data: Any) -> Any:
        self._seen.append(data)
        return data

    def read(self, *size: int) -> Any:
        return self._keep(self._stream.read(*size))

    def readline(self, *size: int) -> Any:
        return self._keep(self._stream.readline(*size))

    def readlines(self, *hint: int) -> list[Any]:
        lines: list[Any] = self._stream.readlines(*hint)
        self._seen.extend(lines)
        return lines

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __getattr__(self, name: str) -> Any:  # fileno, close, closed, encoding, ...
        return getattr(self._stream, name)


class DrivenProcess(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen(argv, **options)`` for a test that drives the process itself
    (signals it, reads its pipes, gives it a terminal), used as ``with DrivenProcess(...)
    as process:``. When the block ends (or ``stop()`` is called) it is killed if still
    running and waited for, and then its output is scanned for tracebacks as
    ``run_process`` scans a finished command's: what the test read from its pipes (by
    ``readline``, iteration, ``read`` or ``communicate``), what it left unread in them,
    and the files in ``logs`` (where the test sent its output: a file is not a pipe)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        logs: Sequence[Path] = (),
        expect_traceback: str | None = None,
        **options: Any,
    ) -> None:
        _allowed(argv)
        self.name = " ".join(argv)[:200]
        self.logs = list(logs)
        self.expect_traceback = expect_traceback
        self.seen: list[str | bytes] = []
        self.scanned = False
        super().__init__(list(argv), **options)
        if self.stdout is not None:
            self.stdout = _Recorded(self.stdout, self.seen)  # type: ignore[assignment]
        if self.stderr is not None:
            self.stderr = _Recorded(self.stderr, self.seen)  # type: ignore[assignment]

    def communicate(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out, err = super().communicate(*args, **kwargs)
        self.seen.extend(part for part in (out, err) if part)
        return out, err

    def output(self) -> str:
        """Everything of its output seen so far: read from its pipes, then its logs."""
        parts = [p.decode(errors="replace") if isinstance(p, bytes) else p for p in self.seen]
        parts += [log.read_text(errors="replace") for log in self.logs if log.exists()]
        return "".join(parts)

    def stop(self) -> None:
        """Kill it if it still runs, wait for it, read what is left in its pipes, and
        fail if its output holds a traceback (once: later calls do nothing)."""
        if self.scanned:
            return
        self.scanned = True
        if self.poll() is None:
            self.kill()
        self.wait(10)
        if self.stdin is not None:
            self.stdin.close()
        for stream in (self.stdout, self.stderr):
            if stream is not None and not stream.closed:
                stream.read()  # to its end: the process has exited
                stream.close()
        check_output(self.name, self.output(), self.expect_traceback)

    def __enter__(self) -> DrivenProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy, or
    fail. (A predicate that starts a process each time wants a longer interval: each start
    costs a few tenths of a second of the CPU the processes under test need.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server restarted on the same port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    http_port: int
    out_dir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            body: bytes = response.read()
            return body

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.get("/status"))
        return document

    def final_status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.out_dir / "status.json").read_text())
        return document

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"server did not exit in {timeout} s; log:\n{self.log.read_text()[-3000:]}"
            ) from None


def system_ring_environment() -> dict[str, str]:
    """The environment of the processes a ``Cluster`` starts: the test run's, with the
    workers on numpy's step (``SNET_KERNELS=numpy``, what an install without the ``fast``
    extra runs) unless the run sets it. A worker loads
    the compiled step in 0.8 s of CPU at start-up, more than most of these tests' workers
    then train, and the system ring starts over a hundred of them: 31 % of its time (202 s
    against 140 s, two at a time). The compiled step is tested against numpy's in the fast
    ring, which trains with it in-process, and in real processes by the tests that run
    ``snet`` as a user does (``run_snet``: the demo, ``snet train``; test_user_data.py's
    pass this environment: their subject is the data) and by those that set
    ``cluster.env["SNET_KERNELS"]``. (The product itself now trains a job too small to
    pay for the load with numpy's step, client/kernel_choice.py: this keeps the ring's
    few longer jobs on numpy's step too.)"""
    return {"SNET_KERNELS": "numpy", **os.environ}


@dataclass
class Cluster:
    """Starts servers and workers as real processes; kills whatever is left at teardown."""

    tmp_path: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)  # the log of each of ``processes``
    env: dict[str, str] = field(default_factory=lambda: system_ring_environment())
    expected_tracebacks: dict[Path, str] = field(default_factory=dict)
    driven: list[DrivenProcess] = field(default_factory=list)  # stopped and scanned at close

    def _spawn(
        self, args: list[str], log: Path, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """``snet ARGS`` as a process (``prefix`` e.g. runs it in a network namespace)."""
        argv = [*prefix, sys.executable, "-m", "snet.cli", *args]
        _allowed(argv)
        handle = open(log, "wb")  # noqa: SIM115 - closed with the process at teardown
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.tmp_path,
        )
        self.processes.append(process)
        self.logs.append(log)
        return process

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``snet ARGS`` run to its end, in this cluster's directory and environment."""
        return run_process(
            [sys.executable, "-m", "snet.cli", *args],
            timeout=timeout,
            env=self.env,
            cwd=self.tmp_path,
        )

    def drive(self, *args: str, **options: Any) -> DrivenProcess:
        """``snet ARGS`` as a ``DrivenProcess`` (``options`` as for ``subprocess.Popen``:
        its pipes, ...) in this cluster's directory and environment, stopped and its output
        scanned at teardown unless the test stops it first."""
        options.setdefault("env", self.env)
        options.setdefault("cwd", self.tmp_path)
        process = DrivenProcess([sys.executable, "-m", "snet.cli", *args], **options)
        self.driven.append(process)
        return process

    def expect_traceback(self, name: str, because: str) -> None:
        """Allow a traceback in the log of process ``name`` (``because`` says why)."""
        self.expected_tracebacks[self.tmp_path / f"{name}.log"] = because

    def server(self, *args: str, name: str = "server") -> ServerProcess:
        ready = self.tmp_path / f"{name}.ready"
        out_dir = self.tmp_path / f"{name}-out"
        log = self.tmp_path / f"{name}.log"
        process = self._spawn(
            [
                "server",
                "--port",
                "0",
                "--http-port",
                "0",
                "--ready-file",
                str(ready),
                "--out-dir",
                str(out_dir),
                "--log-level",
                "info",
                *args,
            ],
            log,
        )

        def started() -> dict[str, Any] | None:
            if process.poll() is not None:
                raise AssertionError(f"server exited early:\n{log.read_text()[-3000:]}")
            return json.loads(ready.read_text()) if ready.exists() else None

        info = wait_until(started, START_SECONDS, "the server's ready file")
        return ServerProcess(process, info["port"], info["http_port"], out_dir, log)

    def worker(
        self, server: ServerProcess, name: str, *args: str, command: str = "worker"
    ) -> subprocess.Popen[bytes]:
        """A worker process; ``command="spert"`` makes it an emulated Spert-II board."""
        return self._spawn(
            [
                command,
                "--server",
                server.address,
                "--name",
                name,
                "--log-level",
                "info",
                "--retry-seconds",
                "5",
                *args,
            ],
            self.tmp_path / f"{name}.log",
        )

    def spert(self, server: ServerProcess, name: str, *args: str) -> subprocess.Popen[bytes]:
        """An emulated Spert-II board worker (``snet spert``)."""
        return self.worker(server, name, *args, command="spert")

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def close(self) -> None:
        """Kill what is still running, then scan every process's log for tracebacks."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait(10)
        problems = []
        for driven in self.driven:
            try:
                driven.stop()
            except AssertionError as exc:
                problems.append(str(exc))
        for log in self.logs:
            text = log.read_text(errors="replace") if log.exists() else ""
            try:
                check_output(log.stem, text, self.expected_tracebacks.get(log))
            except AssertionError as exc:
                problems.append(str(exc))
        if problems:
            raise AssertionError("\n".join(problems))


def run_snet(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real ``snet`` command, as a user runs it, to its end (at most 120 s); ``env``:
    its environment if not the test run's."""
    return run_process([sys.executable, "-m", "snet.cli", *args], timeout=120, cwd=cwd, env=env)


def status_table(url: str) -> str:
    """What ``snet status --url URL`` prints (the table)."""
    return run_process(
        [sys.executable, "-m", "snet.cli", "status", "--url", url], timeout=30, check=True
    ).stdout


def memfd_mappings(name: str) -> int:
    """This process's mappings of a memfd named ``name`` (a shared board), once what earlier
    tests left to the collector is collected (a lab's servers and workers sit in cycles)."""
    gc.collect()
    return Path("/proc/self/maps").read_text().count(f"/memfd:{name}")
