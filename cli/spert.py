"""``snet spert``: a worker whose arithmetic runs on an emulated Spert-II board.

It is ``snet worker --backend spert`` with the board's settings as flags: each field of
``BoardConfig`` is a flag (``--time-scale``), an environment variable
(``SNET_SPERT_TIME_SCALE``) and a key in the TOML file's ``[spert]`` table.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from snet.client.spert.config import BoardConfig

from .flags import given
from .settings import ConfigFile, merge, read_toml, refuse_unknown_fields

if TYPE_CHECKING:
    from snet.client.config import WorkerConfig


def board_config(args: argparse.Namespace, document: ConfigFile) -> BoardConfig:
    """Flags > SNET_SPERT_* environment > TOML [spert] > defaults."""
    values, where = document.table("spert")
    # a misspelt one (SNET_SPERT_TRAIN_MCUP=5) was ignored without a word, as a worker's was
    refuse_unknown_fields("SNET_SPERT_", BoardConfig, "board")
    return merge(BoardConfig, values, "SNET_SPERT_", given(args, BoardConfig), where)


def spert_configs(
    args: argparse.Namespace, read_token: bool = True
) -> tuple[WorkerConfig, BoardConfig]:
    """The board's worker settings (backend spert; its token file read unless not
    ``read_token``) and the board's own."""
    from .commands import worker_config

    args.backend = "spert"
    document = read_toml(getattr(args, "config", None))
    return worker_config(args, document, read_token), board_config(args, document)


def run_spert(args: argparse.Namespace) -> int:
    # imported here so that building the parser stays light for every other command
    from snet.client.spert.backend import SpertBackend

    from .commands import run_worker_process, with_token
    from .runtime import setup_logging

    config, board = spert_configs(args, read_token=False)
    setup_logging(config.log_level, config.log_format)  # first: what reading the token says
    return run_worker_process(with_token(config), SpertBackend(board))
