"""``BoardConfig``: the emulated board's memory, link and compute rates, and time scale.

Each field is a flag of ``snet spert`` (``--host-to-board-mb-s``), an environment variable
(``SNET_SPERT_HOST_TO_BOARD_MB_S``) and a key in the ``[spert]`` table of the TOML file.
The defaults are the Spert-II as MultiSpert measured it: 8 MB of memory, an SBus link of
about 4.0 MB/s towards the board and 2.7 MB/s back, about 115 MCUPS raw when training.
MB/s and MCUPS are decimal (10**6); the memory is binary (8 MB = 8 * 2**20 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from snet.protocol.errors import ConfigError

MIN_RATE, MAX_RATE = 1e-6, 1e12  # rates, sizes and the time scale (a board's are ~1-1000)
MAX_TIME = 1e9  # ns or us of a modelled cost


@dataclass(frozen=True)
class BoardConfig:
    """What the emulated Spert-II is like, and how much faster than real time it runs."""

    memory_mb: float = field(
        default=8.0, metadata={"help": "board memory, MiB: weights, buffers and the pattern chunk"}
    )
    host_to_board_mb_s: float = field(
        default=4.0, metadata={"help": "SBus link rate towards the board, MB/s"}
    )
    board_to_host_mb_s: float = field(
        default=2.7, metadata={"help": "SBus link rate back to the host, MB/s"}
    )
    train_mcups: float = field(
        default=115.0, metadata={"help": "raw training rate (connection updates per s / 1e6)"}
    )
    forward_mcps: float = field(
        default=345.0, metadata={"help": "forward-pass rate, MCPS (a third of training's work)"}
    )
    unit_ns: float = field(
        default=5.0, metadata={"help": "ns per hidden unit and pattern (lookup, derivative)"}
    )
    pattern_us: float = field(default=2.0, metadata={"help": "us per pattern (softmax, loop)"})
    call_us: float = field(
        default=50.0, metadata={"help": "us per board call (SBus transaction, T0 dispatch)"}
    )
    chunk_patterns: int = field(
        default=1024, metadata={"help": "patterns a forward-pass chunk holds"}
    )
    time_scale: float = field(
        default=1.0, metadata={"help": "run this many times faster than the modelled board"}
    )

    def __post_init__(self) -> None:
        # Bounded both ways, not only > 0: a time scale of 1e-300 (or a rate of 1e-300, a
        # call of 1e300 us) made a modelled sleep no clock can hold, a traceback mid-run.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("unit_ns", "pattern_us", "call_us"):
                if not 0 <= value <= MAX_TIME:
                    raise ConfigError(f"spert {f.name} must be 0 to {MAX_TIME:g}, got {value:g}")
            elif not MIN_RATE <= value <= MAX_RATE:
                raise ConfigError(
                    f"spert {f.name} must be {MIN_RATE:g} to {MAX_RATE:g}, got {value:g}"
                )

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mb * (1 << 20))
