"""``snet server`` and ``snet worker``: build the configuration, run the process."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from snet.client.backend import ComputeBackend
from snet.client.config import WorkerConfig
from snet.client.worker import Worker
from snet.server.app import SnetServer
from snet.server.config import ServerConfig

from .runtime import install_stop_signals, loop_name, run, setup_logging
from .settings import build_job, merge, read_toml

SERVER_FIELDS = (
    "host",
    "port",
    "http_host",
    "http_port",
    "name",
    "token",
    "out_dir",
    "ready_file",
    "pid_file",
    "trace_file",
    "pool_size",
    "min_workers",
    "max_frame_mb",
    "heartbeat_seconds",
    "worker_timeout_seconds",
    "stall_seconds",
    "join_seconds",
    "linger_seconds",
    "log_level",
    "init_weights",
    "hooks",
    "checkpoint_seconds",
    "checkpoint_steps",
    "checkpoint_keep",
    "fresh",
    "force",
)
JOB_FLAGS = (
    "mode",
    "epochs",
    "network",
    "activation",
    "bunch_size",
    "learning_rates",
    "momentum",
    "updates_per_step",
    "max_in_flight",
    "chunk_frames",
    "seed",
    "schedule",
    "newbob_scale",
    "newbob_ramp",
    "newbob_stop",
    "frame_order",
    "shuffle_cache_bunches",
    "source",
    "labels",
    "norm_file",
    "context",
    "compress",
)
WORKER_FIELDS = (
    "server",
    "name",
    "token",
    "threads",
    "backend",
    "compress",
    "weights_codec",
    "heartbeat_seconds",
    "retry_seconds",
    "server_timeout_seconds",
    "max_frame_mb",
    "log_level",
    "data_access",
)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """Flags > SNET_* environment > TOML [server]/[job] > defaults."""
    document = read_toml(getattr(args, "config", None))
    job_flags = {k: v for k in JOB_FLAGS if (v := getattr(args, k, None)) is not None}
    job = build_job(document.get("job", {}), job_flags)
    flags = {name: getattr(args, name, None) for name in SERVER_FIELDS}
    return merge(ServerConfig, document.get("server", {}), "SNET_", flags, job=job)


def run_server(args: argparse.Namespace) -> int:
    """Exit status: 0 trained or stopped by a signal, 1 an error (e.g. a port in use), 2 a
    bad configuration or data set (raised as ``ConfigError``/``DataError`` to ``main``)."""
    config = server_config(args)
    setup_logging(config.log_level)
    log = logging.getLogger("snet.server")

    async def serve() -> str:
        server = SnetServer(config)
        server.install_signal_handlers()
        try:
            return await server.serve()
        finally:
            server.release()

    log.info("event loop: %s", loop_name())
    reason = run(serve())
    status = 0 if reason == "trained" or reason.startswith("signal") else 1
    log.info("exiting with status %d (%s)", status, reason)
    return status


def worker_config(args: argparse.Namespace, document: dict[str, Any]) -> WorkerConfig:
    """Flags > SNET_WORKER_* (and SNET_TOKEN) environment > TOML [worker] > defaults."""
    flags = {name: getattr(args, name, None) for name in WORKER_FIELDS}
    if flags["token"] is None and os.environ.get("SNET_TOKEN"):
        flags["token"] = os.environ["SNET_TOKEN"]  # one variable for server and workers
    return merge(WorkerConfig, document.get("worker", {}), "SNET_WORKER_", flags)


def run_worker(args: argparse.Namespace) -> int:
    """Exit status: see ``Worker.run`` (0 done or stopped, 1 refused, 3 unreachable)."""
    config = worker_config(args, read_toml(getattr(args, "config", None)))
    setup_logging(config.log_level)
    return run_worker_process(config)


def run_worker_process(config: WorkerConfig, backend: ComputeBackend | None = None) -> int:
    """Run one worker until done; the first SIGTERM/SIGINT makes it leave politely."""

    async def work() -> int:
        worker = Worker(config, backend)
        install_stop_signals(worker.request_stop, logging.getLogger("snet.worker"))
        return await worker.run()

    return run(work())
