"""Process-wide choices made in one small place: the event loop, logging, BLAS threads
(cli/blas.py, kept apart so that commands without an event loop never import asyncio)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

# re-exported: the benchmarks and tests import them from here
from .blas import BLAS_VARIABLES as BLAS_VARIABLES
from .blas import blas_thread_env as blas_thread_env
from .blas import limit_blas_threads as limit_blas_threads
from .stop_signals import Meaning, StopSignals, hangup_taken

T = TypeVar("T")


def loop_name() -> str:
    """``uvloop`` when installed (unless SNET_LOOP=asyncio), else ``asyncio``."""
    if os.environ.get("SNET_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on uvloop when available, falling back to plain asyncio."""
    from snet.protocol.fpu import denormals_flushed, flush_denormals
    from snet.protocol.heap import settle

    # The loop's thread computes too (short steps and bunches run inline, transport/
    # inline.py): with denormals flushed as in the step and compute threads, a step's
    # result does not depend on the thread that ran it, nor slow down a hundredfold. The
    # thread is left as it was found (a caller's own arithmetic, a test's).
    was_flushed = denormals_flushed()
    flush_denormals()
    settle()  # what the start-up loaded, out of the collector's sight (protocol/heap.py)
    try:
        if loop_name() == "uvloop":
            import uvloop

            return uvloop.run(coroutine)
        return asyncio.run(coroutine)
    finally:
        if not was_flushed:
            flush_denormals(False)


def setup_logging(level: str, form: str = "text") -> None:
    """Log to stderr with time, level and source, as a service manager expects; ``form``
    "json": one JSON object per line (cli/logformat.py)."""
    from snet.protocol.errors import ConfigError

    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {level!r}")
    if form not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json, got {form!r}")
    from .logformat import JsonFormatter, TextFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    logging.basicConfig(level=numeric, handlers=[handler])


def install_stop_signals(stop: Callable[[str], None], log: logging.Logger) -> None:
    """First SIGTERM/SIGINT/SIGHUP: ``stop("signal NAME")``, a graceful stop. Second: exit
    1 now (but not the first one delivered twice: cli/stop_signals.py).

    Call inside the running event loop."""
    loop = asyncio.get_running_loop()
    received = StopSignals()

    def handle(signum: int) -> None:
        name = signal.Signals(signum).name
        meaning = received.meaning(signum)
        if meaning is Meaning.REPEAT:
            log.debug("signal %s again at once: the same request", name)
            return
        if meaning is Meaning.INSIST:
            log.warning("second signal (%s): exiting now", name)
            os._exit(1)
        log.info("signal %s: stopping gracefully", name)
        stop(f"signal {name}")

    # SIGHUP too (a closed terminal or SSH session): it ended a server at once, with no
    # checkpoint, no results and no goodbye (exit 129); unless ignored (nohup): then left so
    for signum in (signal.SIGTERM, signal.SIGINT, *hangup_taken()):
        loop.add_signal_handler(signum, handle, signum)
