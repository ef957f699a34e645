"""``snet server`` and ``snet worker``: build the configuration, run the process; and
``snet tls init``, the certificates they use.

Each command imports only its own side when it runs: a worker never loads the server's
HTTP stack (aiohttp) and the server never loads the worker's arithmetic, so neither pays
the other's start-up (``python -X importtime -m snet.cli worker ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from .flags import given, given_job
from .runtime import install_stop_signals, loop_name, run, setup_logging
from .settings import ConfigFile, build_job, merge, read_toml, refuse_unknown_fields

if TYPE_CHECKING:
    from snet.client.backend import ComputeBackend
    from snet.client.config import WorkerConfig
    from snet.server.config import ServerConfig


def server_config(args: argparse.Namespace) -> ServerConfig:
    """Flags > SNET_* environment > TOML [server]/[job] > defaults."""
    from snet.server.config import ServerConfig  # a worker never loads the server's side

    document = read_toml(getattr(args, "config", None))
    values, where = document.table("job")
    job = build_job(values, given_job(args), where)
    values, where = document.table("server")
    return merge(ServerConfig, values, "SNET_", given(args, ServerConfig), where, job=job)


def run_server(args: argparse.Namespace) -> int:
    """Exit status: 0 trained or stopped by a signal, 1 an error (e.g. a port in use), 2 a
    bad configuration or data set (raised as ``ConfigError``/``DataError`` to ``main``)."""
    from snet.server.app import SnetServer  # here: the worker command never loads it

    config = server_config(args)
    setup_logging(config.log_level, config.log_format)
    log = logging.getLogger("snet.server")

    async def serve() -> str:
        server = SnetServer(config)
        install_stop_signals(server.request_stop, log)
        try:
            return await server.serve()
        finally:
            server.release()

    log.info("event loop: %s", loop_name())
    reason = run(serve())
    status = 0 if reason == "trained" or reason.startswith("signal") else 1
    log.info("exiting with status %d (%s)", status, reason)
    return status


def worker_config(
    args: argparse.Namespace, document: ConfigFile, read_token: bool = True
) -> WorkerConfig:
    """Flags > SNET_WORKER_* environment > SNET_TOKEN > TOML [worker] > defaults; the
    token file read (``with_token``) unless not ``read_token``."""
    from snet.client.config import WorkerConfig  # nor the server the worker's

    flags = given(args, WorkerConfig)
    # one variable for server and workers, below the worker's own (it won over
    # SNET_WORKER_TOKEN: a stale SNET_TOKEN in a shell refused a worker told the right one)
    shared = os.environ.get("SNET_TOKEN")
    if "token" not in flags and shared and not os.environ.get("SNET_WORKER_TOKEN"):
        flags["token"] = shared
    values, where = document.table("worker")
    # every SNET_WORKER_* variable is a field's: a misspelt one was ignored without a word
    refuse_unknown_fields("SNET_WORKER_", WorkerConfig, "worker")
    config = merge(WorkerConfig, values, "SNET_WORKER_", flags, where)
    return with_token(config) if read_token else config


def with_token(config: WorkerConfig) -> WorkerConfig:
    """``config`` with the token of its ``token_file`` (read here, once, as the server
    reads its own at start); a token given as a flag or in the config file is said, as
    the server says it (it joined without a word, from a file others could read)."""
    if config.token_file:
        from snet.transport.tls import read_token_file

        return dataclasses.replace(config, token=read_token_file(config.token_file))
    if config.token:
        from snet.transport.tls import token_in_sight

        if said := token_in_sight(("SNET_WORKER_TOKEN", "SNET_TOKEN")):
            logging.getLogger("snet.worker").warning("%s", said)
    return config


def run_worker(args: argparse.Namespace) -> int:
    """Exit status: see ``Worker.run`` (0 done or stopped, 3 unreachable, 4 refused)."""
    from .worker_group import run_worker_group

    config = worker_config(args, read_toml(getattr(args, "config", None)), read_token=False)
    setup_logging(config.log_level, config.log_format)  # first: what reading the token says
    return run_worker_group(with_token(config))


def run_worker_process(config: WorkerConfig, backend: ComputeBackend | None = None) -> int:
    """Run one worker until done; the first SIGTERM/SIGINT makes it leave politely."""
    from snet.client.worker import Worker  # here: the server command never loads it

    async def work() -> int:
        worker = Worker(config, backend)
        install_stop_signals(worker.request_stop, logging.getLogger("snet.worker"))
        return await worker.run()

    return run(work())


def run_tls_init(args: argparse.Namespace) -> int:
    """``snet tls init DIR``: a private CA and the cluster's certificates."""
    from pathlib import Path

    from snet.transport.certificates import make_cluster_certificates

    # empty items are kept: the certificates' checks refuse them ("a,,b" is a mistake)
    hosts = [h.strip() for h in args.hosts.split(",")] if args.hosts else []
    workers = [w.strip() for w in args.workers.split(",")] if args.workers else None
    for path in make_cluster_certificates(Path(args.directory), hosts, workers):
        print(path)
    return 0
