"""``WorkerConfig``: every setting of a worker process (the job comes from the server)."""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field
from pathlib import Path

from snet.protocol.address import split_host_port
from snet.protocol.codecs import canonical
from snet.protocol.codecs.weights import canonical_weights_form
from snet.protocol.conversation import Role
from snet.protocol.errors import ConfigError
from snet.protocol.messages import HEARTBEAT_FLOOR
from snet.protocol.numbering import is_plain_int
from snet.protocol.process_settings import check_threads, log_format_field, log_level_field
from snet.protocol.worker_name import name_problem
from snet.transport.faults import FaultSwitch

HANDSHAKE_SECONDS = 30.0  # a server's hello, welcome and data description, in all
# client/backend.py's BACKENDS and "auto"; named here too, so that a setting is checked
# when it is read, before any worker starts (the backends' code is not loaded by then)
BACKEND_NAMES = ("auto", "numpy", "torch", "spert", "modelled")
# Worker processes one command may fork: a typo (100000 for 10) forked until the machine
# gave out (300 idle ones held 1.3 GB); far beyond one per core of any machine we run on.
MAX_PROCESSES = 256


@dataclass(frozen=True)
class WorkerConfig:
    """Settings of one worker; each field is a flag (its metadata's ``help`` the flag's help),
    a TOML key under [worker] and an environment variable ``SNET_WORKER_<FIELD>``."""

    server: str = field(default="127.0.0.1:7000", metadata={"help": "HOST:PORT of the server"})
    name: str = field(default="", metadata={"help": "this worker's name (empty: hostname-pid)"})
    token: str = field(
        default="", metadata={"help": "the server's shared secret (also SNET_TOKEN)"}
    )
    token_file: str = field(
        default="",
        metadata={
            "help": "read the server's shared secret from this file (keeps it out of ps and "
            "the environment; wins over --token and SNET_TOKEN)"
        },
    )
    threads: int = field(default=1, metadata={"help": "BLAS threads for this worker's compute"})
    processes: int = field(
        default=1,
        metadata={
            "help": "worker processes to run on this machine, forked from one that has loaded "
            "the code once (names NAME-1..N; one per core is the rule; at most 256)"
        },
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": "compute backend: auto (torch if installed, else numpy), numpy, "
            "torch, spert or modelled",
            "choices": BACKEND_NAMES,
        },
    )
    compress: str = field(
        default="",
        metadata={
            "help": "send updates in this codec with error feedback: none, fp16, int8, sign, "
            "topk:F, powersgd:R (empty: the job's)"
        },
    )
    weights_codec: str = field(
        default="shared",
        metadata={
            "help": "receive weights as shared (float32 through the server's weights board, "
            "shared memory, when the worker runs on the server's machine; elsewhere as none), "
            "none (float32 in the frames), fp16, or delta:CODEC (delta:none is none)"
        },
    )
    inline_seconds: float = field(
        default=0.002,
        metadata={
            "help": "compute bunches that take less CPU than this (a running mean) on the event "
            "loop's thread, sparing two thread switches per bunch (0: always on the compute "
            "thread)"
        },
    )
    heartbeat_seconds: float = field(
        default=5.0,
        metadata={"help": "send a heartbeat when quiet this long (keep it well below the "
                  "server's --worker-timeout-seconds, 60 by default)"},
    )  # fmt: skip
    retry_seconds: float = field(
        default=300.0,
        metadata={
            "help": "keep trying to reach the server this long from the start, and to get "
            "back to it this long after losing it: one deadline across reconnects (a "
            "server's restart takes a while)"
        },
    )
    server_timeout_seconds: float = field(
        default=30.0, metadata={"help": "drop and redo a connection silent this long (> 1)"}
    )
    hello_seconds: float = field(
        default=3.0,
        metadata={"help": "an snet server says hello at once: after this long without it, "
                  "ask whether the port speaks HTTP (the wrong port given)"},
    )  # fmt: skip
    max_frame_mb: int = field(
        default=512,
        metadata={"help": "largest frame accepted, MiB; below the job's weights the worker "
                  "exits 2 saying how much they need"},
    )  # fmt: skip
    log_level: str = log_level_field()
    log_format: str = log_format_field()
    progress_seconds: float = field(
        default=30.0,
        metadata={
            "help": "log a progress line (updates sent, patterns, rate, staleness) this often "
            "while joined (0: never)"
        },
    )
    data_access: str = field(
        default="auto",
        metadata={
            "help": "read the data here (local), have the server send it (inline), or try "
            "local first (auto)",
            "choices": ("auto", "local", "inline"),
        },
    )
    data_cache: str = field(
        default="",
        metadata={
            "help": "directory where the workers of one machine share the normalised data "
            "read-only (empty: $XDG_CACHE_HOME/snet or ~/.cache/snet; none: a copy each)"
        },
    )
    tls_ca: str = field(
        default="",
        metadata={"help": "connect with TLS and trust a server whose certificate this CA "
                  "file signed (empty: plain TCP)"},
    )  # fmt: skip
    tls_cert: str = field(
        default="", metadata={"help": "this worker's TLS certificate, for mutual TLS"}
    )
    tls_key: str = field(default="", metadata={"help": "the key of tls_cert"})
    report_timing: bool = field(
        default=False,
        metadata={
            "help": "report each update's costs to /status (per_update: compute and event "
            "loop CPU, latency to new weights; snet bench reads them)"
        },
    )
    faults: str = field(
        default="",
        metadata={
            "help": "faults injected on purpose, for tests: e.g. drop:update:5;corrupt:weights:9 "
            "(transport/faults.py)"
        },
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "token", self.token.strip())  # as the server's (config.py)
        self.address()  # validates
        if self.name and (problem := name_problem(self.name)):
            raise ConfigError(problem)
        check_threads(self.threads)
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ConfigError(
                f"processes must be 1 to {MAX_PROCESSES} (one per core is the rule), "
                f"got {self.processes}"
            )
        if self.backend not in BACKEND_NAMES:
            raise ConfigError(
                f"unknown backend {self.backend!r}; known: {', '.join(BACKEND_NAMES)}"
            )
        if not self.inline_seconds >= 0:  # nan too (a TOML file can give one)
            raise ConfigError(f"inline_seconds must be >= 0, got {self.inline_seconds:g}")
        if self.retry_seconds < 0:
            raise ConfigError("retry_seconds must be >= 0")
        if self.progress_seconds < 0:
            raise ConfigError(f"progress_seconds must be >= 0, got {self.progress_seconds:g}")
        if self.data_access not in ("auto", "local", "inline"):
            raise ConfigError(
                f"data_access must be auto, local or inline, got {self.data_access!r}"
            )
        if self.max_frame_mb < 1:
            raise ConfigError(f"max_frame_mb must be at least 1, got {self.max_frame_mb}")
        if self.server_timeout_seconds <= 1:
            raise ConfigError("server_timeout_seconds must be more than 1 s")
        # 0 sent heartbeats without a pause: this worker and its server at a full core each
        # (its bound above is the server's --worker-timeout-seconds, not known here)
        if not HEARTBEAT_FLOOR <= self.heartbeat_seconds < math.inf:  # nan too
            raise ConfigError(
                f"heartbeat_seconds must be at least {HEARTBEAT_FLOOR:g} (and finite), "
                f"got {self.heartbeat_seconds:g}"
            )
        if not 0 < self.hello_seconds < HANDSHAKE_SECONDS:
            raise ConfigError(
                f"hello_seconds must be > 0 and < {HANDSHAKE_SECONDS:g}, got {self.hello_seconds:g}"
            )
        if self.compress:
            object.__setattr__(self, "compress", canonical(self.compress))
        object.__setattr__(self, "weights_codec", canonical_weights_form(self.weights_codec))
        FaultSwitch.from_text(self.faults, Role.WORKER)  # refuses a bad rule with a clear error
        for name in ("tls_cert", "tls_key"):  # a key alone was ignored without a word
            if getattr(self, name) and not self.tls_ca:
                raise ConfigError(f"{name} needs tls_ca: the CA that signed the server's "
                                  "certificate")  # fmt: skip
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: this worker's certificate "
                              "and its key")  # fmt: skip

    def data_cache_directory(self) -> Path | None:
        """Where this machine's workers share the normalised data (None: not shared)."""
        from snet.data.cache import cache_directory

        return cache_directory(self.data_cache)

    def address(self) -> tuple[str, int]:
        _, found, rest = self.server.partition("://")
        if found:  # a URL, perhaps the status page's: say what a worker needs instead
            where = rest.split("/", 1)[0]
            port = where.rpartition(":")[2]
            where = where if is_plain_int(port) else f"{where}:7000"
            raise ConfigError(
                f"server must be HOST:PORT of the server's worker port, not a URL: got "
                f"{self.server!r} (did you mean --server {where}?)"
            )
        try:
            return split_host_port(self.server)
        except ValueError:
            raise ConfigError(f"server must be HOST:PORT, got {self.server!r}") from None

    def worker_name(self) -> str:
        import os

        return self.name or f"{socket.gethostname()}-{os.getpid()}"
