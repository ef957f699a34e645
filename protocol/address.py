"""``split_host_port``: a server's address as users give it, ``HOST:PORT``.

A worker's ``--server`` and ``snet status --url`` without a scheme both take it; an IPv6
host may come bracketed (``[::1]:7000``) or bare, as the server logs it (``::1:7000``):
the port is what follows the last colon.
"""

from __future__ import annotations


def split_host_port(text: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``; ``ValueError`` without a host or with a port that is
    not a whole number from 1 to 65535 (no server listens on port 0)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port from 1 to 65535")
    return host.strip("[]"), int(port)
