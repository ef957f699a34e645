"""Shared fixtures for the two rings of tests (tests/README.md).

``lab``: the fast ring's in-process server and workers (``inprocess.Lab``), once on each
event loop (asyncio, uvloop). A test that takes it is an ``async def`` and runs on the
lab's loop, which fails it on any unhandled error (``loop_guard.py``).

``cluster``: the system ring's real processes (``helpers.Cluster``); a test that takes it
is in the ``system`` ring, and at teardown every process it started is killed if still
running and its log scanned for tracebacks. Only a test in the system ring may start a
process (``helpers`` refuses otherwise).
"""

from __future__ import annotations

import gc
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import blas_threads  # noqa: F401 - first: numpy with one BLAS thread
import bytecode_cache  # noqa: F401 - before the test modules: they are compiled once
import helpers
from helpers import Cluster
from inprocess import Lab, run_in_lab
from loop_guard import LOOPS

LAB_SHUTDOWN_SECONDS = 15.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(autouse=True, scope="session")
def _data_cache_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Workers share normalised data through a cache directory (data/cache.py): the test
    run's own, never the home directory's."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(autouse=True, scope="session")
def _demo_workers_at_nice() -> None:
    """The demos the tests start run their workers at nice +5, never on idle cores only
    (cli/worker_priority.py): the tests run beside each other, and a demo's idle-policy
    workers would wait for every other test's processes. Its own tests ask for idle."""
    os.environ["SNET_DEMO_WORKER_PRIORITY"] = "low"


@pytest.fixture(params=LOOPS)
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Lab:
    """A lab on one loop; ``@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)``
    keeps a test to one."""
    return Lab(tmp_path, request.param)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported so far (the package, numpy, the test modules) lives to the end:
    frozen out of the collector, so the ``gc.collect()`` after each lab test (loop_guard.py:
    lost task exceptions surface when collected) walks only what tests made since."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts real processes through ``cluster`` is in the system ring, marked
    or not (the marks in the files say so to the reader; this keeps a forgotten one out of
    the fast ring). The system ring's tests run first."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.system)
    # The system ring first (in file order, stably): run two at a time (``make test``), the
    # long tests start early and the fast ring's many short ones even out the end, where
    # one long test left last would keep one process busy while the other idles.
    items.sort(key=lambda item: item.get_closest_marker("system") is None)


@pytest.fixture(autouse=True)
def _processes_only_in_the_system_ring(request: pytest.FixtureRequest) -> Iterator[None]:
    """``helpers`` refuses to start a process for a test outside the system ring, and so
    does ``subprocess`` for a Python process (snet's own start through it, but on
    uvloop's loop; a library's helper such as matplotlib's ``fc-list`` may run): a
    fast-ring test that ran ``main(["demo", ...])`` had started the demo's preloaded
    worker process, unseen."""
    system = request.node.get_closest_marker("system") is not None
    helpers.PROCESSES_ALLOWED = system
    with pytest.MonkeyPatch.context() as patch:
        if not system:
            patch.setattr(subprocess.Popen, "_execute_child", _refused_child)
        try:
            yield
        finally:
            helpers.PROCESSES_ALLOWED = False


_EXECUTE_CHILD = subprocess.Popen._execute_child  # type: ignore[attr-defined]


def _refused_child(process: subprocess.Popen[bytes], args: object, *rest: object) -> None:
    program = args[0] if isinstance(args, list | tuple) and args else args
    if Path(str(program)).name.startswith("python") or program == sys.executable:
        started = f"{args!r:.100}"
        raise AssertionError(f"a test outside the system ring started {started}: mark it system")
    _EXECUTE_CHILD(process, args, *rest)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test on its lab's loop (a test without a lab cannot be async)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    lab = pyfuncitem.funcargs.get("lab")
    if not isinstance(lab, Lab):
        raise pytest.UsageError(f"{pyfuncitem.nodeid}: an async test needs the lab fixture")
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    try:
        run_in_lab(lab, pyfuncitem.obj, kwargs, _deadline(pyfuncitem))
    finally:
        # What outlived the test and its loop's collection (modules and caches it loaded
        # first) lives on: frozen like everything before the first test, so that the next
        # lab test's collection walks only what that test made (each walk of everything
        # cost 0.1-0.3 s, 8-25 s of the fast ring).
        gc.freeze()
    return True


def _deadline(item: pytest.Function) -> float | None:
    """Seconds a lab test may run: pytest-timeout's limit less time to shut the lab down
    (the loop ends the test itself: see loop_guard.py)."""
    marker = item.get_closest_marker("timeout")
    limit = (
        float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout"))
    )
    if limit <= 0:
        return None
    return limit - LAB_SHUTDOWN_SECONDS if limit > 2 * LAB_SHUTDOWN_SECONDS else limit / 2
