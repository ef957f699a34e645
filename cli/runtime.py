"""Process-wide choices made in one small place: the event loop, logging, BLAS threads."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_thread_env(threads: int) -> dict[str, str]:
    """This process's environment with every BLAS thread count set to ``threads``: for a
    child process, whose BLAS reads it when numpy (or torch) is first imported."""
    return {**os.environ, **dict.fromkeys(BLAS_VARIABLES, str(threads))}


def limit_blas_threads(threads: int) -> None:
    """Pin the BLAS thread count; effective only before numpy is first imported."""
    for name in BLAS_VARIABLES:
        os.environ.setdefault(name, str(threads))


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
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def setup_logging(level: str, form: str = "text") -> None:
    """Log to stderr with time, level and source, as a service manager expects; ``form``
    "json": one JSON object per line (cli/logformat.py)."""
    from snet.protocol.errors import ConfigError

    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        raise ConfigError(f"unknown log level {level!r}")
    if form not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json, got {form!r}")
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        from .logformat import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=numeric, handlers=[handler])


def install_stop_signals(stop: Callable[[str], None], log: logging.Logger) -> None:
    """First SIGTERM/SIGINT: ``stop("signal SIGTERM")``, a graceful stop. Second: exit 1 now.

    Call inside the running event loop."""
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def handle(signum: int) -> None:
        name = signal.Signals(signum).name
        if received:
            log.warning("second signal (%s): exiting now", name)
            os._exit(1)
        received.append(name)
        log.info("signal %s: stopping gracefully", name)
        stop(f"signal {name}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, handle, signum)
