"""``BoardConfig``: the emulated board's memory, link and compute rates, and time scale.

Each field is a flag of ``snet spert`` (``--host-to-board-mb-s``), an environment variable
(``SNET_SPERT_HOST_TO_BOARD_MB_S``) and a key in the ``[spert]`` table of the TOML file.
The defaults are the Spert-II as MultiSpert measured it: 8 MB of memory, an SBus link of
about 4.0 MB/s towards the board and 2.7 MB/s back, about 115 MCUPS raw when training.
MB/s and MCUPS are decimal (10**6); the memory is binary (8 MB = 8 * 2**20 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from snet.protocol.errors import ConfigError


@dataclass(frozen=True)
class BoardConfig:
    """What the emulated Spert-II is like, and how much faster than real time it runs."""

    memory_mb: float = 8.0  # board memory, MiB: weights, buffers and the pattern chunk
    host_to_board_mb_s: float = 4.0  # SBus link, towards the board
    board_to_host_mb_s: float = 2.7  # SBus link, back to the host
    train_mcups: float = 115.0  # raw training rate (connection updates per second / 1e6)
    forward_mcps: float = 345.0  # forward passes: about a third of training's work per pattern
    unit_ns: float = 5.0  # per hidden unit and pattern: its table lookup and derivative
    pattern_us: float = 2.0  # per pattern: softmax, loop set-up
    call_us: float = 50.0  # per board call: SBus transaction and T0 dispatch
    chunk_patterns: int = 1024  # patterns a forward-pass chunk holds (training: a bunch)
    time_scale: float = 1.0  # 10 means the emulated board runs 10 times faster than real

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("unit_ns", "pattern_us", "call_us"):
                if value < 0:
                    raise ConfigError(f"spert {f.name} must be >= 0, got {value}")
            elif not value > 0:
                raise ConfigError(f"spert {f.name} must be > 0, got {value}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mb * (1 << 20))


BOARD_FIELDS = tuple(f.name for f in fields(BoardConfig))
