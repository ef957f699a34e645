"""``snet spert``: a worker whose arithmetic runs on an emulated Spert-II board.

It is ``snet worker --backend spert`` with the board's settings as flags: each field of
``BoardConfig`` is a flag (``--time-scale``), an environment variable
(``SNET_SPERT_TIME_SCALE``) and a key in the TOML file's ``[spert]`` table.
"""

from __future__ import annotations

import argparse
import dataclasses

from snet.client.spert.config import BOARD_FIELDS, BoardConfig

from .settings import merge, read_toml

_HELP = {
    "memory_mb": "board memory in MB (default 8)",
    "host_to_board_mb_s": "link rate towards the board, MB/s (default 4.0)",
    "board_to_host_mb_s": "link rate back to the host, MB/s (default 2.7)",
    "train_mcups": "raw training rate, MCUPS (default 115)",
    "forward_mcps": "forward-pass rate, MCPS (default 345)",
    "unit_ns": "ns per hidden unit and pattern (default 5)",
    "pattern_us": "us per pattern (default 2)",
    "call_us": "us per board call (default 50)",
    "chunk_patterns": "patterns in a forward-pass chunk (default 1024)",
    "time_scale": "run this many times faster than the modelled board (default 1)",
}


def add_board_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``BoardConfig`` field."""
    group = parser.add_argument_group("board (also [spert] in the TOML file)")
    for field in dataclasses.fields(BoardConfig):
        group.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=int if field.type in (int, "int") else float,
            help=_HELP[field.name],
        )


def board_config(args: argparse.Namespace, document: dict[str, object]) -> BoardConfig:
    """Flags > SNET_SPERT_* environment > TOML [spert] > defaults."""
    flags = {name: getattr(args, name, None) for name in BOARD_FIELDS}
    table = document.get("spert", {})
    return merge(BoardConfig, table if isinstance(table, dict) else {}, "SNET_SPERT_", flags)


def run_spert(args: argparse.Namespace) -> int:
    # imported here so that building the parser stays light for every other command
    from snet.client.spert.backend import SpertBackend

    from .commands import run_worker_process, worker_config
    from .runtime import setup_logging

    args.backend = "spert"
    document = read_toml(getattr(args, "config", None))
    config = worker_config(args, document)
    board = board_config(args, document)
    setup_logging(config.log_level)
    return run_worker_process(config, SpertBackend(board))
