"""Failed TLS handshakes, counted and said in the server's log.

The event loop's TLS layer (asyncio's and uvloop's alike) drops a connection whose
handshake fails without a word outside its debug mode (``ssl.SSLError`` is an
``OSError``, which both log at debug level only): a worker refused for want of a client
certificate, or a browser speaking plain HTTP to the HTTPS port, left nothing in the
server's log, and the operator had only the refused side's word for what went wrong.

The loop runs each handshake in an ``ssl.SSLObject`` it makes with the context's
``wrap_bio``; ``SSLContext.sslobject_class`` (documented for exactly this) makes that an
object whose ``do_handshake`` tells ``TlsFailures`` of a failure before the loop drops the
connection. The peer's address is not known there (the loop keeps it in its transport),
so the log says the port, OpenSSL's reason and what usually causes it. A connection
closed before it began a handshake (a TCP health check, a port scan) is no failure and is
not said. Lines are logged at most once a second, with the number since the last such
line, as server/admission.py logs what it turns away: a peer retrying in a loop must not
become a flood of log lines.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from .log_throttle import LogThrottle

log = logging.getLogger("snet.server")

WORKER_PORT, HTTP_PORT = "worker port", "HTTP port"
# OpenSSL's reason -> what usually causes it, in the terms of snet's own settings
HINTS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "a worker without a certificate of its own: give "
    "it --tls-cert and --tls-key signed by this server's --tls-client-ca",
    "CERTIFICATE_VERIFY_FAILED": "a worker certificate this server's --tls-client-ca did "
    "not sign, or one out of date",
    "HTTP_REQUEST": "plain HTTP to a TLS port: use https://",
    "WRONG_VERSION_NUMBER": "a peer without TLS, or an old TLS version",
    "UNSUPPORTED_PROTOCOL": "a peer whose TLS is older than 1.2",
    "TLSV1_ALERT_UNKNOWN_CA": "the peer does not trust this server's certificate (its "
    "--tls-ca is another CA's)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer refused this server's certificate (a host name "
    "it does not name?)",
}


class TlsFailures:
    """Failed TLS handshakes on the server's two ports: counted for /status and
    /metrics, and logged (module docstring)."""

    def __init__(self) -> None:
        self.counts = {WORKER_PORT: 0, HTTP_PORT: 0}
        # by port and reason: a scanner's must not hide a worker's refused certificate
        self._throttle = LogThrottle()

    def watch(self, context: ssl.SSLContext, port: str) -> None:
        """Count and say the handshakes that fail in ``context`` (of ``port``: one of
        ``WORKER_PORT`` and ``HTTP_PORT``)."""
        failures = self

        class Watched(ssl.SSLObject):
            def do_handshake(self) -> None:
                try:
                    super().do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    raise  # the handshake waits for the peer's next bytes: no failure
                except ssl.SSLError as exc:
                    failures.failed(port, exc)
                    raise

        context.sslobject_class = Watched

    def failed(self, port: str, error: ssl.SSLError) -> None:
        """A handshake on ``port`` failed with ``error``."""
        self.counts[port] = self.counts.get(port, 0) + 1
        reason = str(error.reason or "")
        count = self._throttle.due((port, reason if reason in HINTS else ""))  # keys: few
        if not count:
            return
        said = getattr(error, "verify_message", None) or reason.lower().replace("_", " ")
        hint = HINTS.get(reason)
        more = f"; {count - 1} more since the last such line" if count > 1 else ""
        log.warning("TLS handshake failed on the %s: %s%s%s", port, said or error,
                    f" ({hint})" if hint else "", more)  # fmt: skip

    def figures(self) -> dict[str, Any]:
        """The counts /status and /metrics show."""
        return {
            "tls_handshakes_failed": self.counts[WORKER_PORT],
            "http_tls_handshakes_failed": self.counts[HTTP_PORT],
        }
