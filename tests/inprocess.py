"""The fast ring's harness: a real server and real workers as tasks on the test's own loop.

``Lab`` starts ``SnetServer`` (its TCP and HTTP listeners on 127.0.0.1, ephemeral ports)
and ``Worker`` objects exactly as ``snet server`` and ``snet worker`` do, from the same
command-line flags, but as tasks on the event loop that runs the test: no process is
started, so a test pays for its training and nothing else. Everything is real but the
process boundary: sockets, frames, HTTP, the compute and step threads.

What the processes would have written to their logs is captured per "process" (each
server and worker runs in a context that names it), at the processes' ``info`` level.
When the lab closes, everything still running is stopped and every log is scanned for
tracebacks, as the system ring's ``Cluster`` does with real processes' logs; the loop
itself fails the test on any unhandled error (``loop_guard.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from snet.cli.commands import server_config, worker_config
from snet.cli.parser import command_parser
from snet.cli.settings import ConfigFile
from snet.cli.spert import board_config
from snet.client.backend import ComputeBackend
from snet.client.worker import Worker
from snet.server.app import SnetServer

from output_checks import TRACEBACK_MARKS, traceback_excerpt

UNNAMED = "(unnamed)"  # log records from threads, which do not carry a task's context
PROCESS: contextvars.ContextVar[str] = contextvars.ContextVar("lab_process", default=UNNAMED)


async def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` (plain or async) every 20 ms until it gives something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class LogCapture(logging.Handler):
    """Every log record of the lab's servers and workers, kept with the name of its
    process (``UNNAMED`` for records written from a thread)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[tuple[str, str]] = []
        self.setFormatter(logging.Formatter("%(levelname)-7s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((PROCESS.get(), self.format(record)))

    def text(self, name: str | None = None) -> str:
        return "\n".join(line for owner, line in self.records if name in (None, owner))


@dataclass
class LabServer:
    """A running ``SnetServer`` (the in-process ``ServerProcess``)."""

    server: SnetServer
    task: asyncio.Task[str]
    name: str
    out_dir: Path
    lab: Lab

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    async def get(self, path: str) -> bytes:
        """GET ``path`` over HTTP, as any client would; fails on an error status."""
        session = await self.lab.http()
        async with session.get(self.url + path) as response:
            response.raise_for_status()
            return await response.read()

    async def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(await self.get("/status"))
        return document

    def final_status(self) -> dict[str, Any]:
        """The status.json written at shutdown."""
        document: dict[str, Any] = json.loads((self.out_dir / "status.json").read_text())
        return document

    def stop(self, reason: str) -> None:
        """What the first SIGTERM does: a graceful shutdown."""
        self.server.request_stop(reason)

    async def wait(self, timeout: float) -> str:
        """Why the server stopped ("trained", or the reason given to ``stop``)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            log = self.lab.log(self.name)[-3000:]
            raise AssertionError(f"{self.name} did not stop in {timeout} s; log:\n{log}") from None


@dataclass
class LabWorker:
    """A running ``Worker`` (the in-process worker process)."""

    worker: Worker
    task: asyncio.Task[int]
    name: str

    def stop(self, reason: str) -> None:
        """What SIGTERM does to a worker process: it says goodbye and ends with 0."""
        self.worker.request_stop(reason)

    async def wait(self, timeout: float) -> int:
        """The exit code ``snet worker`` would return."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            raise AssertionError(f"worker {self.name} did not end in {timeout} s") from None


@dataclass
class Lab:
    """Servers and workers on the test's loop; ``close()`` stops them and checks their logs."""

    tmp_path: Path
    loop_kind: str
    servers: list[LabServer] = field(default_factory=list)
    workers: list[LabWorker] = field(default_factory=list)
    capture: LogCapture = field(default_factory=LogCapture)
    expected_tracebacks: dict[str, str] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None
    _saved_level: int | None = None

    async def server(self, *args: str, name: str = "server") -> LabServer:
        """``snet server ARGS`` on ephemeral ports, started and listening."""
        self._start_logging()
        out_dir = self.tmp_path / f"{name}-out"
        flags = ["--port", "0", "--http-port", "0", "--out-dir", str(out_dir)]
        config = server_config(command_parser().parse_args(["server", *flags, *args]))
        server = SnetServer(config)
        context = _named(name)
        loop = asyncio.get_running_loop()
        try:
            await loop.create_task(server.startup(), context=context)
        except BaseException:
            server.release()
            raise
        task = loop.create_task(_serve(server), name=name, context=context)
        handle = LabServer(server, task, name, out_dir, self)
        self.servers.append(handle)
        return handle

    def worker(
        self,
        server: LabServer,
        name: str,
        *args: str,
        command: str = "worker",
        backend: ComputeBackend | None = None,
    ) -> LabWorker:
        """``snet worker --server ... --name NAME ARGS`` as a task (``command="spert"``:
        ``snet spert``, an emulated Spert-II board)."""
        self._start_logging()
        flags = ["--server", server.address, "--name", name, "--retry-seconds", "5"]
        parsed = command_parser().parse_args([command, *flags, *args])
        if command == "spert":
            from snet.client.spert.backend import SpertBackend

            parsed.backend = "spert"
            backend = SpertBackend(board_config(parsed, ConfigFile()))
        worker = Worker(worker_config(parsed, ConfigFile()), backend)
        loop = asyncio.get_running_loop()
        task = loop.create_task(worker.run(), name=name, context=_named(name))
        handle = LabWorker(worker, task, name)
        self.workers.append(handle)
        return handle

    def spert(self, server: LabServer, name: str, *args: str) -> LabWorker:
        return self.worker(server, name, *args, command="spert")

    def log(self, name: str) -> str:
        """What the server or worker called ``name`` logged (at the processes' info level)."""
        return self.capture.text(name)

    def expect_traceback(self, name: str, because: str) -> None:
        """Allow a traceback in ``name``'s log (``because`` says why it is expected)."""
        self.expected_tracebacks[name] = because

    async def http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self._session

    async def close(self) -> None:
        """Stop what still runs (workers leave, servers shut down), then check the logs."""
        try:
            for worker in self.workers:
                worker.stop("test over")
            await _settle([w.task for w in self.workers], 10.0)
            for server in self.servers:
                server.stop("test over")
            await _settle([s.task for s in self.servers], 15.0)
            if self._session is not None:
                await self._session.close()
        finally:
            self._stop_logging()
            self.servers.clear()  # so that their tasks are collected (and any lost error
            self.workers.clear()  # reported) before the loop's verdict
        self.check_logs()

    def check_logs(self) -> None:
        problems = []
        names = {owner for owner, _ in self.capture.records}
        for name in sorted(names):
            text = self.capture.text(name)
            if name not in self.expected_tracebacks and any(m in text for m in TRACEBACK_MARKS):
                problems.append(f"--- {name}:\n{traceback_excerpt(text)}")
        if problems:
            raise AssertionError("tracebacks in the lab's logs:\n" + "\n".join(problems))

    def _start_logging(self) -> None:
        if self._saved_level is None:
            snet = logging.getLogger("snet")
            self._saved_level = snet.level
            snet.setLevel(logging.INFO)  # what the test processes log at (--log-level info)
            logging.getLogger().addHandler(self.capture)

    def _stop_logging(self) -> None:
        if self._saved_level is not None:
            logging.getLogger("snet").setLevel(self._saved_level)
            logging.getLogger().removeHandler(self.capture)
            self._saved_level = None


def _named(name: str) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(PROCESS.set, name)
    return context


async def _serve(server: SnetServer) -> str:
    """As ``snet server`` does after startup: serve, then give back ports and pid file."""
    try:
        return await server.run_until_stopped()
    finally:
        server.release()


async def _settle(tasks: list[asyncio.Task[Any]], timeout: float) -> None:
    """Wait for ``tasks`` to end; cancel those that do not in ``timeout`` (a process
    that would not stop would be killed: the same here, and the test is told)."""
    pending = [task for task in tasks if not task.done()]
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=timeout)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late, timeout=5.0)
        names = ", ".join(task.get_name() for task in late)
        raise AssertionError(f"did not stop within {timeout} s when asked: {names}")


def run_in_lab(
    lab: Lab,
    test: Callable[..., Coroutine[Any, Any, Any]],
    kwargs: dict[str, Any],
    deadline: float | None = None,
) -> Any:
    """Used by conftest.py: run an ``async def`` test, then close its lab, on the lab's
    loop (both inside ``loop_guard.run_guarded``, cancelled after ``deadline`` s)."""
    from loop_guard import run_guarded

    async def main() -> Any:
        try:
            return await test(**kwargs)
        finally:
            await lab.close()

    return run_guarded(lab.loop_kind, main, deadline)
