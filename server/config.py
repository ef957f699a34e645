"""``ServerConfig``: every setting of the server process, in one frozen dataclass.

Each field maps to one command-line flag (``--http-port`` -> ``http_port``), one key in
the TOML file's ``[server]`` table, and one environment variable (``SNET_HTTP_PORT``);
flags win over the environment, which wins over the file. The command line builds its
flags from these fields: the ``help`` in each field's metadata is the flag's help (and
``choices`` its allowed values). The job (what to train) is a ``JobSpec`` in the same
file's ``[job]`` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from snet.protocol.conversation import Role
from snet.protocol.errors import ConfigError
from snet.protocol.framing import MIB, mib_at_least
from snet.protocol.job import JobSpec
from snet.protocol.messages import HEARTBEAT_FLOOR
from snet.protocol.modes import trace_problem, whole_element_bytes
from snet.protocol.process_settings import log_format_field, log_level_field
from snet.transport.faults import FaultSwitch

# A run completed before this server started is served at least this long by default
# (``linger_after``): a worker still trying to reach it tries again within
# MAX_BACKOFF_SECONDS (5 s), and one that gave up is restarted by its systemd unit 10 s
# later (RestartSec) and needs a few seconds to start.
RESUMED_LINGER_SECONDS = 30.0


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server daemon."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on for workers"})
    port: int = field(default=7000, metadata={"help": "TCP port for workers (0: any free port)"})
    http_host: str = field(
        default="", metadata={"help": "address of the HTTP status API (empty: the same as host)"}
    )
    http_port: int = field(
        default=7080, metadata={"help": "port of the HTTP status API and dashboard (0: any)"}
    )
    name: str = field(default="snet", metadata={"help": "this server's name in /status"})
    token: str = field(
        default="",
        metadata={"help": "shared secret workers must prove (empty: none required)"},
    )
    token_file: str = field(
        default="",
        metadata={
            "help": "read the shared secret from this file (keeps it out of ps and the "
            "environment; wins over --token and SNET_TOKEN, as a worker's does)"
        },
    )
    tls_cert: str = field(
        default="",
        metadata={"help": "serve both ports over TLS with this certificate (PEM; empty: "
                  "plain TCP and HTTP)"},
    )  # fmt: skip
    tls_key: str = field(default="", metadata={"help": "the key of tls_cert (PEM)"})
    tls_client_ca: str = field(
        default="",
        metadata={"help": "mutual TLS: workers must show a certificate this CA signed"},
    )
    insecure: bool = field(
        default=False,
        metadata={
            "help": "allow listening beyond loopback without a token (anyone who reaches "
            "the ports could then change the weights)"
        },
    )
    out_dir: str = field(
        default="snet-out", metadata={"help": "directory for the weights, norms and stats"}
    )
    ready_file: str = field(
        default="",
        metadata={
            "help": "write JSON with the pid and bound ports once both listen (removed at exit)"
        },
    )
    pid_file: str = field(
        default="", metadata={"help": "write this process's id here while it runs"}
    )
    trace_file: str = field(
        default="",
        metadata={"help": "JSON lines, one per step: which frames each update covered"},
    )
    data_cache: str = field(
        default="",
        metadata={
            "help": "directory where the server keeps the training frames' normalisation "
            "for its next start on the same data (empty: $XDG_CACHE_HOME/snet or "
            "~/.cache/snet; none: computed at every start)"
        },
    )
    pool_size: int = field(
        default=32,
        metadata={"help": "update elements kept for reuse, made as first needed (>= 2)"},
    )
    inline_step_seconds: float = field(
        default=0.002,
        metadata={"help": "apply steps that take less CPU than this (a running mean) on the "
                  "event loop's thread, sparing a thread hand-off per step (0: always on the "
                  "step thread)"},
    )  # fmt: skip
    min_workers: int = field(
        default=1, metadata={"help": "lease no frames before this many workers have joined"}
    )
    max_frame_mb: int = field(default=512, metadata={"help": "largest frame accepted, MB"})
    max_connections: int = field(
        default=256,
        metadata={"help": "most connections the worker port holds at once; one more is "
                  "turned away (too_many_connections)"},
    )  # fmt: skip
    max_handshakes: int = field(
        default=128,
        metadata={"help": "most of those not yet welcomed (no hello with its token proof "
                  "yet); one more is turned away (too_many_handshakes)"},
    )  # fmt: skip
    max_handshakes_per_address: int = field(
        default=-1,
        metadata={"help": "most handshakes in progress from one address; one more is turned "
                  "away (too_many_handshakes). -1: half of max_handshakes; 0: no bound per "
                  "address. Welcomed workers are not counted: a machine may run up to 256. "
                  "Behind a proxy or NAT every worker has its address: raise it or give 0"},
    )  # fmt: skip
    handshake_seconds: float = field(
        default=10.0,
        metadata={"help": "close a worker connection not welcomed this long after it "
                  "opened (TLS handshake included)"},
    )  # fmt: skip
    http_connections: int = field(
        default=64,
        metadata={"help": "most HTTP connections open at once; one more is answered 503"},
    )
    http_connections_per_address: int = field(
        default=-1,
        metadata={"help": "most HTTP connections open at once from one address; one more is "
                  "answered 503. -1: a quarter of http_connections; 0: no bound per address. "
                  "Behind a reverse proxy every client has the proxy's address: raise it to "
                  "http_connections or give 0 there"},
    )  # fmt: skip
    http_header_seconds: float = field(
        default=10.0,
        metadata={"help": "close an HTTP connection whose request is not in (headers and "
                  "body) this long after it opened or after its last response"},
    )  # fmt: skip
    event_seconds: float = field(
        default=0.5,
        metadata={"help": "how often /events pushes the status document to the dashboard "
                  "(0.05-60 s)"},
    )  # fmt: skip
    verify_cv: bool = field(
        default=False,
        metadata={"help": "two workers score each epoch's CV set and must agree; when they "
                  "do not (or only one worker is there) the server scores it itself, and a "
                  "worker whose figures differ from its own is refused"},
    )  # fmt: skip
    heartbeat_seconds: float = field(
        default=5.0, metadata={"help": "send a heartbeat to a worker quiet this long"}
    )
    worker_timeout_seconds: float = field(
        default=60.0, metadata={"help": "drop a worker silent this long; its frames go to others"}
    )
    stall_seconds: float = field(
        default=2.0,
        metadata={
            "help": "least time a worker holding frames may take to deliver its next update "
            "before it is late (its deadline is 10x its measured interval if longer): async "
            "stops counting it and gives its frames to the others, sync drops it"
        },
    )
    join_seconds: float = field(
        default=10.0,
        metadata={
            "help": "extra time for a worker's first update (loading data) where a late "
            "worker is dropped (sync rounds and blocks, np), and for scoring CV before "
            "its rate is known"
        },
    )
    linger_seconds: float = field(
        default=0.0,
        metadata={"help": "keep serving HTTP this long after training (< 0: until stopped)"},
    )
    resumed_linger_seconds: float = field(
        default=RESUMED_LINGER_SECONDS,
        metadata={
            "help": "serve a run found completed at start (its server killed before "
            "it told its workers) at least this long, so that its workers hear it"
        },
    )
    log_level: str = log_level_field()
    log_format: str = log_format_field()
    init_weights: str = field(
        default="", metadata={"help": "an snet weights .npz to continue training from"}
    )
    hooks: str = field(
        default="", metadata={"help": "extra behaviour hooks: package.module:ClassName,..."}
    )
    faults: str = field(
        default="",
        metadata={
            "help": "faults injected on purpose, for tests: e.g. drop:update:5 "
            "(transport/faults.py)"
        },
    )
    checkpoint_seconds: float = field(
        default=60.0,
        metadata={
            "help": "checkpoint the whole training state this often (also at each epoch end, "
            "at SIGTERM and when training completes)"
        },
    )
    checkpoint_steps: int = field(
        default=0, metadata={"help": "also checkpoint every this many steps (0: by time only)"}
    )
    checkpoint_keep: int = field(default=2, metadata={"help": "keep this many newest checkpoints"})
    fresh: bool = field(
        default=False,
        metadata={"help": "start over instead of resuming from the out-dir's checkpoint"},
    )
    force: bool = field(
        default=False, metadata={"help": "with --fresh: overwrite a finished run's results"}
    )
    job: JobSpec = field(default_factory=JobSpec)

    def __post_init__(self) -> None:
        # as --token-file's text is read (stripped): a token from a file-made Kubernetes
        # Secret, "abc\n", refused every HTTP client (a Bearer value is stripped) and any
        # worker that read the same secret from a file
        object.__setattr__(self, "token", self.token.strip())
        for name in ("port", "http_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {value}")
        if self.trace_file and (problem := trace_problem(self.job.mode)):
            raise ConfigError(problem)
        if self.min_workers < 1:
            raise ConfigError(f"min_workers must be at least 1, got {self.min_workers}")
        if not self.out_dir.strip():  # its files were written into the current directory
            raise ConfigError("out_dir is empty: it would be the current directory; give one")
        if self.force and not self.fresh:  # it overwrites nothing alone: said, not ignored
            raise ConfigError("force goes with --fresh: it overwrites a finished run's "
                              "results only when starting over")  # fmt: skip
        wildcard = {"", "0.0.0.0", "::"}
        overlap = self.http_bind_host == self.host or {self.host, self.http_bind_host} & wildcard
        if self.port == self.http_port != 0 and overlap:
            raise ConfigError(f"port and http_port are both {self.port}: give each its own")
        if self.pool_size < 2:
            raise ConfigError(f"pool_size must be at least 2, got {self.pool_size}")
        if not self.inline_step_seconds >= 0:  # nan too (a TOML file can give one)
            raise ConfigError(f"inline_step_seconds must be >= 0, got {self.inline_step_seconds:g}")
        if self.max_frame_mb < 1:
            raise ConfigError(f"max_frame_mb must be at least 1, got {self.max_frame_mb}")
        element = whole_element_bytes(self.job.network, self.job.mode)
        if self.job.compress == "none" and element > self.max_frame_mb * MIB:
            # every uncompressed update (or bmuf delta) is a whole element: each would be
            # refused as too large, and the run would never step
            raise ConfigError(
                f"max_frame_mb {self.max_frame_mb} cannot hold an update of network "
                f"{self.job.network.describe()} ({element} bytes): give --max-frame-mb at "
                f"least {mib_at_least(element)}"
            )
        # one setting per message, its name first: the command line says it as the flag,
        # the variable or the file's key the user gave (cli/settings.py)
        positive = ("stall_seconds", "checkpoint_seconds", "handshake_seconds",
                    "http_header_seconds")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name):g}")
        for name, least in (("join_seconds", 0), ("checkpoint_steps", 0), ("checkpoint_keep", 1),
                            ("max_connections", 1), ("max_handshakes", 1)):  # fmt: skip
            if getattr(self, name) < least:
                raise ConfigError(f"{name} must be >= {least}, got {getattr(self, name):g}")
        if self.http_connections < 1:
            raise ConfigError(f"http_connections must be at least 1, got {self.http_connections}")
        for name, total in (("max_handshakes_per_address", "max_handshakes"),
                            ("http_connections_per_address", "http_connections")):  # fmt: skip
            value, most = getattr(self, name), getattr(self, total)
            if not -1 <= value <= most:
                raise ConfigError(
                    f"{name} must be -1 (the default share), 0 (no bound per address) or "
                    f"at most {total} ({most}), got {value}"
                )
        if not 0.05 <= self.event_seconds <= 60:  # a floor: each push builds the document
            raise ConfigError("event_seconds must be between 0.05 and 60")
        if not self.resumed_linger_seconds >= 0:  # nan too
            raise ConfigError(f"resumed_linger_seconds must be >= 0, got "
                              f"{self.resumed_linger_seconds:g}")  # fmt: skip
        if not self.heartbeat_seconds >= HEARTBEAT_FLOOR:  # nan too
            raise ConfigError(f"heartbeat_seconds must be at least {HEARTBEAT_FLOOR:g}, "
                              f"got {self.heartbeat_seconds:g}")  # fmt: skip
        if self.worker_timeout_seconds <= self.heartbeat_seconds:
            every, got = self.heartbeat_seconds, self.worker_timeout_seconds
            raise ConfigError(
                f"worker_timeout_seconds must exceed heartbeat_seconds (a worker is sent a "
                f"heartbeat every {every:g} s), got {got:g}"
            )
        FaultSwitch.from_text(self.faults, Role.SERVER)  # refuses a bad rule with a clear error
        # here, not when the ports open: refused before anything starts, named by its flag
        if self.tls_client_ca and not (self.tls_cert or self.tls_key):
            raise ConfigError("tls_client_ca needs tls_cert and tls_key: the server's own")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: the server's certificate "
                              "and its key")  # fmt: skip

    def linger_after(self, finished_before: bool) -> float:
        """Seconds to serve the results once trained (< 0: until stopped). A server
        killed between its last checkpoint and telling its workers resumes a completed
        run: its workers, retrying, were never told and waited out their retry window
        (exit 3, restarted for ever by their units); so a run ``finished_before`` this
        server started is served ``resumed_linger_seconds`` at least, and a worker that
        comes back hears that training is complete (the demo's, whose workers are its
        own, not: 0)."""
        if self.linger_seconds < 0 or not finished_before:
            return self.linger_seconds
        return max(self.linger_seconds, self.resumed_linger_seconds)

    @property
    def http_bind_host(self) -> str:
        return self.http_host or self.host

    @property
    def handshakes_per_address(self) -> int:
        """The bound on one address's handshakes in progress (0: none). The default, half
        of ``max_handshakes`` (64), is what a machine legitimately opens at once: each of
        ``snet worker --processes N``'s processes connects as it starts, and is pending only
        for one round trip (the server's hello, its hello with the token proof), so a
        machine at one process per core up to 64 cores joins in one go; a larger one (up to
        256 processes, client/config.py MAX_PROCESSES, already over ``max_handshakes``)
        joins in a few waves, each turned-away process retrying as "busy" after 0.2, 0.4,
        0.8 s. Welcomed connections are not bounded per address: they have proved the
        token (or, without one, could train anyway), and one machine may hold 256 of them.
        Half leaves the other half of the slots to every other address."""
        return default_share(self.max_handshakes_per_address, self.max_handshakes, 2)

    @property
    def http_per_address(self) -> int:
        """The bound on one address's HTTP connections (0: none). The default, a quarter
        of ``http_connections`` (16), holds a browser's dashboard (6 connections per host),
        ``snet status --watch`` and a Prometheus scraper with room to spare."""
        return default_share(self.http_connections_per_address, self.http_connections, 4)


def default_share(value: int, total: int, parts: int) -> int:
    """``value`` as given, or for -1 the ``parts``-th share of ``total`` (at least 1)."""
    return max(1, total // parts) if value == -1 else value
