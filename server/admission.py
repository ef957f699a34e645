"""``Admission``: how many connections the worker port holds, and who is turned away.

Everything a peer can make the server allocate is bounded before the peer is trusted:

- at most ``max_connections`` connections on the worker port at once (welcomed workers
  and handshakes together); one more is told ``too_many_connections`` and closed;
- at most ``max_handshakes`` of them not yet welcomed (no hello with a valid token proof
  yet); one more is told ``too_many_handshakes`` and closed, so that a flood of idle
  connections cannot keep honest workers out for long: each lasts at most
  ``handshake_seconds`` (the server closes it with ``timeout``), TLS handshake included;
- at most ``handshakes_per_address`` of those from one address (transport/addresses.py), so that
  one host cannot take every handshake slot and turn real workers away; welcomed
  connections are not bounded per address (ServerConfig.handshakes_per_address says
  why); one more is told ``too_many_handshakes``, its text naming the address's bound;
- until welcomed, a connection's frames are small (protocol/channel.py), so a pending
  handshake holds at most a few kilobytes.

Both refusals are fatal ``error`` frames a worker takes as "busy, try again" (it retries
within its retry window, not for good). They and the timeouts are counted in /status and
/metrics, and logged at most once a second with the number since the last such line (a
flood must not become a flood of log lines); so are failed TLS handshakes on both ports
(transport/handshake_failures.py), which the event loop drops without a word.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from snet.protocol.framing import FrameLimits
from snet.protocol.messages import TOO_MANY_CONNECTIONS, TOO_MANY_HANDSHAKES
from snet.transport.handshake_failures import TlsFailures
from snet.transport.log_throttle import LogThrottle

if TYPE_CHECKING:
    from .config import ServerConfig

log = logging.getLogger("snet.server")

ENCODED_SLACK_BYTES = 1 << 20  # an encoded element's part descriptors and padding


def worker_frame_limits(max_frame_mb: int, element_bytes: int) -> FrameLimits:
    """The largest frame a welcomed worker may send: its largest message is an update,
    whose payload is the element (``element_bytes``) or an encoding of it, at most twice
    as large (``topk:1`` sends an index with every value; ``powersgd`` factors of a full
    rank are (m + n) x min(m, n) values), so a frame declaring more is refused on its
    prefix, before anything is allocated, however large ``max_frame_mb`` is."""
    largest = 2 * element_bytes + ENCODED_SLACK_BYTES
    return FrameLimits(max_payload_bytes=min(max_frame_mb * 1024 * 1024, largest))


class Admission:
    """The worker port's limits, and its server-wide counts of what it refused."""

    def __init__(
        self,
        max_connections: int = 256,
        max_handshakes: int = 128,
        handshake_seconds: float = 10.0,
        handshakes_per_address: int = 0,
    ) -> None:
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.handshakes_per_address = handshakes_per_address  # 0: no bound per address
        self.handshake_seconds = handshake_seconds
        self.frames_refused = 0  # connections closed for a frame that could not be read
        self.handshakes_refused = 0  # peers refused at the handshake
        self.connections = 0  # accepted in all
        self.connections_refused = 0  # over max_connections
        self.handshakes_turned_away = 0  # over max_handshakes
        self.handshakes_turned_away_per_address = 0  # over handshakes_per_address
        self.handshakes_timed_out = 0  # no hello within handshake_seconds
        self.tls = TlsFailures()  # failed TLS handshakes on both ports
        self._throttle = LogThrottle()

    @classmethod
    def of(cls, config: ServerConfig) -> Admission:
        """The limits ``config`` sets."""
        return cls(config.max_connections, config.max_handshakes, config.handshake_seconds,
                   config.handshakes_per_address)  # fmt: skip

    def refused_frame(self) -> None:
        """A connection was closed for a frame that could not be read."""
        self.frames_refused += 1

    def refused_handshake(self) -> None:
        """A peer was refused at the handshake (token, version, name, job)."""
        self.handshakes_refused += 1

    def refusal(
        self, open_connections: int, pending: int, address: str = "?", pending_here: int = 0
    ) -> tuple[str, str] | None:
        """(code, text) if a new connection from ``address`` must be turned away, with
        ``open_connections`` already open of which ``pending`` are not yet welcomed,
        ``pending_here`` of them from ``address``; None to admit it. Counts and logs the
        refusal."""
        if open_connections >= self.max_connections:
            self.connections_refused += 1
            found = (
                TOO_MANY_CONNECTIONS,
                (
                    f"the server holds {open_connections} connections, its limit "
                    f"(max_connections); try again later"
                ),
            )
        elif pending >= self.max_handshakes:
            self.handshakes_turned_away += 1
            found = (
                TOO_MANY_HANDSHAKES,
                (
                    f"{pending} handshakes are in progress, the server's limit "
                    f"(max_handshakes); try again later"
                ),
            )
        elif 0 < self.handshakes_per_address <= pending_here:
            self.handshakes_turned_away_per_address += 1
            found = (
                TOO_MANY_HANDSHAKES,
                (
                    f"{pending_here} handshakes from {address} are in progress, the server's "
                    f"limit per address (max_handshakes_per_address); try again later"
                ),
            )
        else:
            self.connections += 1
            return None
        self._log(*found)
        return found

    def timed_out(self, text: str) -> None:
        """A connection is closed for not completing its handshake in time."""
        self.handshakes_timed_out += 1
        self._log("timeout", text)

    def figures(self) -> dict[str, int]:
        """The counts /status and /metrics show."""
        return {
            "frames_refused": self.frames_refused,
            "handshakes_refused": self.handshakes_refused,
            "connections_refused": self.connections_refused,
            "handshakes_turned_away": self.handshakes_turned_away,
            "handshakes_turned_away_per_address": self.handshakes_turned_away_per_address,
            "handshakes_timed_out": self.handshakes_timed_out,
            **self.tls.figures(),
        }

    def _log(self, code: str, text: str) -> None:
        if count := self._throttle.due():
            log.warning("turned away or timed out %d connection(s) since the last such "
                        "line: %s: %s", count, code, text)  # fmt: skip
