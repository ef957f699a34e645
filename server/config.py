"""``ServerConfig``: every setting of the server process, in one frozen dataclass.

Each field maps to one command-line flag (``--http-port`` -> ``http_port``), one key in
the TOML file's ``[server]`` table, and one environment variable (``SNET_HTTP_PORT``);
flags win over the environment, which wins over the file. The job (what to train)
is a ``JobSpec`` in the same file's ``[job]`` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server daemon."""

    host: str = "127.0.0.1"
    port: int = 7000
    http_host: str = ""  # empty: the same as host
    http_port: int = 7080
    name: str = "snet"
    token: str = ""  # shared secret workers must prove; empty: no token required
    out_dir: str = "snet-out"
    ready_file: str = ""  # written as JSON with the bound ports once both listen
    pid_file: str = ""  # this process's id, written at startup and removed at exit
    trace_file: str = ""  # JSON lines, one per step: which frames each update covered
    pool_size: int = 32
    min_workers: int = 1  # lease no frames before this many workers have joined
    max_frame_mb: int = 512
    heartbeat_seconds: float = 5.0
    worker_timeout_seconds: float = 60.0
    # The least time a worker holding frames may take to deliver its next update before
    # it is late (its deadline is 10x its measured interval if that is longer): async mode
    # then stops counting it and gives its frames to the others, sync mode drops it.
    stall_seconds: float = 2.0
    join_seconds: float = 10.0  # extra time for a worker's first update (loading data)
    linger_seconds: float = 0.0  # keep serving HTTP this long after training (< 0: until stopped)
    log_level: str = "info"
    init_weights: str = ""  # an snet weights .npz to continue training from
    hooks: str = ""  # extra behaviour hooks, comma-separated package.module:ClassName
    checkpoint_seconds: float = field(
        default=60.0,
        metadata={"help": "checkpoint the whole training state this often (default 60; "
                  "also at each epoch end, at SIGTERM and when training completes)"},
    )  # fmt: skip
    checkpoint_steps: int = field(
        default=0, metadata={"help": "also checkpoint every this many steps (0: by time only)"}
    )
    checkpoint_keep: int = field(
        default=2, metadata={"help": "keep this many newest checkpoints (default 2)"}
    )
    fresh: bool = field(
        default=False,
        metadata={"help": "start over instead of resuming from the out-dir's checkpoint"},
    )
    force: bool = field(
        default=False, metadata={"help": "with --fresh: overwrite a finished run's results"}
    )
    job: JobSpec = field(default_factory=JobSpec)

    def __post_init__(self) -> None:
        for name in ("port", "http_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {value}")
        if self.pool_size < 2:
            raise ConfigError(f"pool_size must be at least 2, got {self.pool_size}")
        if self.max_frame_mb < 1:
            raise ConfigError("max_frame_mb must be at least 1")
        if self.stall_seconds <= 0 or self.join_seconds < 0:
            raise ConfigError("stall_seconds must be > 0 and join_seconds >= 0")
        if self.checkpoint_seconds <= 0 or self.checkpoint_steps < 0 or self.checkpoint_keep < 1:
            raise ConfigError(
                "checkpoint_seconds must be > 0, checkpoint_steps >= 0, checkpoint_keep >= 1"
            )
        if self.heartbeat_seconds <= 0 or self.worker_timeout_seconds <= self.heartbeat_seconds:
            raise ConfigError("worker_timeout_seconds must exceed heartbeat_seconds (> 0)")

    @property
    def http_bind_host(self) -> str:
        return self.http_host or self.host
