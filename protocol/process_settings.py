"""Settings every snet process has, server and worker alike: how it logs.

Each is a dataclass field of ``ServerConfig`` and ``WorkerConfig`` (so a flag, a TOML key
and an environment variable, with this help), written once here. ``check_threads``: the
BLAS thread count's bound, which a worker and ``snet train`` share.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from .errors import ConfigError

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


def log_level_field() -> Any:
    """``log_level``: the lowest level logged."""
    return field(default="info", metadata={"help": "logging level", "choices": LOG_LEVELS})


def log_format_field() -> Any:
    """``log_format``: readable lines, or JSON objects for a log collector."""
    return field(
        default="text",
        metadata={
            "help": "text: one readable line per record; json: one JSON object per line (time, "
            "level, logger, message and the record's fields), for log collectors",
            "choices": LOG_FORMATS,
        },
    )


def check_threads(threads: int, name: str = "threads") -> int:
    """``threads`` BLAS threads, refused below one (a worker's ``--threads``, ``snet
    train --threads`` and their environment variables); ``name``: the setting, as given."""
    if threads < 1:
        raise ConfigError(f"{name} must be >= 1, got {threads}")
    return threads
