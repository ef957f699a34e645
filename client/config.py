"""``WorkerConfig``: every setting of a worker process (the job comes from the server)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from snet.protocol.codecs import canonical
from snet.protocol.codecs.weights import canonical_weights_form
from snet.protocol.errors import ConfigError


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of one worker; each field is a flag, a TOML key under [worker], an env var."""

    server: str = "127.0.0.1:7000"
    name: str = ""  # empty: hostname-pid
    token: str = ""
    threads: int = 1  # BLAS threads for this worker's compute
    backend: str = "auto"  # auto, numpy, torch or spert (client/backend.py)
    compress: str = ""  # update codec (see protocol/codecs); empty: the job's choice
    weights_codec: str = "none"  # how to receive weights: none, fp16 or delta:CODEC
    heartbeat_seconds: float = 5.0
    retry_seconds: float = 300.0  # one deadline to get back to a server (a restart takes a while)
    server_timeout_seconds: float = 30.0  # silence after which the link is taken for dead
    max_frame_mb: int = 512
    log_level: str = "info"
    data_access: str = "auto"  # auto: read the data, else frames inline; local; inline

    def __post_init__(self) -> None:
        self.address()  # validates
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.retry_seconds < 0:
            raise ConfigError("retry_seconds must be >= 0")
        if self.data_access not in ("auto", "local", "inline"):
            raise ConfigError(
                f"data_access must be auto, local or inline, got {self.data_access!r}"
            )
        if self.server_timeout_seconds <= 1:
            raise ConfigError("server_timeout_seconds must be more than 1 s")
        if self.compress:
            object.__setattr__(self, "compress", canonical(self.compress))
        object.__setattr__(self, "weights_codec", canonical_weights_form(self.weights_codec))

    def address(self) -> tuple[str, int]:
        host, sep, port = self.server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"server must be HOST:PORT, got {self.server!r}")
        return host.strip("[]"), int(port)

    def worker_name(self) -> str:
        import os

        return self.name or f"{socket.gethostname()}-{os.getpid()}"
